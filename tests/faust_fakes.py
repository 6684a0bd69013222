"""Stand-ins for the parts of a Faust table a FaustBackend touches: its store, the app's producer
(and the aiokafka producer under it, for record batches) and the changelog topic's name; a
real Faust app that is never started; and Faust's table recovery run on one (RecoveryDriver).
Imported by unit tests as `faust_fakes` (pytest puts `tests/` on sys.path for its rootdir
conftest).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faust
from aiokafka.record.default_records import DefaultRecordBatch
from faust.events import Event
from faust.tables.recovery import Recovery
from faust.types import TP, Message


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


class RecoveryDriver:
    """Faust's table recovery run for real (its Recovery loops, on a never-started app) over a
    consumer stand-in: `rebalance` assigns changelog partitions, `read` hands the recovery one
    changelog record, `ends` holds each partition's end offset as the broker would tell it.

    The table applies what it reads in chunks of `chunk` records (`recovery_buffer_size`).
    `tracked` lets a test watch the recovery (faust_compat.watch_recovery) before it starts.
    """

    def __init__(
        self, tmp_path: Path, chunk: int = 3, tracked: Callable[[faust.App], Any] | None = None
    ) -> None:
        self.app = unstarted_app(tmp_path)
        self.table = self.app.Table(
            "state", key_type=str, value_type=bytes, partitions=2, recovery_buffer_size=chunk
        )
        self.progress = None if tracked is None else tracked(self.app)
        self.ends: dict[TP, int] = {}
        self._assigned: set[TP] = set()
        self._tasks: list[asyncio.Future[None]] = []
        self._stub_broker()

    def tp(self, partition: int) -> TP:
        """The table's changelog partition `partition`."""
        return TP(self.table.changelog_topic.get_topic_name(), partition)

    @property
    def recovery(self) -> Any:
        """Faust's Recovery of the app's tables."""
        return self.app.tables.recovery

    async def rebalance(self, *partitions: int) -> None:
        """A rebalance assigning these changelog partitions, through Faust's TableManager; the
        recovery starts and waits for records (the first call starts its loops)."""
        tps = {self.tp(partition) for partition in partitions}
        self.app.assignor.assigned_actives = lambda: tps
        self.app.assignor.assigned_standbys = set
        revoked, newly = self._assigned - tps, tps - self._assigned
        self._assigned = tps
        await self.app.tables.on_rebalance(tps, revoked, newly, 0)
        if not self._tasks:
            self._tasks = [
                asyncio.ensure_future(Recovery._slurp_changelogs(self.recovery)),
                asyncio.ensure_future(Recovery._restart_recovery(self.recovery)),
            ]
        await self.settle()

    async def read(self, partition: int, offset: int) -> None:
        """Hand the recovery the changelog record at `offset` of `partition`."""
        tp = self.tp(partition)
        key = f"k{partition}-{offset}".encode()
        message = Message(tp.topic, tp.partition, offset, 0.0, 0, {}, key, b"v", None)
        await self.app.tables.changelog_queue.put(Event(self.app, key, b"v", {}, message))
        await self.settle()

    async def settle(self) -> None:
        """Let the recovery's loops run until they wait (the stand-ins never block: a few dozen
        turns of the event loop)."""
        for _ in range(200):
            await asyncio.sleep(0)

    def stop(self) -> None:
        """Cancel the recovery's loops."""
        for task in self._tasks:
            task.cancel()

    def _stub_broker(self) -> None:
        """What the recovery asks of the consumer and fetcher, answered without a broker."""

        async def nothing(*_args: Any) -> None:
            return None

        async def highwaters(*tps: TP) -> dict[TP, int]:
            return {tp: self.ends[tp] for tp in tps}

        async def earliest_offsets(*tps: TP) -> dict[TP, int]:
            return dict.fromkeys(tps, 0)

        consumer: Any = self.app.consumer
        consumer.assignment = set
        consumer.pause_partitions = consumer.resume_partitions = lambda _tps: None
        consumer.resume_flow = lambda: None
        consumer.highwaters = highwaters
        consumer.earliest_offsets = earliest_offsets
        consumer.seek_wait = consumer.perform_seek = nothing
        self.app._fetcher.maybe_start = nothing
        self.table.maybe_start = nothing  # it would declare topics
        self.app.flow_control.resume()
