"""kafka/topics.py: the one partitioner and the one topic-name table."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner as AioPartitioner
from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner.default import DefaultPartitioner

from sessionfold.streams.kafka.topics import Topics, partition_of
from sessionfold.streams.runtime import embedded


class OneTopic:
    """The cluster metadata kafka-python's partitioner asks: one topic, all partitions up."""

    def __init__(self, topic: str, partitions: int) -> None:
        self.topic = topic
        self.partitions = set(range(partitions))

    def topics(self) -> set[str]:
        return {self.topic}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self.partitions

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return self.partitions


@given(st.binary(min_size=0, max_size=64), st.integers(min_value=1, max_value=64))
def test_the_partitioner_agrees_with_the_publishers(key: bytes, partitions: int) -> None:
    """Any key lands where kafka-python's DefaultPartitioner (the publisher's) puts it."""
    cluster = OneTopic("t", partitions)
    expected = DefaultPartitioner().partition("t", key, key, None, None, cluster)
    assert partition_of(key, partitions) == expected


@given(st.text(min_size=1, max_size=40), st.integers(min_value=1, max_value=64))
def test_a_session_id_lands_where_faust_s_producer_puts_it(
    session_id: str, partitions: int
) -> None:
    """A session id (as str) lands where aiokafka's partitioner (Faust's sends) puts its key."""
    everything = list(range(partitions))
    expected = AioPartitioner()(session_id.encode(), everything, everything)
    assert partition_of(session_id, partitions) == expected


def test_the_embedded_log_uses_the_kafka_topic_names() -> None:
    """The embedded runtime's topics come from the one table: the Kafka names, no prefix."""
    assert isinstance(embedded.EMBEDDED_TOPICS, Topics)
    assert not embedded.EMBEDDED_TOPICS.prefix
    assert list(embedded.TOPICS) == Topics("").all()
    assert embedded.FLUSH_REQUESTS == embedded.EMBEDDED_TOPICS.flush_requests == "flush-requests"
