"""The commands on other agents' files: `generate --format codex|claude-code` writes them in their
agent's layout, and `fold`, `context`, `compare`, `ledger`, `facts` and `demo FILE` read them
(detected, or forced by `--format`/`--input-format`) and answer sanely.

What each answer is checked against comes from the source lines (session ids, call ids), never
from the reader.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from sessionfold.streams.cli import app
from sessionfold.streams.publishing.session_file import DeadLetter, header_of, read_session_file

RUNNER = CliRunner()
ROLLOUT = re.compile(r"rollout-(\d{4})-(\d\d)-(\d\d)T\d\d-\d\d-\d\d-([0-9a-f-]{36})\.jsonl")


def _generate(out: Path, file_format: str, *options: str) -> str:
    result = RUNNER.invoke(app, ["generate", "--format", file_format, *options, str(out)])
    assert result.exit_code == 0, result.output
    return result.stdout


def _source(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _session_id(lines: list[dict[str, Any]]) -> str:
    """The session id the source's first line names (Codex's session_meta, Claude Code's)."""
    first = lines[0]
    return str(
        first["payload"]["id"] if first.get("type") == "session_meta" else first["sessionId"]
    )


def _call_ids(lines: list[dict[str, Any]]) -> set[str]:
    """The ids of the tool calls the source's lines make, as each format writes them."""
    ids = set()
    for line in lines:
        payload = line.get("payload") or {}
        if payload.get("type") in ("function_call", "custom_tool_call"):
            ids.add(payload["call_id"])
        message = line.get("message")
        if line.get("type") == "assistant" and isinstance(message, dict):
            ids |= {b["id"] for b in message["content"] if b.get("type") == "tool_use"}
    return ids


def _results(lines: list[dict[str, Any]]) -> int:
    """How many tool results the source's lines hold, as each format writes them."""
    count = 0
    for line in lines:
        payload = line.get("payload") or {}
        count += payload.get("type") in ("function_call_output", "custom_tool_call_output")
        message = line.get("message")
        if line.get("type") == "user" and isinstance(message, dict):
            content = message["content"] if isinstance(message["content"], list) else []
            count += sum(b.get("type") == "tool_result" for b in content)
    return count


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One generated main file per format, written by the command."""
    out = tmp_path_factory.mktemp("formats")
    _generate(out / "codex", "codex", "--turns", "8", "--seed", "4")
    _generate(out / "claude", "claude-code", "--turns", "8", "--seed", "4")
    (codex,) = (out / "codex").rglob("rollout-*.jsonl")
    (claude,) = (out / "claude").glob("*/*.jsonl")
    return {"codex": codex, "claude-code": claude}


def test_generate_codex_writes_rollouts_in_codexs_layout(tmp_path: Path) -> None:
    """OUT/YYYY/MM/DD/rollout-<start>-<id>.jsonl dated by each rollout's start, read as Codex
    with no dead letter; the totals line counts them; the same seed writes the same bytes."""
    stdout = _generate(tmp_path / "a", "codex", "--sessions", "3", "--turns", "5", "--seed", "9")
    found = sorted((tmp_path / "a").rglob("*.jsonl"))
    assert len(found) == 3
    for path in found:
        match = ROLLOUT.fullmatch(path.name)
        assert match, path.name
        meta = _source(path)[0]
        assert meta["type"] == "session_meta" and meta["payload"]["id"] == match[4]
        assert path.parent.relative_to(tmp_path / "a").parts == match.group(1, 2, 3)
        assert meta["payload"]["timestamp"].startswith("-".join(match.group(1, 2, 3)))
        header = header_of(path)
        assert header is not None and header["format"] == "codex" and header["id"] == match[4]
        assert not [r for r in read_session_file(path) if isinstance(r, DeadLetter)]
    entries = sum(len(_source(p)) - 1 for p in found)
    size = sum(p.stat().st_size for p in found)
    assert stdout.strip().splitlines()[-1] == (
        f"wrote 3 sessions ({entries} entries, {size} bytes) to {tmp_path / 'a'}"
    )
    _generate(tmp_path / "b", "codex", "--sessions", "3", "--turns", "5", "--seed", "9")
    again = sorted((tmp_path / "b").rglob("*.jsonl"))
    assert [p.relative_to(tmp_path / "b") for p in again] == [
        p.relative_to(tmp_path / "a") for p in found
    ]
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in found]


def test_generate_refuses_an_unknown_format(tmp_path: Path) -> None:
    result = RUNNER.invoke(app, ["generate", "--format", "aider", str(tmp_path / "x")])
    assert result.exit_code == 2 and "codex" in result.output
    assert not (tmp_path / "x").exists()


FORMATS = ["codex", "claude-code"]


@pytest.mark.parametrize("file_format", FORMATS)
@pytest.mark.parametrize("forced", [False, True])
def test_fold(files: dict[str, Path], file_format: str, forced: bool) -> None:
    """`fold --json`: the source's session, its tool results folded, no dead letter."""
    path = files[file_format]
    extra = ["--format", file_format] if forced else []
    result = RUNNER.invoke(app, ["fold", str(path), "--json", *extra])
    assert result.exit_code == 0, result.output
    sessions = orjson.loads(result.stdout)["sessions"]
    state = sessions[_session_id(_source(path))]
    assert state["dead_letters"] == 0
    assert state["counts"]["messages"]["toolResult"] == _results(_source(path))
    assert state["flush_attempts"], "the folds ran: flushes were attempted"


