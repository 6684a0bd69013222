"""Reading a topic without joining any consumer group: from the beginning, or back from the end.

Analysts and tests read this way: partitions are assigned, not subscribed, so the workers'
group never rebalances because someone looked. The consumers come from kafka/clients.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord

from sessionfold.streams.kafka import clients
from sessionfold.streams.kafka.security import PLAINTEXT, KafkaSecurity

T = TypeVar("T")

#: How many offsets one step of a backward read covers.
BACK_STEP = 500


def read_topic(
    bootstrap: str, topic: str, poll_ms: int = 500, security: KafkaSecurity = PLAINTEXT
) -> Iterator[ConsumerRecord]:
    """Yield every record of `topic` up to the end offsets seen at the start, partition order."""
    consumer = clients.reader(bootstrap, "sessionfold-reader", security)
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


def last_match(
    consumer: KafkaConsumer,
    tp: TopicPartition,
    floor: int,
    end: int,
    match: Callable[[ConsumerRecord], T | None],
    tick: Callable[[], None],
    poll_ms: int = 200,
) -> T | None:
    """The last record in [floor, end) of `tp` that `match` turns into a value, read backwards.

    Steps of `BACK_STEP` offsets from the end, so a record written lately is found after
    reading little. `tick` runs between polls: it raises to give up (a deadline, a signal).
    """
    consumer.assign([tp])
    high = end
    while high > floor:
        low = max(floor, high - BACK_STEP)
        consumer.seek(tp, low)
        found: T | None = None
        while consumer.position(tp) < high:
            tick()
            for record in consumer.poll(timeout_ms=poll_ms).get(tp, []):
                value = match(record) if low <= record.offset < high else None
                found = value if value is not None else found
        if found is not None:
            return found
        high = low
    return None
