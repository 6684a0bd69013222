"""Reading a topic from the beginning to its current end, without joining any consumer group.

Analysts and tests read this way: partitions are assigned, not subscribed, so the workers'
group never rebalances because someone looked.
"""

from __future__ import annotations

from collections.abc import Iterator

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord

from sessionfold.streams.kafka_security import PLAINTEXT, KafkaSecurity, kafka_python_options


def read_topic(
    bootstrap: str, topic: str, poll_ms: int = 500, security: KafkaSecurity = PLAINTEXT
) -> Iterator[ConsumerRecord]:
    """Yield every record of `topic` up to the end offsets seen at the start, partition order."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        **kafka_python_options(security),
        enable_auto_commit=False,
        group_id=None,
        client_id="sessionfold-reader",
    )
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not assigned:
            return
        consumer.assign(assigned)
        consumer.seek_to_beginning(*assigned)
        ends = consumer.end_offsets(assigned)
        remaining = {tp for tp in assigned if ends[tp] > 0}
        while remaining:
            batch = consumer.poll(timeout_ms=poll_ms)
            for tp, records in batch.items():
                for record in records:
                    if record.offset < ends[tp]:
                        yield record
                if consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
    finally:
        consumer.close()
