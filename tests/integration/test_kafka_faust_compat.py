"""The Faust/aiokafka workarounds that need a started client, on the real broker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import faust
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from sessionfold.streams.kafka import faust_compat
from sessionfold.streams.kafka.topics import Topics, ensure_topics

pytestmark = pytest.mark.kafka


def test_the_fetch_wait_reaches_a_started_aiokafka_fetcher(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """A started aiokafka consumer's fetcher holds the wait Faust passed (1.5 s), and the
    workaround, reaching it through Faust's consumer thread, changes it there."""
    topics = Topics(topic_prefix)
    ensure_topics(kafka_bootstrap, topics, partitions=1)

    async def run() -> tuple[int, bool, int]:
        app = faust.App(
            "compat", broker=f"kafka://{kafka_bootstrap}", autodiscover=False, datadir=str(tmp_path)
        )
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, fetch_max_wait_ms=1500)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topics.session_events, 0)])
            # aiokafka's stop() raises if its group-less reset task never got to run.
            await asyncio.sleep(0.2)
            before = consumer._fetcher._fetch_max_wait_ms
            app.consumer._thread._consumer = consumer  # what the thread does when it starts
            changed = faust_compat.set_fetch_max_wait(app, 100)
            return before, changed, consumer._fetcher._fetch_max_wait_ms
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == (1500, True, 100)


def test_a_waiting_fetch_hands_over_only_the_partitions_it_was_asked_for(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """A fetch asked for partition 0 waits; Faust empties its live set of active partitions (a
    rebalance begins) and a record lands in partition 1, the changelog partition a recovery has
    just sought back. Unguarded, aiokafka hands the record over as if asked (an empty set is
    "every partition") and moves past it; guarded, it stays to be read when asked for."""
    topics = Topics(topic_prefix)
    ensure_topics(kafka_bootstrap, topics, partitions=2)
    p0, p1 = (TopicPartition(topics.session_events, n) for n in (0, 1))

    async def run(guarded: bool) -> tuple[set[int], int]:
        app = faust.App(
            "compat", broker=f"kafka://{kafka_bootstrap}", autodiscover=False, datadir=str(tmp_path)
        )
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, fetch_max_wait_ms=100)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await consumer.start()
        await producer.start()
        try:
            consumer.assign([p0, p1])
            await consumer.seek_to_end(p0, p1)
            start = await consumer.position(p1)
            thread = app.consumer._thread
            thread._consumer = consumer  # what the thread does when it starts
            # Run the thread's calls on this loop: the hop to its own loop is not under test.
            thread.call_thread = lambda fun, *args, **kwargs: fun(*args, **kwargs)
            if guarded:
                faust_compat.fetch_only_asked_partitions(app.consumer)
            live = {p0}
            waiting = asyncio.create_task(app.consumer._getmany(live, timeout=3.0))
            await asyncio.sleep(0.5)
            live.clear()  # Faust pauses every partition as a rebalance begins
            await producer.send_and_wait(p1.topic, b"changelog", partition=1)
            handed = await waiting
            return {tp.partition for tp in handed}, await consumer.position(p1) - start
        finally:
            await producer.stop()
            await consumer.stop()

    assert asyncio.run(run(guarded=False)) == ({1}, 1)  # Faust would drop it: lost
    assert asyncio.run(run(guarded=True)) == (set(), 0)  # still there to be read
