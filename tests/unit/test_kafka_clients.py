"""kafka/clients.py: the one place plain Kafka clients are built (what needs no broker)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from sessionfold.streams.kafka import clients
from sessionfold.streams.kafka.limits import MAX_MESSAGE_BYTES

ROOT = Path(__file__).resolve().parents[2]
#: A client class called: a client built by hand.
CONSTRUCTOR = re.compile(r"\b(KafkaConsumer|KafkaProducer|KafkaAdminClient|AIOKafkaConsumer)\(")


def test_no_client_is_built_outside_the_helper() -> None:
    """The package, the benchmarks and the test workers build every plain client through
    kafka/clients.py."""
    sources = [*(ROOT / "sessionfold").rglob("*.py"), *(ROOT / "bench").glob("*.py")]
    sources.append(ROOT / "tests" / "kafka_workers.py")
    helper = ROOT / "sessionfold" / "streams" / "kafka" / "clients.py"
    by_hand = [
        str(path.relative_to(ROOT))
        for path in sources
        if path != helper and CONSTRUCTOR.search(path.read_text())
    ]
    assert by_hand == []


def test_the_async_reader_fetches_the_largest_record_from_the_earliest() -> None:
    """An aiokafka reader joins no group, starts at the earliest offset, fetches 17 MiB records;
    an option given overrides its default."""

    async def build() -> list[object]:
        consumer = clients.async_reader(
            "127.0.0.1:1", "sessionfold-test", max_partition_fetch_bytes=1024
        )
        plain = clients.async_reader("127.0.0.1:1", "sessionfold-test")
        return [
            consumer._client._client_id,
            consumer._group_id,
            plain._max_partition_fetch_bytes,
            consumer._max_partition_fetch_bytes,
            plain._fetch_max_bytes,
            plain._auto_offset_reset,
        ]

    client_id, group, largest, given, response, reset = asyncio.run(build())
    assert (client_id, group, reset) == ("sessionfold-test", None, "earliest")
    assert (largest, given) == (MAX_MESSAGE_BYTES, 1024)
    assert response == clients.FETCH_MAX_BYTES >= MAX_MESSAGE_BYTES
