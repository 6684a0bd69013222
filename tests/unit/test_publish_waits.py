"""The publisher's waits: deadlines, stops, and a checkpoint that holds only acknowledged lines.

A producer whose broker stops answering after some records is simulated by futures that never
complete; the waits, the checkpoint and the exceptions are the real ones.
"""

from __future__ import annotations

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


def _session(tmp_path: Path, lines: int) -> Path:
    """A session file: a header and `lines - 1` messages, one record per line."""
    rows = [{"type": "session", "version": 3, "id": "s1", "timestamp": "2026-01-01T00:00:00Z"}]
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
    path = tmp_path / "s.jsonl"
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
