"""Every private Faust and aiokafka name the worker relies on, each behind one named function.

The workarounds were written against faust-streaming 0.15.3 and aiokafka 0.14.0 (the pins in
pyproject.toml and what they installed). `check_upstream` runs at worker start-up: another
version logs a warning naming both versions, and a private name a workaround needs that is gone
refuses the start (`UpstreamChanged`) rather than failing later with a traceback.
tests/unit/test_faust_compat.py checks each name's type and meaning on the real libraries.
"""

from __future__ import annotations

import inspect
import logging
import traceback
from collections.abc import Mapping
from typing import Any

import aiohttp
import aiokafka
import faust
from aiokafka import errors as Errors
from aiokafka.consumer.fetcher import Fetcher
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.producer.message_accumulator import BatchBuilder, MessageAccumulator
from aiokafka.protocol.commit import OffsetCommitRequest
from faust.exceptions import NotReady, SameNode
from faust.stores.rocksdb import Store as RocksStore
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.transport.consumer import Consumer, ThreadDelegateConsumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Producer
from faust.transport.producer import ProducerBuffer
from faust.web.exceptions import ServiceUnavailable

log = logging.getLogger(__name__)

#: The versions every workaround here was written and tested against.
TESTED_FAUST = "0.15.3"
TESTED_AIOKAFKA = "0.14.0"


class UpstreamChanged(RuntimeError):
    """A private name a workaround needs is missing from the installed Faust or aiokafka."""


def missing_internals() -> list[str]:
    """The private names this module uses that the installed libraries lack (none: all fine)."""
    # Instance attributes are checked through the class annotations that declare them.
    checks = {
        "faust Consumer._getmany(active_partitions, timeout)": list(
            inspect.signature(ThreadDelegateConsumer._getmany).parameters
        )[1:]
        == ["active_partitions", "timeout"],
        "faust Consumer._add_gap": inspect.iscoroutinefunction(getattr(Consumer, "_add_gap", None)),
        "faust Consumer._committed_offset": "_committed_offset" in _annotations(Consumer),
        "faust Consumer.unacked": isinstance(getattr(Consumer, "unacked", None), property),
        "faust AIOKafkaConsumerThread._consumer": hasattr(AIOKafkaConsumerThread, "_consumer"),
        "faust Consumer._thread": "_thread" in _annotations(ThreadDelegateConsumer),
        "faust AIOKafkaConsumerThread._ensure_consumer, call_thread": callable(
            getattr(AIOKafkaConsumerThread, "_ensure_consumer", None)
        )
        and inspect.iscoroutinefunction(getattr(AIOKafkaConsumerThread, "call_thread", None)),
        "aiokafka GroupCoordinator._do_commit_offsets from generation": "self.generation,"
        in inspect.getsource(GroupCoordinator._do_commit_offsets)
        and "self.generation = OffsetCommitRequest.DEFAULT_GENERATION_ID"
        in inspect.getsource(GroupCoordinator.reset_generation),
        "aiokafka Fetcher fetch_max_wait_ms": "fetch_max_wait_ms"
        in inspect.signature(Fetcher.__init__).parameters,
        "faust rocksdb Store._dbs": "_dbs" in _annotations(RocksStore),
        "faust rocksdb Store.offset_key": isinstance(
            getattr(RocksStore, "offset_key", None), bytes
        ),
        "faust Table._serializer_from_type": callable(
            getattr(faust.Table, "_serializer_from_type", None)
        ),
        "faust ProducerBuffer.max_messages": isinstance(
            getattr(ProducerBuffer, "max_messages", None), int
        ),
        "faust Recovery.active_offsets": "active_offsets" in _annotations(Recovery)
        and "standby_offsets" in _annotations(Recovery)
        and callable(getattr(Recovery, "revoke", None)),
        "faust Recovery._build_highwaters(consumer, tps, destination, title)": (
            inspect.iscoroutinefunction(getattr(Recovery, "_build_highwaters", None))
            and list(inspect.signature(Recovery._build_highwaters).parameters)[1:]
            == ["consumer", "tps", "destination", "title"]
        ),
        "faust Recovery.active_highwaters, buffers": {"active_highwaters", "buffers"}
        <= set(_annotations(Recovery)),
        "faust TableManager.on_rebalance": inspect.iscoroutinefunction(
            getattr(TableManager, "on_rebalance", None)
        ),
        "faust aiokafka Producer._producer": "_producer" in _annotations(Producer),
        "aiokafka MessageAccumulator._compression_type": "self._compression_type ="
        in inspect.getsource(MessageAccumulator.__init__),
        "aiokafka AIOKafkaProducer._message_accumulator": "self._message_accumulator ="
        in inspect.getsource(aiokafka.AIOKafkaProducer.__init__),
        "faust aiokafka Producer.key_partition": callable(getattr(Producer, "key_partition", None)),
        "aiokafka BatchBuilder(batch_size, compression_type)": list(
            inspect.signature(BatchBuilder.__init__).parameters
        )[1:3]
        == ["batch_size", "compression_type"],
    }
    return [name for name, present in checks.items() if not present]


