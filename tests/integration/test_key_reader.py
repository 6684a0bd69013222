"""kafka/key_reader.py on the real broker: one key's records of a partition, read on from where
the last read stopped, each read quick whatever the partition held before.

- a read from the beginning (or from an offset) returns the key's records only, in offset order,
  and the offset to go on from; a read from there returns what arrived since;
- a read that finds nothing new answers at once: the consumer's fetch left in flight by the read
  before would otherwise hold the next request for kafka-python's 500 ms fetch wait.
"""

from __future__ import annotations

import time

import pytest
from conftest import unique_topic_prefix

from sessionfold.streams.kafka.key_reader import KeyReader
from sessionfold.streams.kafka.topics import Topics, ensure_topics
from sessionfold.streams.publishing.publisher import make_producer

pytestmark = pytest.mark.kafka


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = make_producer(bootstrap)
    try:
        for key, value in records:
            producer.send(topic, key=key, value=value, partition=0)
        producer.flush()
    finally:
        producer.close()


def test_reads_go_on_from_where_they_stopped_and_answer_at_once(kafka_bootstrap: str) -> None:
    """Only the key's records, in order; the next read from the offset returned gets what came
    since; a read with nothing new, right after one that took several polls, takes far less
    than the broker's 500 ms fetch wait."""
    topics = Topics(unique_topic_prefix())
    ensure_topics(kafka_bootstrap, topics, 1)
    topic = topics.session_events
    first = [(b"a" if n % 3 else b"b", b"%d" % n) for n in range(30)]
    _produce(kafka_bootstrap, topic, first)
    reader = KeyReader(kafka_bootstrap, topic)
    try:
        found = reader.read(0, None, b"a")
        assert [v for _, v in found.records] == [v for k, v in first if k == b"a"]
        assert found.next_offset == len(first)
        assert reader.read(0, 5, b"b").records[0][0] == 6  # offsets 0, 3, 6...: from 5 on
        _produce(kafka_bootstrap, topic, [(b"a", b"new"), (b"b", b"other")])
        more = reader.read(0, found.next_offset, b"a")
        assert [(o, v) for o, v in more.records] == [(30, b"new")] and more.next_offset == 32
        _produce(kafka_bootstrap, topic, [(b"a", b"x" * 1024)] * 1200)  # several polls' worth
        quiet = []
        for _ in range(3):  # each quiet read right after a read that fetched
            offset = reader.read(0, more.next_offset, b"a").next_offset
            started = time.monotonic()
            assert reader.read(0, offset, b"a").records == []
            quiet.append(time.monotonic() - started)
        assert min(quiet) < 0.25, quiet
    finally:
        reader.close()
