"""`sessionfold replay` and `sessionfold context` on the real broker: the state at the end, at a
turn in the middle and at a span boundary equals folding the same lines from the files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.views.context import context_at
from sessionfold.streams.cli import app
from sessionfold.streams.runtime.embedded import fold_files
from sessionfold.streams.tools.replay import Collector, Point, replay_files
from sessionfold.streams.tools.synthetic import generate_session, write_session

pytestmark = pytest.mark.kafka

BEFORE = "before-compaction.jsonl"
LARGE = "large-session.jsonl"
BEFORE_ID = "ffae836b-9420-4060-ac13-7745215f90ff"
LARGE_ID = "d703a1a9-1b7b-4fb1-b512-c9738b1fe617"
MIDDLE_TURN = 242


@pytest.fixture(scope="module")
def published(
    kafka_bootstrap: str, shared_sessions: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    """Both real sessions and a generated one, published once to a fresh topic prefix."""
    from conftest import unique_topic_prefix

    root = tmp_path_factory.mktemp("replay")
    for name in (BEFORE, LARGE):
        shutil.copy(shared_sessions / name, root / name)
    write_session(root, generate_session(5, 60))
    prefix = unique_topic_prefix()
    args = ["publish", str(root), "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]
    args += ["--partitions", "3", "--state-file", str(root.parent / f"{prefix}state.json")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return prefix, root


def _replay(bootstrap: str, prefix: str, *extra: str) -> Any:
    args = ["replay", "--bootstrap", bootstrap, "--topic-prefix", prefix, "--json", *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return orjson.loads(result.stdout)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _truncated(source: Path, target: Path, last_line: int) -> Path:
    """The first `last_line` lines of `source` (the header is line 1)."""
    lines = source.read_bytes().splitlines(keepends=True)
    target.write_bytes(b"".join(lines[:last_line]))
    return target


def _line_of_turn(path: Path, turn: int) -> int:
    """The file line of the `turn`-th assistant message (0-based); these files are linear."""
    count = 0
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        entry = json.loads(line)
        if entry.get("type") == "message" and entry["message"].get("role") == "assistant":
            if count == turn:
                return number
            count += 1
    raise AssertionError(f"no turn {turn}")


def _line_of_compaction(path: Path, span: int) -> int:
    seen = 0
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if json.loads(line).get("type") == "compaction":
            seen += 1
            if seen == span:
                return number
    raise AssertionError(f"no compaction {span}")


def test_replay_to_the_end_equals_fold_files(
    kafka_bootstrap: str, published: tuple[str, Path]
) -> None:
    """Every session replayed from the topic has exactly the state `fold` gives on the files."""
    prefix, root = published
    replayed = _replay(kafka_bootstrap, prefix)
    expected = fold_files(sorted(root.glob("*.jsonl")))
    assert len(replayed["sessions"]) == 3
    assert _canonical(replayed) == _canonical(expected)


def test_replay_to_a_middle_turn(
    kafka_bootstrap: str, published: tuple[str, Path], tmp_path: Path
) -> None:
    """--turn N stops after the N-th assistant message (0-based): the fold of those lines."""
    prefix, root = published
    replayed = _replay(kafka_bootstrap, prefix, "--session", BEFORE_ID, "--turn", str(MIDDLE_TURN))
    source = root / BEFORE
    cut = _truncated(source, tmp_path / BEFORE, _line_of_turn(source, MIDDLE_TURN))
    expected = fold_files([cut])
    assert list(replayed["sessions"]) == [BEFORE_ID]
    assert _canonical(replayed) == _canonical(expected)
    counts = replayed["sessions"][BEFORE_ID]["counts"]["messages"]
    assert counts["assistant"] == MIDDLE_TURN + 1


@pytest.mark.parametrize("span", [1, 2])
def test_replay_to_a_span_boundary(
    kafka_bootstrap: str, published: tuple[str, Path], tmp_path: Path, span: int
) -> None:
    """--span N stops at the N-th pi compaction (before-compaction.jsonl has two)."""
    prefix, root = published
    replayed = _replay(kafka_bootstrap, prefix, "--session", BEFORE_ID, "--span", str(span))
    source = root / BEFORE
    cut = _truncated(source, tmp_path / BEFORE, _line_of_compaction(source, span))
    assert _canonical(replayed) == _canonical(fold_files([cut]))


def test_replay_until_seq_and_two_sessions(
    kafka_bootstrap: str, published: tuple[str, Path], tmp_path: Path
) -> None:
    """--until-seq applies to each named session; sessions in different partitions both come."""
    prefix, root = published
    replayed = _replay(
        kafka_bootstrap, prefix, "--session", BEFORE_ID, "--session", LARGE_ID, "--until-seq", "300"
    )
    # The header is seq 1, so seq N is line N for these files (they have no dead letters).
    expected = fold_files(
        [
            _truncated(root / BEFORE, tmp_path / BEFORE, 300),
            _truncated(root / LARGE, tmp_path / LARGE, 300),
        ]
    )
    assert _canonical(replayed) == _canonical(expected)


def test_unknown_session_and_unreached_point_exit_1(
    kafka_bootstrap: str, published: tuple[str, Path]
) -> None:
    """A session not on the topic, or a turn past the end, is a clear error with exit code 1."""
    prefix, _root = published
    base = ["replay", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]
    missing = CliRunner().invoke(app, [*base, "--session", "no-such-session"])
    assert missing.exit_code == 1
    assert "session not found: no-such-session" in missing.output
    past = CliRunner().invoke(app, [*base, "--session", LARGE_ID, "--turn", "5000"])
    assert past.exit_code == 1
    assert "turn 5000 is past the end" in past.output
    both = CliRunner().invoke(app, [*base, "--turn", "1", "--span", "1"])
    assert both.exit_code == 2


def test_context_from_the_topic_equals_context_from_the_file(
    kafka_bootstrap: str, published: tuple[str, Path]
) -> None:
    """`context --session --bootstrap` renders exactly what `context FILE` renders."""
    prefix, root = published
    from_topic = CliRunner().invoke(
        app,
        [
            "context",
            "--session",
            LARGE_ID,
            "--bootstrap",
            kafka_bootstrap,
            "--topic-prefix",
            prefix,
            "--turn",
            "200",
            "--format",
            "json",
        ],
    )
    assert from_topic.exit_code == 0, from_topic.output
    from_file = CliRunner().invoke(
        app, ["context", str(root / LARGE), "--turn", "200", "--format", "json"]
    )
    assert from_file.exit_code == 0, from_file.output
    assert from_topic.stdout == from_file.stdout
    view = orjson.loads(from_file.stdout)
    assert view["tokens"]["pruned"] < view["tokens"]["unpruned"]
    collector = Collector(LARGE_ID)
    replayer = replay_files(
        [root / LARGE], DEFAULT_CONFIG, [LARGE_ID], Point("turn", 200), collector
    )
    direct = context_at(collector.entries, replayer.runtime.store, LARGE_ID, DEFAULT_CONFIG)
    assert orjson.loads(from_file.stdout) == orjson.loads(orjson.dumps(direct.to_json()))
