"""The replayer without a broker: stop points against folding the same lines, and memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sessionfold.events.envelope import PlaceholderEnvelope
from sessionfold.streams.publishing.session_file import DeadLetter
from sessionfold.streams.runtime.embedded import fold_files
from sessionfold.streams.tools.replay import (
    Point,
    Replayer,
    ReplayError,
    file_envelopes,
    replay_files,
)
from sessionfold.streams.tools.synthetic import generate_session, write_session


@pytest.fixture(scope="module")
def session_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated session of 50 assistant messages."""
    return write_session(tmp_path_factory.mktemp("replay"), generate_session(21, 50)).path


def _head(source: Path, target: Path, lines: int) -> Path:
    target.write_bytes(b"".join(source.read_bytes().splitlines(keepends=True)[:lines]))
    return target


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True)


def _assistant_line(path: Path, turn: int) -> int:
    seen = -1
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        entry = json.loads(line)
        if entry.get("type") == "message" and entry["message"]["role"] == "assistant":
            seen += 1
            if seen == turn:
                return number
    raise AssertionError(turn)


def test_end_equals_fold_files(session_file: Path) -> None:
    """Replayed to the end, the state is `fold`'s."""
    replayer = replay_files([session_file])
    assert _canonical(replayer.result()) == _canonical(fold_files([session_file]))


@pytest.mark.parametrize("turn", [0, 17, 49])
def test_turn_is_zero_based_and_inclusive(session_file: Path, tmp_path: Path, turn: int) -> None:
    """--turn N = every line up to and including the N-th assistant message (from 0)."""
    replayer = replay_files([session_file], point=Point("turn", turn))
    cut = _head(session_file, tmp_path / session_file.name, _assistant_line(session_file, turn))
    assert _canonical(replayer.result()) == _canonical(fold_files([cut]))


def test_until_seq(session_file: Path, tmp_path: Path) -> None:
    """--until-seq N = the first N lines (the header is seq 1)."""
    replayer = replay_files([session_file], point=Point("seq", 40))
    cut = _head(session_file, tmp_path / session_file.name, 40)
    assert _canonical(replayer.result()) == _canonical(fold_files([cut]))


def test_memory_is_the_state_alone(session_file: Path) -> None:
    """The streaming runtime counts envelopes on every topic but keeps none of them."""
    runtime = replay_files([session_file]).runtime
    assert all(len(log) == 0 for log in runtime.log.values())
    assert runtime.log["session-events"].appended > 0  # type: ignore[attr-defined]
    assert runtime.log["flush-metrics"].appended > 0  # type: ignore[attr-defined]
    assert len(runtime.folded) == 0


def test_missing_session_and_unreached_points(session_file: Path) -> None:
    """A named session that is not there, or a point past the end, raises ReplayError."""
    with pytest.raises(ReplayError, match="session not found: nope"):
        replay_files([session_file], sessions=["nope"])
    with pytest.raises(ReplayError, match="turn 50 is past the end"):
        replay_files([session_file], point=Point("turn", 50))
    with pytest.raises(ReplayError, match="0 compaction boundaries"):
        replay_files([session_file], point=Point("span", 1))


@pytest.mark.parametrize(("span", "line"), [(1, 360), (2, 629)])
def test_span_boundaries_of_the_real_session(
    shared_sessions: Path, tmp_path: Path, span: int, line: int
) -> None:
    """before-compaction.jsonl has pi compactions on lines 360 and 629: --span 1 and 2."""
    source = shared_sessions / "before-compaction.jsonl"
    replayer = replay_files([source], point=Point("span", span))
    cut = _head(source, tmp_path / source.name, line)
    assert _canonical(replayer.result()) == _canonical(fold_files([cut]))


def _damaged(source: Path, target: Path, line: int) -> Path:
    """`source` with line `line` (1-based) cut short: a dead letter and its placeholder."""
    lines = source.read_bytes().splitlines(keepends=True)
    lines[line - 1] = lines[line - 1][:20] + b"\n"
    target.write_bytes(b"".join(lines))
    return target


def _topic_order(paths: list[Path], point: Point) -> dict[str, object]:
    """A replay fed as `replay_topic` is: every envelope first, the dead letters after."""
    records = list(file_envelopes(paths))
    replayer = Replayer(point=point)
    for record in records:
        if not isinstance(record, DeadLetter):
            replayer.feed(record)
    for record in records:
        if isinstance(record, DeadLetter):
            replayer.note_dead_letter(record.session_id, record.line)
    return replayer.result()


@pytest.mark.parametrize("before", [1, 0])
def test_seq_point_at_a_dead_line_counts_its_letter_by_line(
    session_file: Path, tmp_path: Path, before: int
) -> None:
    """--until-seq at a dead line's placeholder counts its dead letter, one before does not:
    the fold of the lines up to there, whichever order letters and envelopes come in."""
    line = 30
    damaged = _damaged(session_file, tmp_path / "damaged.jsonl", line)
    place = next(r for r in file_envelopes([damaged]) if isinstance(r, PlaceholderEnvelope))
    point = Point("seq", place.seq - before)
    expected = fold_files([_head(damaged, tmp_path / "head.jsonl", line - before)])
    assert next(iter(expected["sessions"].values()))["dead_letters"] == 1 - before
    assert _canonical(replay_files([damaged], point=point).result()) == _canonical(expected)
    assert _canonical(_topic_order([damaged], point)) == _canonical(expected)
