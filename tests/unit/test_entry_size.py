"""An entry under the reader's 16 MiB whose envelope outgrows the topics: both runtimes agree.

The reader dead-letters it (with a placeholder) before it takes a sequence number, so what the
publisher sends is what the embedded runtime folds. The producer here applies kafka-python's
own size check (`KafkaProducer.send` raises MessageSizeTooLargeError past `max_request_size`,
which the publisher's producer sets to MAX_MESSAGE_BYTES); the real broker's side is
tests/integration/test_publish.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import orjson
from damaged_sessions import outgrowing_line
from kafka import KafkaProducer
from kafka.errors import MessageSizeTooLargeError
from kafka.future import Future
from kafka.record.default_records import DefaultRecordBatchBuilder

from sessionfold.events.envelope import EntryEnvelope, PlaceholderEnvelope, decode
from sessionfold.streams.kafka.limits import MAX_MESSAGE_BYTES
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.publisher import (
    Checkpoints,
    Publisher,
    dead_letter_record,
    publish_paths,
)
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.runtime.embedded import DEAD_LETTERS, SESSION_EVENTS, EmbeddedRuntime

TOPICS = Topics("t.")
SID = "s-big-1"


class SizedProducer:
    """Records what a KafkaProducer would send, refusing a record as its size check does."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    def send(self, topic: str, key: bytes, value: bytes) -> Future:
        """Remember one record, acknowledged at once; raise as kafka-python does when too big."""
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, [])
        if size > MAX_MESSAGE_BYTES:
            raise MessageSizeTooLargeError(f"{size} bytes")
        self.sent.append((topic, key, value))
        return Future().success(None)

    def flush(self) -> None:
        """Nothing is in flight."""

    def values(self, topic: str) -> list[bytes]:
        """The values sent to `topic`, in order."""
        return [value for sent_topic, _key, value in self.sent if sent_topic == topic]


def _entry(entry_id: str, parent: str | None) -> bytes:
    entry = {"type": "label", "id": entry_id, "parentId": parent, "targetId": "a", "label": "x"}
    return orjson.dumps(entry)


def _session(path: Path) -> Path:
    """A v3 session: header, entry a, entry b (its envelope outgrows the topics), c under b."""
    header = orjson.dumps({"type": "session", "version": 3, "id": SID, "cwd": "/w"})
    lines = [header, _entry("a", None), outgrowing_line("b", "a"), _entry("c", "b")]
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def _state(runtime: EmbeddedRuntime) -> bytes:
    return orjson.dumps(runtime.session_state(SID), option=orjson.OPT_SORT_KEYS)


def test_publisher_sends_what_the_embedded_runtime_folds(tmp_path: Path) -> None:
    """Session events and dead letters sent equal the embedded log's; seqs have no gap; a fold of
    what was sent is byte for byte the embedded fold of the file."""
    path = _session(tmp_path / "s.jsonl")
    producer = SizedProducer()
    checkpoints = Checkpoints(tmp_path / "state.json")
    publisher = Publisher(cast(KafkaProducer, producer), TOPICS, checkpoints, world=False)
    counts = publish_paths(publisher, [path])

    embedded = EmbeddedRuntime()
    for record in read_session_file(path):
        embedded.publish(record)

    events = [decode(value) for value in producer.values(TOPICS.session_events)]
    assert events == embedded.log[SESSION_EVENTS]
    kinds = [EntryEnvelope, EntryEnvelope, PlaceholderEnvelope, EntryEnvelope]
    assert [type(e) for e in events] == kinds
    assert [e.seq for e in events] == [1, 2, 3, 4]
    letters = [orjson.loads(value) for value in producer.values(TOPICS.dead_letters)]
    expected: list[Any] = [
        orjson.loads(dead_letter_record(letter))
        for letter in embedded.log[DEAD_LETTERS]
        if isinstance(letter, DeadLetter)
    ]
    assert letters == expected and len(letters) == 1
    assert (counts.published, counts.dead_lettered) == (len(events), 1)

    kafka_side = EmbeddedRuntime()
    for envelope in events:
        kafka_side.publish(envelope)
    assert _state(kafka_side) == _state(embedded)
