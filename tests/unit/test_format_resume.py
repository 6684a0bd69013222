"""Resuming a read of another agent's file anywhere: a new reader from a saved position reads on
exactly as one reader of the whole file (both translated formats, any stop, any number of stops).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from format_sessions import TRANSLATED, tail_in_pieces, wire, write_format_session
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaProducer
from kafka.future import Future

from sessionfold.events.envelope import EntryEnvelope, PlaceholderEnvelope
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.publisher import Checkpoints, Publisher
from sessionfold.streams.publishing.session_file import (
    DeadLetter,
    SessionFileReader,
    read_session_file,
)

SETTINGS = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SETTINGS
@given(
    file_format=st.sampled_from(TRANSLATED),
    seed=st.integers(0, 2**32),
    turns=st.integers(1, 8),
    cuts=st.lists(st.floats(0, 1), min_size=1, max_size=5),
)
def test_a_tail_stopped_anywhere_resumes_as_one_read(
    tmp_path_factory: pytest.TempPathFactory,
    file_format: str,
    seed: int,
    turns: int,
    cuts: list[float],
) -> None:
    """Stopped at any byte (inside a held group, in the middle of a line), its position saved
    through JSON, resumed by a new reader each time: the records of one read, byte for byte."""
    folder = tmp_path_factory.mktemp(file_format)
    path = write_format_session(folder, file_format, seed, turns)
    data = path.read_bytes()
    whole = list(read_session_file(path))
    assert not [r for r in whole if isinstance(r, DeadLetter)]
    pieces = tail_in_pieces(folder / "tail.jsonl", data, [int(c * len(data)) for c in cuts])
    assert wire(pieces) == wire(whole)


@pytest.mark.parametrize("file_format", TRANSLATED)
def test_every_line_boundary_resumes_as_one_read(tmp_path: Path, file_format: str) -> None:
    """A tail stopped after every single line in turn (each stop a new reader) reads the whole
    file's records: every state a translator holds between lines is rebuilt on resume."""
    path = write_format_session(tmp_path, file_format, seed=11, turns=4)
    data = path.read_bytes()
    ends = [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]
    pieces = tail_in_pieces(tmp_path / "tail.jsonl", data, ends)
    whole = list(read_session_file(path))
    assert wire(pieces) == wire(whole)
    seqs = [r.seq for r in pieces if isinstance(r, EntryEnvelope | PlaceholderEnvelope)]
    assert seqs == list(range(1, len(seqs) + 1))


@pytest.mark.parametrize("file_format", TRANSLATED)
def test_a_reader_resumed_after_a_final_read_does_not_repeat_the_closed_group(
    tmp_path: Path, file_format: str
) -> None:
    """A final read closes the group open at the end; a reader resumed at its end (the file
    grown since) sends none of that group again: no entry twice, no duplicate id."""
    path = write_format_session(tmp_path, file_format, seed=5, turns=3)
    data = path.read_bytes()
    lines = data.split(b"\n")
    half = b"\n".join(lines[: len(lines) // 2]) + b"\n"
    path.write_bytes(half)
    first = SessionFileReader(path)
    records = list(first.records(final=True))
    path.write_bytes(data)
    more = list(SessionFileReader(path, first.position).records(final=True))
    assert not [r for r in more if isinstance(r, DeadLetter)]
    ids = [
        r.payload.entry.get("id")
        for r in records + more
        if isinstance(r, EntryEnvelope) and r.payload.entry["type"] != "session"
    ]
    assert len(ids) == len(set(ids))
    seqs = [r.seq for r in records + more if isinstance(r, EntryEnvelope | PlaceholderEnvelope)]
    assert seqs == list(range(1, len(seqs) + 1))


class _Producer:
    """Records what a KafkaProducer would send, each record acknowledged at once."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def send(self, topic: str, key: bytes, value: bytes) -> Future:
        self.sent.append((topic, value))
        return Future().success(None)

    def flush(self) -> None:
        """Nothing is in flight."""


@pytest.mark.parametrize("file_format", TRANSLATED)
def test_publish_polls_and_restarts_send_what_one_read_holds(
    tmp_path: Path, file_format: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`publish --follow`'s polls of a growing file (one publisher), and runs restarted from its
    checkpoint file (a new publisher): the session events of one read of the whole file, and a
    poll reads on with the reader it stopped with instead of reading the file back."""
    source = write_format_session(tmp_path / "src", file_format, seed=3, turns=4)
    data = source.read_bytes()
    path = tmp_path / "live.jsonl"
    producer = _Producer()
    topics = Topics("t.")
    state = tmp_path / "state.json"
    catch_ups: list[int] = []
    original = SessionFileReader._catch_up

    def counted(reader: SessionFileReader, offset: int) -> None:
        if offset:  # the lines before `offset` read back
            catch_ups.append(offset)
        original(reader, offset)

    monkeypatch.setattr(SessionFileReader, "_catch_up", counted)
    publisher = None
    cuts = sorted({int(len(data) * k / 23) for k in range(1, 23)})
    for number, cut in enumerate(cuts):
        path.write_bytes(data[:cut])
        if publisher is None or number % 7 == 6:  # a restart: a new run from the checkpoints
            publisher = Publisher(cast(KafkaProducer, producer), topics, Checkpoints.load(state),
                                  world=False)  # fmt: skip
        publisher.publish_file(path, final=False)
        publisher.drain()  # a pass of publish_paths ends so: acknowledged, checkpointed
    path.write_bytes(data)
    assert publisher is not None
    publisher.publish_file(path, final=True)
    publisher.drain()
    sent = [value for topic, value in producer.sent if topic == topics.session_events]
    assert sent == wire(read_session_file(source))
    # The file read back only where a new publisher resumed it, not at every poll.
    assert 0 < len(catch_ups) <= 3