def version_warning() -> str | None:
    """A warning naming the installed and the tested versions when they differ, else None."""
    installed = (faust.__version__, aiokafka.__version__)
    if installed == (TESTED_FAUST, TESTED_AIOKAFKA):
        return None
    return (
        f"faust-streaming {installed[0]} and aiokafka {installed[1]} are installed; the Faust "
        f"workarounds were written for faust-streaming {TESTED_FAUST} and aiokafka "
        f"{TESTED_AIOKAFKA}"
    )


def check_upstream() -> None:
    """Warn about untested versions; raise UpstreamChanged when a needed private name is gone."""
    warning = version_warning()
    if warning is not None:
        log.warning(warning)
    missing = missing_internals()
    if missing:
        msg = f"{warning or 'the installed Faust'}: missing {', '.join(missing)}"
        raise UpstreamChanged(msg)


async def _keep_gap(tp: Any, offset_from: int, offset_to: int) -> None:
    """Faust's gap booking, disabled: a hole in our offsets is a loss to repair, not a gap."""


def disable_gap_booking(consumer: Any) -> None:
    """Stop Faust booking a jump in offsets as a processed gap (`Consumer._add_gap`).

    Faust 0.15 books the offsets a `getmany` skipped around a rebalance as a gap and commits
    past them unread; our topics have no real gaps, so `ContiguousOffsets` re-reads them instead.
    """
    consumer._add_gap = _keep_gap


def committed_offset(consumer: Any, tp: Any) -> int | None:
    """The offset Faust last committed for `tp` (`Consumer._committed_offset`), or None.

    Faust has no public read of it; after a rebalance it is where reading starts again, so it is
    the offset `ContiguousOffsets` expects first.
    """
    return getattr(consumer, "_committed_offset", {}).get(tp)


async def start_offset(consumer: Any, tp: Any) -> int:
    """Where the group's reading of `tp` starts: its committed offset, or with none (or one the
    log no longer holds) the partition's earliest offset, where `auto_offset_reset="earliest"`
    puts the fetcher.

    Faust drops records it has fetched and relies on `perform_seek` (each partition back to its
    committed offset) to read them again: at the end of a recovery it pauses the changelog
    partitions before it resumes the stream partitions, and a fetch running meanwhile is handed
    its live set of active partitions, empty for that moment, which aiokafka's
    `Fetcher.fetched_records` takes as "every partition"; Faust then drops the stream records
    it returns as not active, with the fetcher's position past them. But Faust keeps no
    committed offset for a partition the group never committed, nor for one committed at 0
    (`perform_seek` books both as None), and aiokafka's `seek_to_committed` moves only a
    partition committed past 0: such a partition's dropped records are skipped for good, and
    Faust, whose check for a hole below the acknowledged offsets needs a committed offset,
    commits past them. Asked of the broker, not of Faust's bookkeeping, which is empty between a
    revocation and the end of the next recovery. The group's offset is read through Faust's
    consumer thread (`AIOKafkaConsumerThread._ensure_consumer`, in its loop: `call_thread`); the
    earliest offset through Faust's `earliest_offsets`.
    """
    thread = consumer._thread
    client = thread._ensure_consumer()
    committed = await thread.call_thread(
        client.committed, aiokafka.TopicPartition(tp.topic, tp.partition)
    )
    earliest = (await consumer.earliest_offsets(tp))[tp]
    # A commit older than the log's start (retention) reads from the start too.
    return max(int(committed or 0), int(earliest))


def forget_unacked(consumer: Any, message: Any) -> None:
    """Take `message` out of Faust's unacked set without acking it (`Consumer.unacked`).

    A revocation waits for that set to empty (`stream_wait_empty`): a record refused or given
    back to be read again would otherwise hold the rebalance for ever.
    """
    getattr(consumer, "unacked", set()).discard(message)


