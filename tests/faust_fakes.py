"""Stand-ins for the parts of a Faust table a FaustBackend touches: its store, the app's producer
(and the aiokafka producer under it, for record batches) and the changelog topic's name; and a
real Faust app that is never started. Imported by unit tests as `faust_fakes` (pytest puts
`tests/` on sys.path for its rootdir conftest).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import faust
from aiokafka.record.default_records import DefaultRecordBatch
from faust.types import TP


def unstarted_app(tmp_path: Path, app_id: str = "unstarted", **options: Any) -> faust.App:
    """A real Faust app that is never started (its broker does not exist)."""
    return faust.App(
        app_id,
        broker="kafka://127.0.0.1:1",
        autodiscover=False,
        web_enabled=False,
        datadir=str(tmp_path),
        **options,
    )


class FakeStore(dict):
    def __init__(self) -> None:
        super().__init__()
        self.persisted: dict[Any, int] = {}

    def set_persisted_offset(self, tp: Any, offset: int) -> None:
        self.persisted[tp] = offset


class FakeProducer:
    """Faust's producer: `sent` holds each record sent, `pending` each acknowledgement to give.

    While `full` is set, a send waits (as aiokafka's does for a partition's queued batch to be
    drained) until it is cleared.
    """

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []
        self.headers: list[Any] = []  # each send's headers
        self.pending: list[asyncio.Future[Any]] = []
        self.full: asyncio.Event | None = None
        self._producer = FakeAIOKafkaProducer(self)

    async def send(self, topic: str, key: Any, value: Any, partition: Any, *rest: Any) -> Any:
        await self.drained()
        self.sent.append((topic, key, value, partition))
        self.headers.append(rest[1] if len(rest) > 1 else None)
        return self.waiting()

    async def drained(self) -> None:
        while self.full is not None and self.full.is_set():
            await asyncio.sleep(0.001)

    def waiting(self) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        return future


class FakeAIOKafkaProducer:
    """aiokafka's producer under it: `send_batch` reads the record batch's bytes back into
    `batches` (topic, partition, [(key, value), ...]), their headers into `headers`, and waits
    like a send."""

    def __init__(self, faust_producer: FakeProducer) -> None:
        self.faust_producer = faust_producer
        self.batches: list[tuple[str, int, list[tuple[bytes, bytes | None]]]] = []
        self.headers: list[list[Any]] = []  # each batch's records' headers
        self._message_accumulator = type("Accumulator", (), {"_compression_type": 0})()

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> Any:
        await self.faust_producer.drained()
        records = list(DefaultRecordBatch(batch._build()))
        self.batches.append((topic, partition, [(r.key, r.value) for r in records]))
        self.headers.append([list(r.headers) for r in records])
        return self.faust_producer.waiting()


class FakeTable:
    def __init__(self) -> None:
        self.data = FakeStore()
        self.app = type("App", (), {"producer": FakeProducer()})()
        self.changelog_topic = type("Topic", (), {"get_topic_name": lambda self: "app-state-cl"})()


class Acked:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self.topic_partition = TP(topic, partition)
        self.offset = offset
