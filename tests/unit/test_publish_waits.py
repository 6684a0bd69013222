"""The publisher's waits: deadlines, stops, and a checkpoint that holds only acknowledged lines.

A producer whose broker stops answering after some records is simulated by futures that never
complete; the waits, the checkpoint and the exceptions are the real ones.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import cast

import orjson
import pytest
from kafka import KafkaProducer, TopicPartition
from kafka.errors import NotLeaderForPartitionError
from kafka.producer.future import FutureProduceResult, FutureRecordMetadata

from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing import publisher as publish
from sessionfold.streams.publishing.publisher import (
    Checkpoints,
    Publisher,
    PublishFailed,
    PublishStopped,
    TopicLog,
    publish_paths,
)

TOPICS = Topics("t.")


class StallingProducer:
    """Acknowledges the first `answered` records at once; the rest never get an answer.

    Its futures are kafka-python's own, answered the way its sender answers them.
    """

    def __init__(self, answered: int, stop_after: int | None = None) -> None:
        self.answered = answered
        self.stop_after = stop_after
        self.sent: list[bytes] = []
        self.open: list[FutureProduceResult] = []

    def send(self, topic: str, key: bytes, value: bytes) -> FutureRecordMetadata:
        """Queue one record; answer it only while the broker is still there."""
        result = FutureProduceResult(TopicPartition(topic, 0))
        future = FutureRecordMetadata(result, 0, -1, None, len(key), len(value), -1)
        if len(self.sent) < self.answered:
            result.success((len(self.sent), -1, None))
        else:
            self.open.append(result)
        self.sent.append(value)
        return future

    def stop_asked(self) -> bool:
        """A stop (a signal) arrives once `stop_after` records were sent."""
        return self.stop_after is not None and len(self.sent) >= self.stop_after


def _session(tmp_path: Path, lines: int, sid: str = "s1") -> Path:
    """A session file `{sid}.jsonl`: a header and `lines - 1` messages, one record per line."""
    rows = [{"type": "session", "version": 3, "id": sid, "timestamp": "2026-01-01T00:00:00Z"}]
    for i in range(1, lines):
        rows.append(
            {
                "type": "message",
                "id": f"m{i}",
                "parentId": f"m{i - 1}" if i > 1 else None,
                "timestamp": "2026-01-01T00:00:01Z",
                "message": {"role": "user", "content": [{"type": "text", "text": "x"}]},
            }
        )
    path = tmp_path / f"{sid}.jsonl"
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def _publisher(producer: StallingProducer, state: Path, **options: object) -> Publisher:
    publisher = Publisher(
        cast(KafkaProducer, producer),
        TOPICS,
        Checkpoints.load(state),
        world=False,
        should_stop=producer.stop_asked,
        **options,  # type: ignore[arg-type]
    )
    return publisher


def _checkpointed_line(state: Path, path: Path) -> int:
    return Checkpoints.load(state).positions[str(path.resolve())].line


def test_a_broker_that_stops_answering_ends_publish_at_the_deadline(tmp_path: Path) -> None:
    """No answer within the timeout: PublishFailed, and the checkpoint is the acked lines."""
    path = _session(tmp_path, 30)
    producer = StallingProducer(answered=10)
    publisher = _publisher(producer, tmp_path / "state.json", timeout_s=0.5)
    with pytest.raises(PublishFailed) as failed:
        publish_paths(publisher, [path])
    assert failed.value.code == "timeout"
    assert publisher.counts.published == 10
    assert _checkpointed_line(tmp_path / "state.json", path) == 10


def test_a_failed_record_stops_the_checkpoint_before_it(tmp_path: Path) -> None:
    """A record the broker refuses: PublishFailed naming the error, checkpoint before it."""
    path = _session(tmp_path, 12)
    producer = StallingProducer(answered=5)
    publisher = _publisher(producer, tmp_path / "state.json", timeout_s=30)
    original = producer.send

    def send(topic: str, key: bytes, value: bytes) -> FutureRecordMetadata:
        future = original(topic, key, value)
        if len(producer.sent) == 6:
            producer.open.pop().failure(NotLeaderForPartitionError())
        return future

    producer.send = send  # type: ignore[method-assign]
    with pytest.raises(PublishFailed) as failed:
        publish_paths(publisher, [path])
    assert failed.value.code == "NotLeaderForPartitionError"
    assert _checkpointed_line(tmp_path / "state.json", path) == 5


def test_a_stop_during_an_outage_gives_up_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked to stop while records wait for answers: reading stops, the grace ends the wait."""
    monkeypatch.setattr(publish, "STOP_GRACE_S", 0.3)
    path = _session(tmp_path, 40)
    producer = StallingProducer(answered=8, stop_after=12)
    publisher = _publisher(producer, tmp_path / "state.json", timeout_s=600)
    with pytest.raises(PublishStopped) as stopped:
        publish_paths(publisher, [path])
    assert not stopped.value.settled
    assert len(producer.sent) == 12  # nothing read after the stop
    assert _checkpointed_line(tmp_path / "state.json", path) == 8