def fetch_only_asked_partitions(consumer: Any) -> None:
    """Hand each fetch a copy of the partitions Faust asks it for (`Consumer._getmany`).

    Faust passes its live set of active partitions, which a fetch waiting at aiokafka (up to a
    second) keeps reading: as a rebalance begins Faust empties that set, and aiokafka's
    `Fetcher.fetched_records` takes an empty set as "every partition". The fetch then hands over
    records of partitions nobody asked for, such as the changelog partition the new recovery has
    just sought back to its start, and Faust drops them as not active with aiokafka's position
    past them: that recovery waits for them for ever (a worker kept answering 503 "recovering").
    """
    getmany = consumer._getmany

    async def getmany_asked(active_partitions: Any, timeout: float) -> Any:
        asked = None if active_partitions is None else frozenset(active_partitions)
        return await getmany(active_partitions=asked, timeout=timeout)

    consumer._getmany = getmany_asked


def _aiokafka_consumer(app: Any) -> Any:
    """The aiokafka consumer Faust's consumer thread has built (`_thread._consumer`), or None
    before it has."""
    return getattr(getattr(app.consumer, "_thread", None), "_consumer", None)


def set_fetch_max_wait(app: Any, milliseconds: int) -> bool:
    """Set how long aiokafka's fetcher waits at the broker; False if it is not built yet.

    Faust builds its aiokafka consumer with `fetch_max_wait_ms=1500` and no setting; the
    fetcher reads `_fetch_max_wait_ms` for every fetch, reached through Faust's consumer thread
    (`_thread._consumer._fetcher`).
    """
    fetcher = getattr(_aiokafka_consumer(app), "_fetcher", None)
    if fetcher is None or not hasattr(fetcher, "_fetch_max_wait_ms"):
        return False
    fetcher._fetch_max_wait_ms = milliseconds
    return True


def commit_only_as_member(app: Any) -> bool:
    """Make the consumer refuse every commit while it is no member of its group; False if
    aiokafka's consumer is not built yet.

    Once the coordinator has dropped it (a stall past the session timeout), aiokafka resets its
    generation to -1 and still sends commits, and the broker takes a commit with no generation
    whenever the group is empty: a worker back from a freeze could commit offsets another owner
    had not folded yet. The check sits in `GroupCoordinator._do_commit_offsets`, which builds
    the request from `generation` with no await in between, and raises what the broker answers
    a member it does not know, which Faust's commit takes as "already rebalanced".
    """
    coordinator = getattr(_aiokafka_consumer(app), "_coordinator", None)
    if coordinator is None:
        return False
    commit = coordinator._do_commit_offsets

    async def commit_as_member(assignment: Any, offsets: Any) -> Any:
        if coordinator.generation == OffsetCommitRequest.DEFAULT_GENERATION_ID:
            raise Errors.UnknownMemberIdError("not a member of the group: no commit")
        return await commit(assignment, offsets)

    coordinator._do_commit_offsets = commit_as_member
    return True


def partition_dbs(store: Any) -> Mapping[int, Any]:
    """The open RocksDB of each partition of a Faust rocksdb store (`Store._dbs`).

    Faust's store methods pick the partition of the event being processed; a write confirmed
    later, or a read for another partition's key, must name its partition's database itself.
    """
    dbs: Mapping[int, Any] = store._dbs
    return dbs


def persisted_offset_key(store: Any) -> bytes:
    """The key under which a Faust rocksdb store keeps a partition's persisted offset.

    Written in the same RocksDB batch as the data, so a crash never leaves a store ahead of the
    offset recovery starts from (Faust's `set_persisted_offset` is a write of its own).
    """
    key: bytes = store.offset_key
    return key


def set_buffer_limit(producer: Any, records: int) -> None:
    """Let Faust's producer buffer hold `records` before it pauses streams to drain it.

    `ProducerBuffer.max_messages` is a class default (100) with no setting; one flush writes
    more changelog records than that, and Faust warns each time the buffer passes it.
    """
    producer.buffer.max_messages = records


def read_changelog_again(app: Any, topic: str) -> None:
    """Make the next recovery read changelog `topic` from the start (or from a local store's
    persisted offset), as for a partition newly assigned (`Recovery.revoke`).

    Faust's Recovery keeps, per changelog partition, the offset it has read to, and resumes
    there for a partition kept over a rebalance; only a revoked one is read again. The offsets
    are read from `Recovery.active_offsets` and `standby_offsets`.
    """
    recovery = app.tables.recovery
    for tp in [*recovery.active_offsets, *recovery.standby_offsets]:
        if tp.topic == topic:
            recovery.revoke(tp)


