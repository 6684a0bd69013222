"""Every command that takes session files says clearly what is wrong with a path, and exits."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from sessionfold.streams.cli import app

RUNNER = CliRunner()
HEADER = {"type": "session", "version": 3, "id": "s-in", "timestamp": "2025-01-01T00:00:00Z"}

#: Commands reading session files, and whether they take a directory tree.
COMMANDS = {"fold": True, "facts": True, "compare": True, "context": False, "ledger": False}
COMMANDS["demo"] = False
ALL = [*COMMANDS, "publish"]


def _invoke(command: str, path: Path) -> tuple[int, str]:
    args = [command, str(path)]
    if command == "publish":
        # An address nothing listens on: the check must come before any broker is asked.
        args += ["--bootstrap", "127.0.0.1:9", "--state-file", str(path.parent / "st.json")]
    result = RUNNER.invoke(app, args)
    return result.exit_code, result.stderr


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "good" / "s.jsonl"
    path.parent.mkdir()
    path.write_bytes(orjson.dumps(HEADER) + b"\n")
    return path


@pytest.mark.parametrize("command", ALL)
def test_missing_path_is_a_usage_error(tmp_path: Path, command: str) -> None:
    code, err = _invoke(command, tmp_path / "nope.jsonl")
    assert code == 2 and "no such file or directory" in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ALL)
def test_fifo_is_refused_by_kind(tmp_path: Path, command: str) -> None:
    """A FIFO would hang open() forever: it is refused at once, by name and kind."""
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    code, err = _invoke(command, fifo)
    assert code == 1
    assert f"{fifo} is a FIFO" in err and "no such file" not in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ALL)
def test_device_is_refused_by_kind(command: str) -> None:
    """/dev/zero would be one endless line: refused, never read."""
    code, err = _invoke(command, Path("/dev/zero"))
    assert code == 1 and "is a character device" in err


@pytest.mark.parametrize("command", [c for c, trees in COMMANDS.items() if not trees])
def test_directory_where_a_file_is_wanted(good: Path, command: str) -> None:
    """An existing directory is never called missing."""
    code, err = _invoke(command, good.parent)
    assert code == 1
    assert f"{good.parent} is a directory" in err and "no such file" not in err


@pytest.mark.parametrize("command", [c for c, trees in COMMANDS.items() if trees])
def test_directory_without_session_files(tmp_path: Path, command: str) -> None:
    (tmp_path / "empty").mkdir()
    code, err = _invoke(command, tmp_path / "empty")
    assert code == 1 and "no session files (*.jsonl) under" in err


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", "is empty"),
        (b"\n\n  \n", "is empty"),
        (bytes(range(256)) * 40, "holds no pi session"),
        (b'{"type": "message"}\n', "holds no pi session"),
    ],
)
def test_empty_or_binary_file(tmp_path: Path, command: str, content: bytes, says: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    code, err = _invoke(command, path)
    assert code == 1 and f"{path} {says}" in err


@pytest.mark.parametrize("command", [c for c, trees in COMMANDS.items() if trees])
def test_tree_skips_a_bad_file_and_reads_the_rest(good: Path, command: str) -> None:
    """In a tree, an empty file is skipped with a note; the good files are still read."""
    (good.parent / "empty.jsonl").write_bytes(b"")
    result = RUNNER.invoke(app, [command, str(good.parent), "--json"])
    assert result.exit_code == 0, result.output
    assert "skipped:" in result.stderr and "empty.jsonl is empty" in result.stderr
    assert "s-in" in result.stdout


def test_bad_line_cap_is_a_usage_error(good: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SESSIONFOLD_MAX_LINE_BYTES", "many")
    code, err = _invoke("fold", good)
    assert code == 2 and "SESSIONFOLD_MAX_LINE_BYTES" in err