@pytest.mark.parametrize("file_format", FORMATS)
def test_context(files: dict[str, Path], file_format: str) -> None:
    """`context FILE --format json`: messages, and pruning that does not grow the context;
    `--input-format` forces the file's format beside the output's `--format`."""
    path = files[file_format]
    for extra in ([], ["--input-format", file_format]):
        result = RUNNER.invoke(app, ["context", str(path), "--format", "json", *extra])
        assert result.exit_code == 0, result.output
        view = orjson.loads(result.stdout)
        assert view["messages"]
        assert 0 < view["tokens"]["pruned"] <= view["tokens"]["unpruned"]
    text = RUNNER.invoke(app, ["context", str(path)])
    assert text.exit_code == 0 and "tokens the model sees:" in text.stdout


@pytest.mark.parametrize("file_format", FORMATS)
def test_compare(files: dict[str, Path], file_format: str) -> None:
    """`compare --json`: tokens per turn under A and unpruned, A never above unpruned."""
    path = files[file_format]
    result = RUNNER.invoke(app, ["compare", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.stdout)
    session_id = _session_id(_source(path))
    a = data["a"]["sessions"][session_id]
    unpruned = data["unpruned"]["sessions"][session_id]
    assert a["tokens_per_turn"] and len(a["tokens_per_turn"]) == len(unpruned["tokens_per_turn"])
    assert a["summary"]["final"] <= unpruned["summary"]["final"]


@pytest.mark.parametrize("file_format", FORMATS)
def test_ledger(files: dict[str, Path], file_format: str) -> None:
    """`ledger --json`: the shell commands, each one a call the source makes."""
    path = files[file_format]
    result = RUNNER.invoke(app, ["ledger", str(path), "--json"])
    assert result.exit_code == 0, result.output
    ledger = orjson.loads(result.stdout)
    assert ledger["commands"]
    assert {c["call"] for c in ledger["commands"]} <= _call_ids(_source(path))
    human = RUNNER.invoke(app, ["ledger", str(path)])
    assert human.exit_code == 0 and human.stdout.strip()


@pytest.mark.parametrize("file_format", FORMATS)
def test_facts(files: dict[str, Path], file_format: str) -> None:
    """`facts --json`: the source's session and its file."""
    path = files[file_format]
    result = RUNNER.invoke(app, ["facts", str(path), "--json"])
    assert result.exit_code == 0, result.output
    (session,) = orjson.loads(result.stdout)["sessions"]
    assert session["session"] == _session_id(_source(path))
    assert session["file"] == str(path)


@pytest.mark.parametrize("file_format", FORMATS)
def test_demo(files: dict[str, Path], file_format: str) -> None:
    """`demo FILE`: the session's report, flush attempts and the pruning result."""
    path = files[file_format]
    result = RUNNER.invoke(app, ["demo", str(path)])
    assert result.exit_code == 0, result.output
    assert _session_id(_source(path)) in result.stdout
    assert "flush attempts:" in result.stdout and "after pruning" in result.stdout