class RecoveryProgress:
    """How far the recovery under way has applied each active changelog partition to the store,
    read from Faust's `Recovery` once `watch_recovery` follows it (`recovered`)."""

    def __init__(self) -> None:
        self._rebalances = 0  # rebalances begun: each starts a recovery
        self._built: int | None = None  # the rebalance whose active highwaters Faust built last
        self._recovery: Any = None  # Faust's Recovery, once its highwater build is wrapped

    def rebalanced(self, recovery: Any) -> None:
        """A rebalance begins (`TableManager.on_rebalance`): what the last recovery built is
        void until this one builds its highwaters again."""
        self._rebalances += 1
        if self._recovery is not recovery:
            self._wrap_highwaters(recovery)

    def recovered(self, tp: Any) -> bool:
        """Whether every changelog record of the active partition `tp` up to the highwater the
        current recovery started from is in the store; False whenever that is not known."""
        recovery = self._recovery
        if recovery is None or self._built != self._rebalances:
            return False
        highwater = recovery.active_highwaters.get(tp)
        offset = recovery.active_offsets.get(tp)
        # Both are last offsets: Faust's highwater is the end offset less one (-1: empty).
        if highwater is None or offset is None or offset < highwater:
            return False
        return not _buffered(recovery, tp)

    def _wrap_highwaters(self, recovery: Any) -> None:
        """Note which rebalance each build of the active highwaters belongs to.

        Faust keeps a kept partition's highwater over a rebalance and builds new ones only once
        the recovery runs (`Recovery._build_highwaters`, after a delay and a producer flush): a
        highwater is the current recovery's only if built since the last rebalance began, and a
        build a rebalance overtook belongs to the one before.
        """
        build = recovery._build_highwaters

        async def build_highwaters(consumer: Any, tps: Any, destination: Any, title: str) -> None:
            rebalance = self._rebalances
            await build(consumer, tps, destination, title)
            if destination is recovery.active_highwaters:
                self._built = rebalance

        recovery._build_highwaters = build_highwaters
        self._recovery = recovery


def watch_recovery(app: Any) -> RecoveryProgress:
    """Follow the recoveries of `app`'s tables, each begun by a rebalance; call before the app
    starts.

    Faust's Recovery is reached only once a rebalance begins (`TableManager.on_rebalance`, which
    creates it if need be): built earlier, it would bind the event loop before the worker runs.
    """
    progress = RecoveryProgress()
    tables = app.tables
    rebalance = tables.on_rebalance

    async def on_rebalance(*args: Any, **kwargs: Any) -> None:
        progress.rebalanced(tables.recovery)
        await rebalance(*args, **kwargs)

    tables.on_rebalance = on_rebalance
    return progress


def _buffered(recovery: Any, tp: Any) -> bool:
    """Whether Faust's recovery holds a record of `tp` it read and has not applied yet.

    Faust books a changelog record's offset as read (`active_offsets`) as it puts the record
    in its table's buffer (`Recovery.buffers`), and applies a buffer only once it holds a chunk
    (`recovery_buffer_size` records, of any partition) or the whole recovery is done.
    """
    return any(event.message.tp == tp for events in recovery.buffers.values() for event in events)


def aiokafka_producer(app: Any) -> Any:
    """The aiokafka producer under a started Faust app's producer (`Producer._producer`).

    Faust's Producer sends one record at a time; aiokafka's `send_batch` (public) appends a
    whole record batch, which the broker writes to the log as one unit.
    """
    return app.producer._producer


def record_batch(producer: Any, max_bytes: int) -> Any:
    """An empty aiokafka `BatchBuilder` of up to `max_bytes`, compressed as `producer` compresses.

    `AIOKafkaProducer.create_batch` sizes it by the producer's batch size, which also bounds the
    batches of every topic its single records go to; a changelog batch may be larger. The codec
    is the accumulator's (`MessageAccumulator._compression_type`). Not transactional: only the
    at-least-once path sends batches.
    """
    return BatchBuilder(max_bytes, producer._message_accumulator._compression_type)


class RawKeyTable(faust.Table):
    """A Faust table whose str keys go to the changelog as plain UTF-8, not JSON-quoted.

    Faust picks a key serializer from the key type (`Collection._serializer_from_type`), and for
    str that is JSON; no public setting makes it raw.
    """

    def _serializer_from_type(self, typ: Any) -> Any:
        if typ in (str, bytes):
            return "raw"
        return super()._serializer_from_type(typ)


