"""bench/faust_floor.py against the real broker: a no-op Faust agent reads a whole topic and
reports what it took, which the Kafka pipeline bench sets against the per-worker budget."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# bench/ holds scripts, not a package: its helpers are imported the way the scripts import them.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from faust_floor import floor

from sessionfold.streams.kafka import clients
from sessionfold.streams.kafka.topics import Topics, ensure_topics

pytestmark = pytest.mark.kafka

RECORDS = 300


def test_a_no_op_agent_reads_every_record_and_reports_its_cpu(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Every partition's records reach the agent: it stops at the count, not before."""
    topics = Topics(topic_prefix)
    ensure_topics(kafka_bootstrap, topics, partitions=4)
    producer = clients.producer(kafka_bootstrap, "sessionfold-test")
    try:
        for n in range(RECORDS):
            producer.send(topics.session_events, key=f"s{n % 7}".encode(), value=b"{}")
        producer.flush()
    finally:
        producer.close()
    read = floor(kafka_bootstrap, topics.session_events, RECORDS, partitions=4)
    assert read is not None
    assert read.records == RECORDS - 1  # timed from the first record on
    assert read.seconds > 0 and read.cpu_seconds > 0
    assert read.us_per_record == pytest.approx(read.cpu_seconds * 1e6 / read.records)


def test_a_topic_short_of_the_count_gives_no_figure(
    kafka_bootstrap: str, topic_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent that never sees the count is stopped at the timeout and reports nothing."""
    monkeypatch.setattr("faust_floor.TIMEOUT_S", 20.0)
    topics = Topics(topic_prefix)
    ensure_topics(kafka_bootstrap, topics, partitions=4)
    assert floor(kafka_bootstrap, topics.session_events, 10, partitions=4) is None