def test_a_stop_keeps_what_was_answered_and_a_rerun_sends_the_rest_once(
    tmp_path: Path,
) -> None:
    """Stopped with every record answered: checkpoint at the last line read; a re-run resumes."""
    path = _session(tmp_path, 40)
    state = tmp_path / "state.json"
    producer = StallingProducer(answered=10**9, stop_after=15)
    with pytest.raises(PublishStopped) as stopped:
        publish_paths(_publisher(producer, state), [path])
    assert stopped.value.settled
    assert _checkpointed_line(state, path) == 15
    again = StallingProducer(answered=10**9)
    publish_paths(_publisher(again, state), [path])
    seqs = [orjson.loads(v)["seq"] for v in producer.sent + again.sent]
    assert seqs == list(range(1, 41))


def test_follow_ends_normally_on_a_stop_once_everything_is_answered(tmp_path: Path) -> None:
    """With follow, a stop is the way out: no exception once every record is answered."""
    path = _session(tmp_path, 20)
    producer = StallingProducer(answered=10**9, stop_after=20)
    publisher = _publisher(producer, tmp_path / "state.json")
    counts = publish_paths(publisher, [path], follow=True, poll_seconds=0.05)
    assert counts.published == 20
    assert _checkpointed_line(tmp_path / "state.json", path) == 20


def test_reading_waits_when_too_many_records_are_unanswered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the window, reading waits for answers instead of queueing the whole file."""
    monkeypatch.setattr(publish, "WINDOW_LINES", 10)
    path = _session(tmp_path, 100)
    producer = StallingProducer(answered=3)
    publisher = _publisher(producer, tmp_path / "state.json", timeout_s=0.3)
    with pytest.raises(PublishFailed):
        publish_paths(publisher, [path])
    assert len(producer.sent) == 3 + 11  # the answered ones, then one window's worth


class EmptyTopics:
    """A TopicLog over topics that hold nothing yet: every end offset is 0."""

    def end_offsets(self, topic: str, tick: Callable[[], None]) -> dict[int, int]:
        """Partition 0, empty."""
        tick()
        return {0: 0}

    def last(self, *_args: object) -> int | None:
        """Nothing is on the topics, so nothing of an unsure file was found."""
        return None


def test_files_go_out_one_after_another_without_waiting_for_answers(tmp_path: Path) -> None:
    """Publishing does not wait for a file's answers before sending the next file's records;
    the checkpoint still holds only answered lines, and every file with a record out is unsure
    until all of it is answered."""
    paths = [_session(tmp_path, 10, sid) for sid in ("s1", "s2", "s3")]
    state = tmp_path / "state.json"
    producer = StallingProducer(answered=10 + 4)  # the first file and 4 lines of the second
    publisher = _publisher(producer, state, timeout_s=0.5, topic_log=cast(TopicLog, EmptyTopics()))
    with pytest.raises(PublishFailed):
        publish_paths(publisher, paths)
    assert len(producer.sent) == 30  # every file's records were out before the deadline
    checkpoints = Checkpoints.load(state)
    names = [str(path.resolve()) for path in paths]
    assert {name: p.line for name, p in checkpoints.positions.items()} == {
        names[0]: 10,
        names[1]: 4,
    }
    assert set(checkpoints.unsure) == set(names[1:])
    assert publisher.resumes_at() == names[1]
    assert publisher.stats.drains == 1  # once at the end, not once per file


class LateProducer(StallingProducer):
    """Answers every record, but only once `answer` is called (as a sender thread would)."""

    def __init__(self) -> None:
        super().__init__(answered=0)

    def answer(self) -> None:
        """Acknowledge everything sent so far."""
        while self.open:
            self.open.pop(0).success((0, -1, None))


def test_a_file_given_twice_is_sent_once(tmp_path: Path) -> None:
    """The second visit of a file in one pass starts after what the first one sent, even while
    none of it is acknowledged yet."""
    path = _session(tmp_path, 10)
    producer = LateProducer()
    publisher = _publisher(producer, tmp_path / "state.json", timeout_s=5)
    answering = threading.Timer(0.3, producer.answer)
    answering.start()
    try:
        counts = publish_paths(publisher, [path, path])
    finally:
        answering.cancel()
    assert len(producer.sent) == 10
    assert (counts.published, counts.skipped) == (10, 0)


def test_one_checkpoint_write_marks_the_files_ahead(tmp_path: Path) -> None:
    """The write that marks a file unsure before its first record marks the next files of the
    pass too: one write for them all, and every mark goes once its file is acknowledged."""
    paths = [_session(tmp_path, 3, f"s{n:02}") for n in range(2 * publish.MARK_AHEAD)]
    state = tmp_path / "state.json"
    producer = StallingProducer(answered=10**9)
    publisher = _publisher(producer, state, topic_log=cast(TopicLog, EmptyTopics()))
    marks: list[int] = []
    original = publisher.checkpoints.save

    def save() -> None:
        marks.append(len(publisher.checkpoints.unsure))
        original()

    publisher.checkpoints.save = save  # type: ignore[method-assign]
    counts = publish_paths(publisher, paths)
    assert counts.published == 3 * len(paths)
    assert marks[0] == publish.MARK_AHEAD  # the first file and the files after it
    assert len(marks) <= 3  # two writes that mark, and the last one
    assert Checkpoints.load(state).unsure == {}