class NotRoutable(Exception):
    """The worker cannot route a request to its key's owner yet; `reason` is a code
    (`ROUTING_REASONS`), never a message."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


#: Why a request cannot be routed yet: the producer is not started; it has no metadata of the
#: table's changelog topic; no worker owns the key's partition yet (before the first assignment,
#: during a rebalance); the owner's web server did not answer; routing raised something else.
ROUTING_REASONS = ("producer", "metadata", "assignment", "owner", "router")


def routing_failure(exc: BaseException) -> str | None:
    """The reason (`ROUTING_REASONS`) when `exc` is Faust failing to find a key's partition
    because its producer is not ready, else None.

    Faust's `Router.key_store` partitions the key with its producer's `key_partition`, which
    raises `NotReady` before the producer starts, and, until the producer has fetched the
    changelog topic's metadata, aiokafka's `_partition` raises `TypeError: 'NoneType' object
    is not iterable` (it lists `partitions_for_topic`, None for a topic it does not know).
    Faust's views (its `/router` routes, its `table_route`) let both through as a 500.
    """
    if isinstance(exc, NotReady):
        return "producer"
    frames = {frame.f_code.co_name for frame, _ in traceback.walk_tb(exc.__traceback__)}
    return "metadata" if "key_partition" in frames else None


async def route_request(
    app: Any, table_name: str, key: str, web: Any, request: Any, body: bytes | None = None
) -> Any:
    """The answer of the worker owning `key`'s partition of table `table_name`, the request
    proxied to it (Faust's `Router.route_req`); None when this worker owns it.

    Faust's proxy forwards the method, headers and URL but drops the body; a request with a
    `body` (the live routes' POSTs) is proxied here with it (`_route_with_body`).

    Raises `NotRoutable` when the request cannot be routed yet, whatever routing raised: the
    cases of `routing_failure`, no owner (Faust's `ServiceUnavailable`, which loses the reason
    and the retry hint), an owner that did not answer (its web server not up yet, say).
    """
    try:
        if body is None:
            return await app.router.route_req(table_name, key, web, request)
        return await _route_with_body(app, table_name, key, web, request, body)
    except SameNode:
        return None
    except ServiceUnavailable:
        raise NotRoutable("assignment") from None
    except (aiohttp.ClientError, OSError):  # TimeoutError is an OSError
        raise NotRoutable("owner") from None
    except Exception as exc:  # nothing a handler does runs in here: only the routing
        raise NotRoutable(routing_failure(exc) or "router") from None


#: Headers a proxied request does not copy: the client sets them for the body and the hop.
HOP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


async def _route_with_body(
    app: Any, table_name: str, key: str, web: Any, request: Any, body: bytes
) -> Any:
    """Faust's `Router.route_req` (0.15.3), the body forwarded too; SameNode when this
    worker owns the key, ServiceUnavailable when nobody does."""
    try:
        owner = app.router.key_store(table_name, key)
    except KeyError:
        raise ServiceUnavailable() from None
    host, port = _url_ident(owner)
    if (host, port) == _url_ident(app.conf.canonical_url):
        raise SameNode()
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
    url = request.url.with_host(host).with_port(port)
    async with app.http_client.request(
        method=request.method, headers=headers, url=url, data=body
    ) as response:
        return web.bytes(
            await response.read(), content_type=response.content_type, status=response.status
        )


def owns(app: Any, table_name: str, key: str) -> bool:
    """Whether this worker owns `key`'s partition of table `table_name`, as Faust's router
    decides it (`Router.route_req`); KeyError when nobody does yet."""
    owner = app.router.key_store(table_name, key)
    return _url_ident(owner) == _url_ident(app.conf.canonical_url)


def _url_ident(url: Any) -> tuple[str, int]:
    """(host, port) of a worker URL, as Faust's `Router._urlident` compares them."""
    return ((url.host if url.scheme else url.path) or "", int(url.port or 80))


def _annotations(cls: type) -> dict[str, Any]:
    return getattr(cls, "__annotations__", {})


__all__ = [
    "ROUTING_REASONS",
    "TESTED_AIOKAFKA",
    "TESTED_FAUST",
    "NotRoutable",
    "RawKeyTable",
    "RecoveryProgress",
    "UpstreamChanged",
    "aiokafka_producer",
    "check_upstream",
    "commit_only_as_member",
    "committed_offset",
    "disable_gap_booking",
    "fetch_only_asked_partitions",
    "forget_unacked",
    "missing_internals",
    "owns",
    "partition_dbs",
    "persisted_offset_key",
    "read_changelog_again",
    "record_batch",
    "route_request",
    "routing_failure",
    "set_buffer_limit",
    "set_fetch_max_wait",
    "start_offset",
    "version_warning",
    "watch_recovery",
]
