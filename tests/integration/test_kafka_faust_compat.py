"""The Faust/aiokafka workarounds that need a started client, on the real broker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import faust
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

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
