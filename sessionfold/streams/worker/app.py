"""The Kafka runtime: `make_app(settings)` builds one Faust app for a worker's role.

- role `fold`: the fold agent over session-events and compaction-events (one Faust topic over
  both names; every topic is keyed by session id with the same partition count, so one worker
  holds all of a session's state): the pruning folds and the rule ledger; the dead-letter count
  agent, the `state` table and the state API. Consumer group: the app id.
- role `summarize`: the summarizer agent over flush-requests (pruning flushes through the model
  port, ledger passes through the diff model). Consumer group: app id + `-summarize`, so
  summarizers scale apart from the folds.
- role `all`: both in one process and one group (do not run separate summarize workers beside
  `all` workers of the same app id: both would answer, harmlessly but twice).

The `state` table is changelog-backed (keys `sid/...` as the folds write them, values orjson
bytes: agents.py and kafka/table_store.py). Every agent runs with concurrency 1 (faust #606:
with more, Faust can commit past an in-flight message); the summarizer answers up to
`answer_threads` requests at once within it (answers.py), acknowledged in offset order. Every
worker serves `/metrics` from a registry of its own (prometheus.py) and `/health`; every other
route asks for the API token when one is set (web/auth.py), and the web server binds 127.0.0.1
unless told otherwise. No app exists at import time: each call builds a new one.

The fold agent works in batches (`FoldBatcher`): records that arrive back to back are folded one
after another and committed together, so a key many of them write goes to the changelog once
(agents.py, `FoldRuntime`). Its changelog writes go straight to Faust's producer (`FaustBackend`).

At-least-once, for real: a record is acknowledged to Faust only once everything its batch wrote
to the changelog and sent to other topics is acknowledged by the broker, and only after every
record read before it (`FaustBackend`, `OrderedAcks`), since Faust's own pre-commit flush can
return early and Faust commits past an unacknowledged record; and `ContiguousOffsets` reads
again the records Faust's consumer skips around rebalances. Together with the journal
(kafka/table_store.py) and the folds' idempotence, a crash, a redelivery or a rebalance neither
loses nor double-applies an event or a flush.

Faust's and aiokafka's private names, each used where the public API has no equivalent, are
reached only through kafka/faust_compat.py: gap booking and the committed offsets
(`ContiguousOffsets`), the fetcher's wait (`shorten_fetch_wait`), the coordinator's commits
(`commit_only_as_member`), the rocksdb store's databases (`LocalBackend`, for
`--store rocksdb://`: a restart reads only the changelog records its local store lacks), the
table's key serializer (`StateTable`) and the producer buffer's size.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import faust
import rocksdict
from faust.web import Request, Response, View
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from sessionfold.ports.ledger.model import DiffModel, OfflineModel
from sessionfold.ports.summarizer import ModelPort, OfflineSummarizer
from sessionfold.projections.ledger.config import DEFAULT_LEDGER, LedgerConfig
from sessionfold.projections.pruning.config import DEFAULT_CONFIG, PruneConfig
from sessionfold.streams.kafka import changelog, faust_compat
from sessionfold.streams.kafka.fence import FENCE_HEADER, Fence, decode_epoch, encode_epoch
from sessionfold.streams.kafka.key_reader import KeyReader
from sessionfold.streams.kafka.security import PLAINTEXT, KafkaSecurity, faust_credentials
from sessionfold.streams.kafka.table_store import RECORD_OVERHEAD, Output, Write, right_sized
from sessionfold.streams.kafka.topics import (
    DEFAULT_PARTITIONS,
    DEFAULT_PREFIX,
    MAX_MESSAGE_BYTES,
    Topics,
)
from sessionfold.streams.private_dirs import make_private_dirs
from sessionfold.streams.runtime.step import Answerer
from sessionfold.streams.web import auth as web_auth
from sessionfold.streams.web import live_worker, state_api
from sessionfold.streams.web.cache_policy import CACHE_TTL_S, MIN_FREED_TOKENS, CachePolicy
from sessionfold.streams.web.gateway import Gateway, default_upstreams
from sessionfold.streams.web.live_contract import DEFAULT_WAIT_S, MAX_BODY_BYTES, LiveMetrics
from sessionfold.streams.web.live_worker import WorkerLive
from sessionfold.streams.web.plan_cache import PlanCache, PlanRoute, local_first
from sessionfold.streams.worker import fault_injection
from sessionfold.streams.worker.agents import (
    FoldRuntime,
    Sender,
    SessionTracker,
    SourceRecord,
    SummarizeRuntime,
)
from sessionfold.streams.worker.answers import DEFAULT_ANSWER_THREADS, AnswerPool
from sessionfold.streams.worker.prometheus import FleetCollector, Metrics, create

log = logging.getLogger(__name__)

Role = Literal["fold", "summarize", "all"]

#: Largest record (and record batch) the worker produces: a session's writes over a batch are
#: one record batch, and one event's writes can hold the whole event (the flush barrier keeps
#: held envelopes as rows), which may be as large as session-events allows; 8 MiB more leaves
#: room for the rest of the batch.
MAX_RECORD_BYTES = MAX_MESSAGE_BYTES + 8 * 1024 * 1024

#: Bytes of groups packed into one changelog record batch: a record batch is one record for the
#: broker's size limit; 1 MiB under it leaves room for the estimate's error.
BATCH_RECORD_BYTES = MAX_RECORD_BYTES - 1024 * 1024


class WorkerSettings(BaseModel):
    """Everything a worker needs; the timeouts default to values that also suit tests."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: str = "127.0.0.1:9092"
    topic_prefix: str = DEFAULT_PREFIX
    partitions: int = Field(DEFAULT_PARTITIONS, ge=1)
    replication: int = Field(1, ge=1)
    role: Role = "all"
    #: Faust id: consumer group and prefix of the changelog topic. Default: `<prefix>worker`.
    app_id: str | None = None
    web_port: int = Field(6066, ge=0, le=65535)
    #: Loopback unless widened: the state API serves session content (web/auth.py).
    web_bind: str = "127.0.0.1"
    #: Host other workers reach this one at (state requests are proxied to the owner).
    web_host: str | None = None
    #: Bearer token every web route but /metrics and /health asks for; None: no token.
    api_token: SecretStr | None = None
    store: str = "memory://"
    data_dir: Path | None = None
    processing_guarantee: Literal["at_least_once", "exactly_once"] = "at_least_once"
    session_timeout_s: float = Field(6.0, gt=0)
    heartbeat_interval_s: float = Field(1.0, gt=0)
    rebalance_timeout_s: float = Field(20.0, gt=0)
    request_timeout_s: float = Field(30.0, gt=0)
    commit_interval_s: float = Field(0.5, gt=0)
    #: Records an agent may have fetched but not processed. Small on purpose: a compaction queued
    #: behind thousands of session events keeps its session's barrier up (and its events held)
    #: for as long as those take.
    stream_buffer: int = Field(128, ge=1)
    max_poll_records: int = Field(100, ge=1)
    #: Seconds the producer waits to batch records: one event writes several changelog records,
    #: and sent one request each they cost more than the fold itself.
    producer_linger_s: float = Field(0.005, ge=0)
    #: Most records the fold agent folds before it commits them together (it commits sooner
    #: when no more are waiting): each key they write goes to the changelog once per batch.
    batch_records: int = Field(100, ge=1)
    #: Seconds a fold batch waits for its next record before it is committed: what a batch adds
    #: to the latency of an event on a quiet stream.
    batch_linger_s: float = Field(0.002, ge=0)
    #: Longest a fetch waits at the broker for records (Faust fixes it at 1.5 s, see
    #: `shorten_fetch_wait`).
    fetch_wait_s: float = Field(0.1, gt=0, le=1.5)
    prune: PruneConfig = DEFAULT_CONFIG
    #: Fold the rule ledger too (its passes go through flush-requests to the summarizer).
    ledger: bool = True
    #: How every Kafka client of the worker connects (Faust's and the state API's).
    security: KafkaSecurity = PLAINTEXT
    #: Sessions whose entries the live routes keep in memory (web/live_worker.py), and how long
    #: a context call waits for its leaf by default.
    live_sessions: int = Field(live_worker.DEFAULT_CACHED_SESSIONS, ge=1)
    live_wait_s: float = Field(DEFAULT_WAIT_S, ge=0)
    #: Flush requests the summarizer answers at once (one per session at most, answers.py);
    #: 0 or 1 answers one at a time, as before.
    answer_threads: int = Field(DEFAULT_ANSWER_THREADS, ge=0)
    #: The gateway on a fold worker's web port (docs/live.md, "Fleet"): each API's upstream
    #: base URL by API name, and its cache policy (web/cache_policy.py).
    upstreams: dict[str, str] = Field(default_factory=default_upstreams)
    min_freed_tokens: int = Field(MIN_FREED_TOKENS, ge=0)
    cache_ttl_s: float = Field(CACHE_TTL_S, ge=0)

    @field_validator("store")
    @classmethod
    def _known_store(cls, value: str) -> str:
        if not value.startswith(("memory://", "rocksdb://")):
            msg = "store must be memory:// or rocksdb://"
            raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _local_store_at_least_once(self) -> WorkerSettings:
        if self.local_store and self.processing_guarantee != "at_least_once":
            # LocalBackend writes the store only from changelog acknowledgements; Faust's
            # transactional path writes it at once, ahead of the changelog.
            msg = "store rocksdb:// needs processing_guarantee at_least_once"
            raise ValueError(msg)
        return self

    @field_validator("api_token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < web_auth.MIN_TOKEN_CHARS:
            msg = f"api_token must have at least {web_auth.MIN_TOKEN_CHARS} characters"
            raise ValueError(msg)
        return value

    @property
    def token(self) -> str | None:
        """The API token in clear, or None."""
        return None if self.api_token is None else self.api_token.get_secret_value()

    @property
    def local_store(self) -> bool:
        """Whether the state table is kept on local disk (rocksdb://)."""
        return self.store.startswith("rocksdb://")

    @property
    def folds(self) -> bool:
        """Whether this worker runs the fold."""
        return self.role in ("fold", "all")

    @property
    def summarizes(self) -> bool:
        """Whether this worker runs the summarizer."""
        return self.role in ("summarize", "all")

    @property
    def ledger_config(self) -> LedgerConfig | None:
        """The ledger the fold runs, or None when it is off."""
        return DEFAULT_LEDGER if self.ledger else None

    @property
    def faust_id(self) -> str:
        """The Faust app id (consumer group) for this role."""
        base = self.app_id or f"{self.topic_prefix}worker"
        return f"{base}-summarize" if self.role == "summarize" else base

    @property
    def advertised_host(self) -> str:
        """The host in this worker's canonical URL."""
        if self.web_host:
            return self.web_host
        if self.web_bind not in ("0.0.0.0", "::", ""):
            return self.web_bind
        return os.uname().nodename


def faust_options(settings: WorkerSettings) -> dict[str, Any]:
    """The Faust settings for a worker (reference kafka-broker.md §4)."""
    data_dir = settings.data_dir or _default_data_dir()
    brokers = ";".join(f"kafka://{b.strip()}" for b in settings.bootstrap.split(","))
    return {
        "broker": brokers,
        "store": settings.store,
        "autodiscover": False,
        "datadir": str(data_dir / settings.faust_id),
        # Table changelogs get this count; it must equal the source topics' (PartitionsMismatch).
        "topic_partitions": settings.partitions,
        "topic_replication_factor": settings.replication,
        "topic_disable_leader": True,
        "table_standby_replicas": 0,
        "processing_guarantee": settings.processing_guarantee,
        "broker_session_timeout": settings.session_timeout_s,
        "broker_heartbeat_interval": settings.heartbeat_interval_s,
        "broker_rebalance_timeout": settings.rebalance_timeout_s,
        "broker_request_timeout": settings.request_timeout_s,
        "broker_commit_interval": settings.commit_interval_s,
        "broker_max_poll_records": settings.max_poll_records,
        "stream_buffer_maxsize": settings.stream_buffer,
        # A revoked partition is handed over only after every record read from it is acked,
        # which here means its writes are in the changelog (see FaustBackend).
        "stream_wait_empty": True,
        "producer_max_request_size": MAX_RECORD_BYTES,
        # A session-events record may be as large as the topics allow (a 16 MiB entry), and a
        # changelog record read back in recovery as large as the worker writes.
        "consumer_max_fetch_size": MAX_RECORD_BYTES,
        "producer_linger": settings.producer_linger_s,
        "consumer_auto_offset_reset": "earliest",
        "key_serializer": "raw",
        "value_serializer": "raw",
        "web_enabled": True,
        "web_port": settings.web_port,
        "web_bind": settings.web_bind,
        "web_host": settings.advertised_host,
        "canonical_url": f"http://{settings.advertised_host}:{settings.web_port}",
        # The token first: a request without it learns nothing, not even that the worker starts.
        "web_application_options": {
            "middlewares": [
                web_auth.token_middleware(settings.token),
                state_api.not_ready_middleware(),
            ],
            "client_max_size": MAX_BODY_BYTES,  # the live context call carries pi's array
        },
        # Faust's /table routes read raw state values; the state API is the way in.
        "web_tables_enabled": False,
        "worker_redirect_stdouts": False,
        "broker_credentials": faust_credentials(settings.security),
    }


def _default_data_dir() -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state"))
    return base / "sessionfold" / "worker"


def make_app(
    settings: WorkerSettings,
    model_port: ModelPort | None = None,
    registry: CollectorRegistry | None = None,
    diff_model: DiffModel | None = None,
    step_hook: Callable[[SourceRecord], None] | None = None,
) -> faust.App:
    """A new Faust app running `settings.role`; `model_port` answers flush requests and
    `diff_model` ledger pass requests (both offline by default); `step_hook` (tests only) is
    called before each fold step."""
    options = faust_options(settings)
    make_private_dirs(Path(options["datadir"]))  # the state table: what sessions say
    app = faust.App(settings.faust_id, **options)
    topics = Topics(settings.topic_prefix)
    metrics = create(registry or CollectorRegistry())
    metrics.worker_info.labels(role=settings.role).set(1)
    send = _sender(app, topics)
    offsets = ContiguousOffsets(app, repair=settings.processing_guarantee == "at_least_once")
    app.timer(1.0, name="reread-skipped")(offsets.retry)

    async def tune_consumer() -> None:
        faust_compat.fetch_only_asked_partitions(app.consumer)  # before the first fetch
        await shorten_fetch_wait(app, settings.fetch_wait_s)
        await commit_only_as_member(app)

    app.task(tune_consumer)
    tracker: SessionTracker | None = None
    if settings.folds:
        tracker = _add_fold(app, settings, topics, send, metrics, offsets, step_hook, diff_model)
    if settings.summarizes:
        port = model_port or OfflineSummarizer()
        answerer = Answerer(port, diff_model or OfflineModel())
        runtime = SummarizeRuntime(answerer, send, topics, metrics, threads=settings.answer_threads)
        _add_summarizer(app, topics, runtime, offsets, settings.answer_threads)
    roles = _roles_by_topic(settings, topics)
    metrics.registry.register(
        FleetCollector(
            fleet=lambda: None if tracker is None else tracker.snapshot(_active(app, topics)),
            lag=lambda: consumer_lag(app, roles),
        )
    )
    _add_metrics_page(app, metrics)
    _add_health_page(app)
    web_auth.quiet_bad_requests()
    return app


class StateTable(faust_compat.RawKeyTable):
    """The fold's table: str keys go to the changelog as plain UTF-8, not JSON-quoted.

    The state API's routing hashes the serialized key to find the owner, and it must hash
    like the session id does on the topics; recovery decodes the keys the same way.
    """

    #: Called with the size of every batch of changelog records recovery reads (a metric).
    on_recovered_records: Callable[[int], None] | None = None
    #: Which recovered records to take: a stalled worker's late writes are not (kafka/fence.py).
    fence: Fence | None = None
    #: Called with the number of recovered records the fence kept out (a metric).
    on_fenced_records: Callable[[int], None] | None = None
    #: Called once a batch is applied, with the last offset it read of each partition.
    on_applied: Callable[[dict[int, int]], None] | None = None
    #: Called with the new generation when this worker rejoins after missing consumer
    #: generations: its store is to be emptied (FaustBackend.forget).
    on_rejoined: Callable[[int], None] | None = None
    #: The consumer generation of the last rebalance (None before the first).
    last_generation: int | None = None
    #: Called with the rows each recovered batch applied (key, value or None, partition).
    on_rows: Callable[[list[tuple[str, bytes | None, int]]], None] | None = None

    async def on_rebalance(
        self, assigned: Any, revoked: Any, newly_assigned: Any, generation_id: int = 0
    ) -> None:
        """A worker that missed generations was out of its group: its state is read again.

        Every member takes part in every generation, so a gap says the group went on without
        this worker (a stall past its session timeout). Its partitions may have had another
        owner meanwhile, and its store may hold writes it sent late, which the changelog fence
        leaves out of recoveries (kafka/fence.py); Faust would resume the recovery of a
        partition it gets back from where it stopped, over that store. So the store is emptied
        and every partition read again from the start.
        """
        previous, self.last_generation = self.last_generation, generation_id
        if previous is not None and generation_id > previous + 1:
            log.warning(
                "rejoined after missing consumer generations; reading the state again",
                extra={"generations": generation_id - previous - 1},
            )
            if self.on_rejoined is not None:
                self.on_rejoined(generation_id)
            faust_compat.read_changelog_again(self.app, self.changelog_topic.get_topic_name())
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)

    def apply_changelog_batch(self, batch: Any) -> None:
        """Apply the recovered changelog records the fence takes to the store, counting them:
        a journal record (kafka/changelog.py) as the rows it writes, in offset order."""
        records = batch if isinstance(batch, list) else list(batch)
        taken = records if self.fence is None else self.fence.admitted(records)
        reader = self.__dict__.setdefault("_journals", changelog.Reader())
        rows: list[Any] = []
        applied: list[tuple[str, bytes | None, int]] = []
        for event in taken:
            message = event.message
            key = message.key.decode() if isinstance(message.key, bytes) else str(message.key)
            writes = reader.writes(key, message.value, message.partition)
            if writes is None:  # a row, as the earlier format wrote one per record
                rows.append(event)
                applied.append((key, message.value, message.partition))
                continue
            for row_key, value in writes:
                rows.append(_RowEvent(row_key, value, _RowMessage.of(message, row_key, value)))
                applied.append((row_key, value, message.partition))
        super().apply_changelog_batch(rows)
        if self.on_rows is not None:
            self.on_rows(applied)
        if self.on_recovered_records is not None:
            self.on_recovered_records(len(records))
        if len(taken) < len(records):
            fenced = len(records) - len(taken)
            log.warning(
                "recovery left out a stalled worker's late writes", extra={"records": fenced}
            )
            if self.on_fenced_records is not None:
                self.on_fenced_records(fenced)
        if self.on_applied is not None:
            self.on_applied({r.message.partition: r.message.offset for r in records})


@dataclass(frozen=True, slots=True)
class _RowMessage:
    """The parts of a changelog message a Faust store applies, for one row of a journal record
    (the record's partition and offset: a local store's persisted offset is the record's)."""

    topic: str
    partition: int
    offset: int
    tp: Any
    key: bytes
    value: bytes | None
    headers: Any = None

    @classmethod
    def of(cls, message: Any, key: str, value: bytes | None) -> _RowMessage:
        """Row `key` of the journal record `message`."""
        return cls(
            message.topic, message.partition, message.offset, message.tp, key.encode(), value
        )


@dataclass(frozen=True, slots=True)
class _RowEvent:
    """One row of a journal record, as a Faust store applies a changelog event."""

    key: str
    value: bytes | None
    message: _RowMessage


class RecordBatchFull(RuntimeError):
    """Writes that must land together do not fit in one changelog record batch."""


class FaustBackend:
    """The state table as a Backend: reads from its store, every group of writes sent to its
    changelog as one journal record (kafka/changelog.py).

    Writes go around `Table.__setitem__` to get the changelog send's future: Faust commits
    offsets after flushing its producer buffer, but that flush gives up after 0.1 s without a
    send, so only an acknowledged write is known to be in the changelog.

    Each group (one session's writes of a fold batch; `write` is a group of one) becomes one
    changelog record, a few when a snapshot is due or the group outgrows a record
    (`changelog.Writer`), and the store takes the group's rows, kept by session so a snapshot
    finds them.

    Under at-least-once (`direct`) records go straight to the producer (`app.producer.send`,
    Faust's public Producer API) rather than through `Table.send_changelog`: that path queues
    every record in Faust's producer buffer, which Faust drains one record at a time and flushes
    one record at a time on every offset commit, and it cost more than the fold itself. What
    `send_changelog` does besides is kept: the record goes to the table's changelog topic, in the
    given partition, key as UTF-8 and value raw (StateTable), and once acknowledged its offset is
    the store's persisted offset (a memory store ignores it; `LocalBackend` keeps it for the
    rocksdb store, with the store's writes), and it carries the fence's epoch (kafka/fence.py).
    Under exactly_once writes keep `send_changelog`, which Faust ties to its transactions (and
    whose transactional producer fences a stalled worker: no epoch).

    A partition's records go as whole record batches (aiokafka's `send_batch`), as many as fit
    in one: the producer's per-record work (a future, a callback, a metadata check per record)
    is paid once per batch.
    """

    #: Changelog records Faust may queue before it pauses the streams to drain them (its default,
    #: 100, is less than one flush writes, and it warns each time the queue passes it).
    BUFFER_RECORDS = 2_000

    def __init__(
        self, table: faust.Table, direct: bool = False, fence: Fence | None = None
    ) -> None:
        self.table = table
        self.direct = direct
        self.fence = Fence() if fence is None else fence
        self.writer = changelog.Writer(self.get, self._rows, BATCH_RECORD_BYTES)
        self._buffer_sized = False
        self._topic: str | None = None
        #: Writes of batches read before this generation stay out of the store (`forget`).
        self._stale_below = 0
        #: Per session and partition, the keys the store holds (a snapshot's rows).
        self._keys: dict[tuple[str, int], set[str]] = {}

    def get(self, key: str) -> bytes | None:
        """The value at `key`, or None."""
        return self.table.data.get(key)

    def keys(self) -> Any:
        """Every key the store holds."""
        return self.table.keys()

    def forget(self, generation: int = 0) -> None:
        """Empty the store (StateTable.on_rebalance, at `generation`: recovery fills it again).

        A commit of a batch read before `generation` may still be handing its writes over:
        they go on to the changelog (whose fence leaves them out of recoveries) but no longer
        into the store, where a key only they created would outlive the recovery.
        """
        self.table.data.clear()
        self._keys.clear()
        self.writer.forget()
        self.fence.forget()
        self._stale_below = generation

    def recovered(self, rows: list[tuple[str, bytes | None, int]]) -> None:
        """Rows a recovery applied to the store (StateTable.on_rows): kept by session, and each
        session whose position it read is asked the table for it again."""
        self._index(rows)
        for key, _value, partition in rows:
            if key.endswith(f"/rt/c/{partition}"):
                self.writer.forget(changelog.owner_of(key), partition)

    def _stale(self, generation: int) -> bool:
        """Whether a write of a batch read in `generation` is from before the last `forget`."""
        return 0 < generation < self._stale_below

    async def write(
        self, key: str, value: bytes | None, partition: int, generation: int = 0
    ) -> Any:
        """Set (or with None delete) `key` in the store and send it to the changelog."""
        return await self.write_groups([[(key, value)]], partition, generation)

    async def write_groups(
        self, groups: Sequence[Sequence[Write]], partition: int, generation: int = 0
    ) -> Any:
        """Set (or delete) every key of `groups` in the store, each group one journal record
        in the changelog; one acknowledgement for all."""
        entries = [self.writer.records(group, partition) for group in groups if group]
        if not self.direct:
            # Faust's transaction, not a record batch, makes them atomic (exactly_once).
            if not self._buffer_sized:
                faust_compat.set_buffer_limit(self.table.app.producer, self.BUFFER_RECORDS)
                self._buffer_sized = True
            sent = []
            for records, writes in entries:
                if not self._stale(generation):  # a stale write goes to the changelog only
                    self._store(writes, partition)
                sent += [self.table.send_changelog(partition, k, v) for k, v in records]
            return asyncio.gather(*sent)
        sends = []
        batches = _record_batches(entries, BATCH_RECORD_BYTES)
        try:
            for records, writes in batches:
                sends.append(await self._send(records, writes, partition, generation))
        except BaseException:
            # The records not handed over never were: their sessions' positions are read again
            # from the store, which has only what was (no hole in a session's ring).
            for _records, writes in batches[len(sends) :]:
                for key, _value in writes:
                    self.writer.forget(changelog.owner_of(key), partition)
            raise
        return asyncio.gather(*sends)

    async def _send(
        self,
        records: Sequence[changelog.Out],
        writes: Sequence[Write],
        partition: int,
        generation: int,
    ) -> asyncio.Future[Any]:
        """Send `records` to the changelog (one alone, more as one record batch) and put
        `writes` in the store once the producer holds them; resolves once they are written.

        Sending may wait (aiokafka queues one batch per partition at a time), and a commit
        cancelled or failing there must leave the store as it was: a store ahead of the
        changelog would count redelivered events as folded whose writes and outputs no broker
        ever got.
        """
        if self._topic is None:
            self._topic = self.table.changelog_topic.get_topic_name()
        epoch = self.fence.epoch(partition, generation)
        headers = [(FENCE_HEADER, encode_epoch(epoch))]
        if len(records) == 1:
            key, value = records[0]
            send = self.table.app.producer.send(
                self._topic, key.encode(), value, partition, None, headers
            )
        else:
            send = self._send_batch(records, partition, headers)
        sent = asyncio.ensure_future(await send)
        self._queued(writes, len(records), sent, epoch, self._stale(generation), partition)
        return sent

    def _send_batch(
        self,
        records: Sequence[changelog.Out],
        partition: int,
        headers: list[tuple[str, bytes]],
    ) -> Awaitable[Any]:
        """aiokafka's send of `records` as one record batch (the broker appends it whole)."""
        producer = faust_compat.aiokafka_producer(self.table.app)
        batch = faust_compat.record_batch(producer, MAX_RECORD_BYTES)
        for key, value in records:
            appended = batch.append(timestamp=None, key=key.encode(), value=value, headers=headers)
            if appended is None:
                # A record outgrew a record batch (one row larger than a record): the agent stops.
                msg = f"{len(records)} changelog records do not fit in one record batch"
                raise RecordBatchFull(msg)
        batch.close()
        return producer.send_batch(batch, self._topic, partition=partition)

    def _queued(
        self,
        writes: Sequence[Write],
        records: int,
        sent: asyncio.Future[Any],
        epoch: int,
        stale: bool,
        partition: int,
    ) -> None:
        """`writes` are in the producer's queue (in `records` records): into the store now
        (each value right-sized: table_store.py), unless `stale` (`forget`), and once
        acknowledged their last record's offset is the store's persisted offset."""
        if not stale:
            self._store(writes, partition)
        sent.add_done_callback(lambda done: self._persisted(records, done))

    def _store(self, writes: Sequence[Write], partition: int) -> None:
        data = self.table.data
        for key, value in writes:
            if value is None:
                data.pop(key, None)
            else:
                data[key] = right_sized(value)
        self._index([(key, value, partition) for key, value in writes])

    def _index(self, rows: Iterable[tuple[str, bytes | None, int]]) -> None:
        keys = self._keys
        for key, value, partition in rows:
            owner = (key.split("/", 1)[0], partition)
            held = keys.get(owner)
            if value is not None:
                if held is None:
                    held = keys[owner] = set()
                held.add(key)
            elif held is not None:
                held.discard(key)

    def _rows(self, owner: str, partition: int) -> list[tuple[str, bytes]]:
        """A session's rows in the store (those of its partition), for a snapshot."""
        held = self._keys.get((owner, partition), set())
        rows = []
        for key in list(held):
            value = self.get(key)
            if value is None:
                held.discard(key)  # gone with its partition (Faust drops what it no longer owns)
            else:
                rows.append((key, value))
        return rows

    def _persisted(self, records: int, sent: asyncio.Future[Any]) -> None:
        if not sent.cancelled() and sent.exception() is None:
            metadata = sent.result()  # a record batch's: its first offset
            last = metadata.offset + records - 1
            self.table.data.set_persisted_offset(metadata.topic_partition, last)


def _record_batches(
    entries: Sequence[tuple[list[changelog.Out], list[Write]]], limit: int
) -> list[tuple[list[changelog.Out], list[Write]]]:
    """Each group's records packed in order into record batches of at most `limit` bytes, with
    the group's writes on the batch holding its last record (the store takes them only once
    all of them are handed over)."""
    batches: list[tuple[list[changelog.Out], list[Write]]] = []
    records: list[changelog.Out] = []
    writes: list[Write] = []
    size = 0
    for group_records, group_writes in entries:
        for key, value in group_records:
            cost = len(key) + len(value) + RECORD_OVERHEAD
            if records and size + cost > limit:
                batches.append((records, writes))
                records, writes, size = [], [], 0
            records.append((key, value))
            size += cost
        writes += group_writes
    if records:
        batches.append((records, writes))
    return batches


class LocalBackend(FaustBackend):
    """The state table over a local store (rocksdb://): the store holds only what the changelog
    holds, up to the persisted offset it records.

    A restarted worker recovers a partition by reading its changelog from the store's persisted
    offset on, so the store must never hold a write the changelog lacks: a worker killed between
    the two writes would come back with a state that no changelog reader (a memory:// worker,
    another owner) sees, and with a head record that counts events as applied whose outputs
    (flush requests, the journal's removal) were never sent; redelivery then skips them.

    So a write goes to the changelog first and sits in `_unconfirmed` (read from there, as a
    memory store would read it) until the broker acknowledges it; only then is it put in the
    partition's store, in one RocksDB write batch with its offset as the persisted offset. A
    SIGKILL at any point leaves the store at an acknowledged prefix of the changelog (acks come
    in offset order per partition), and recovery reads the rest. A write the broker refuses stays
    unconfirmed (the worker reads it, as with memory://; its records are read again after a
    restart, OrderedAcks). A write acknowledged after its partition was revoked is left out of
    the store: the next assignment recovers it from the changelog.

    Reads and writes name the partition (each partition is its own RocksDB): Faust's store
    methods pick the partition of the event being processed, which in a batch of several
    partitions (and in the commit task) is not the key's (faust_compat.partition_dbs).
    """

    #: Where each partition's store keeps the highest fence epoch it holds (kafka/fence.py).
    FENCE_KEY = b"__sf_fence__"

    def __init__(self, table: StateTable, fence: Fence | None = None) -> None:
        super().__init__(table, direct=True, fence=fence)
        self._unconfirmed: dict[str, tuple[int, bytes | None]] = {}
        self._serial = 0
        self._forgotten = 0  # the last serial sent before the store was emptied
        self.fence.load = self._kept_fence
        table.on_applied = self._keep_recovered

    def get(self, key: str) -> bytes | None:
        """The value at `key` (an unacknowledged write's, else the store's), or None."""
        held = self._unconfirmed.get(key)
        if held is not None:
            return held[1]
        raw = key.encode()
        for db in list(faust_compat.partition_dbs(self.table.data).values()):
            value = db.get(raw)
            if value is not None:
                return bytes(value)
        return None

    def keys(self) -> Any:
        """Every key held: the store's on active partitions, with the unacknowledged writes."""
        found = {k.decode() if isinstance(k, bytes) else k for k in self.table}
        found.discard(self.FENCE_KEY.decode())
        for k, (_serial, value) in self._unconfirmed.items():
            if value is None:
                found.discard(k)
            else:
                found.add(k)
        return found

    @property
    def unconfirmed(self) -> int:
        """Writes sent to the changelog and not acknowledged yet."""
        return len(self._unconfirmed)

    def forget(self, generation: int = 0) -> None:
        """Empty every open partition's store, its persisted offset included, so recovery reads
        the changelog from the start; writes sent before, and writes of batches read before
        `generation`, are kept out of it when acknowledged."""
        for db in list(faust_compat.partition_dbs(self.table.data).values()):
            batch = rocksdict.WriteBatch(raw_mode=True)
            batch.delete_range(b"", b"\xff")  # every key: UTF-8 never starts with 0xff
            db.write(batch)
        self._unconfirmed.clear()
        self._forgotten = self._serial
        self.writer.forget()
        self.fence.forget()
        self._stale_below = generation

    def recovered(self, rows: list[tuple[str, bytes | None, int]]) -> None:
        """Rows a recovery applied: each session whose position it read is asked again."""
        for key, _value, partition in rows:
            if key.endswith(f"/rt/c/{partition}"):
                self.writer.forget(changelog.owner_of(key), partition)

    def _queued(
        self,
        writes: Sequence[Write],
        records: int,
        sent: asyncio.Future[Any],
        epoch: int,
        stale: bool,
        partition: int,
    ) -> None:
        """`writes` are in the producer's queue (in `records` records): read from
        `_unconfirmed` until acknowledged, then into the store (`_confirmed`); `stale` ones
        (`forget`) never."""
        if stale:
            return
        serials = []
        for key, value in writes:
            self._serial += 1
            self._unconfirmed[key] = (self._serial, value)
            serials.append(self._serial)
        sent.add_done_callback(lambda done: self._confirmed(writes, serials, records, epoch, done))

    def _rows(self, owner: str, partition: int) -> list[tuple[str, bytes]]:
        """A session's rows: its partition's store read from the session's prefix on, with the
        unacknowledged writes over them."""
        prefix = f"{owner}/"
        rows: dict[str, bytes | None] = {}
        db = faust_compat.partition_dbs(self.table.data).get(partition)
        if db is not None:
            raw = prefix.encode()
            for key, value in db.items(from_key=raw):
                if not bytes(key).startswith(raw):
                    break
                rows[bytes(key).decode()] = bytes(value)
        for key, (_serial, value) in self._unconfirmed.items():
            if key.startswith(prefix):
                rows[key] = value
        return [(k, v) for k, v in rows.items() if v is not None]

    def _confirmed(
        self,
        writes: Sequence[Write],
        serials: Sequence[int],
        records: int,
        epoch: int,
        sent: asyncio.Future[Any],
    ) -> None:
        """`writes` (one record, or one record batch of `records` from its first offset) are
        in: into the store, with their last offset as the persisted offset, in one RocksDB
        write."""
        if not serials or serials[-1] <= self._forgotten:
            return
        if sent.cancelled() or sent.exception() is not None:
            return
        metadata = sent.result()
        store = self.table.data
        db = faust_compat.partition_dbs(store).get(metadata.topic_partition.partition)
        if db is not None:
            batch = rocksdict.WriteBatch(raw_mode=True)
            for key, value in writes:
                if value is None:
                    batch.delete(key.encode())
                else:
                    batch.put(key.encode(), value)
            partition = metadata.topic_partition.partition
            self.fence.kept(partition, epoch)
            self._put_position(batch, partition, metadata.offset + records - 1)
            db.write(batch)
        for (key, _value), serial in zip(writes, serials, strict=True):
            held = self._unconfirmed.get(key)
            if held is not None and held[0] == serial:
                del self._unconfirmed[key]

    def _kept_fence(self, partition: int) -> int | None:
        """The highest fence epoch `partition`'s store keeps, or None."""
        db = faust_compat.partition_dbs(self.table.data).get(partition)
        raw = None if db is None else db.get(self.FENCE_KEY)
        return None if raw is None else decode_epoch(bytes(raw))

    def _put_position(self, batch: rocksdict.WriteBatch, partition: int, offset: int) -> None:
        """Put, in `batch`, the partition's persisted offset and the highest fence epoch it
        holds: the two are written with the data, never apart."""
        newest = self.fence.newest(partition)
        batch.put(faust_compat.persisted_offset_key(self.table.data), str(offset).encode())
        batch.put(self.FENCE_KEY, encode_epoch(0 if newest is None else newest.epoch))

    def _keep_recovered(self, offsets: dict[int, int]) -> None:
        """After a recovered batch: each partition's store keeps the highest epoch read, and the
        last offset read as its persisted offset (Faust's is the last the fence took: the
        records it kept out would be read again, with the fence afresh)."""
        for partition, offset in offsets.items():
            db = faust_compat.partition_dbs(self.table.data).get(partition)
            if db is not None:
                batch = rocksdict.WriteBatch(raw_mode=True)
                self._put_position(batch, partition, offset)
                db.write(batch)


#: How long a re-read may take before the consumer is sent back again.
RETRY_SEEK_S = 2.0

#: How long `ContiguousOffsets` waits for the broker to say where a partition starts.
START_LOOKUP_S = 10.0


class ContiguousOffsets:
    """Lets each partition's records through in offset order, with none left out.

    faust-streaming 0.15 can drop records it has fetched: around a rebalance or the end of a
    recovery its `getmany` abandons the rest of a batch (flow stopped, generation changed) or
    skips a partition it does not count as active yet, and the consumer's position has moved on.
    It then books the hole as a "gap" and treats it as processed, so the offsets get committed and
    the records are never read: a lost compaction leaves its session's barrier up forever, a lost
    session event a wrong state. Our topics have no real gaps (no compaction, no transactions
    under at-least-once), so a jump means a loss: the record after the hole is refused (not
    acked), the consumer is sent back to the first missing offset, and Faust's gap booking is
    turned off so nothing past the hole is committed before it is read. Records Faust had already
    buffered still arrive after the seek and move its read offset past the hole, so it drops the
    re-read ones: `retry` (a timer) seeks again until the missing record arrives. A partition
    Faust holds no committed offset for (never committed, or at 0) is expected from where the
    group's reading of it starts, asked of the broker (`_start_of`).

    Under exactly_once, transaction markers leave real gaps: then every record is let through
    and Faust's gap booking is kept (`repair=False`).
    """

    def __init__(self, app: faust.App, repair: bool = True) -> None:
        self.app = app
        self.repair = repair
        self._patched = False
        self._generation: int | None = None
        self._next: dict[Any, int] = {}
        self._rewound: dict[Any, tuple[int, float]] = {}
        #: Per partition without an offset in Faust's books, where the group's reading starts.
        self._start: dict[Any, int] = {}

    async def admit(self, message: Any) -> bool:
        """Whether to process `message` now (False: an earlier record is missing)."""
        if not self.repair:
            return True
        consumer = self.app.consumer
        if not self._patched:
            faust_compat.disable_gap_booking(consumer)
            self._patched = True
        generation = self.app.consumer_generation_id
        if generation != self._generation:
            # A rebalance: Faust re-reads every partition from its committed offset.
            self._generation = generation
            self._next.clear()
            self._rewound.clear()
            self._start.clear()
        tp, offset = message.tp, message.offset
        expected = self._next.get(tp)
        if expected is None:
            expected = faust_compat.committed_offset(consumer, tp)
        if expected is None:
            expected = await self._start_of(tp)
        if expected is not None and offset > expected:
            rewound = self._rewound.get(tp)
            if rewound is None or rewound[0] != expected:
                log.warning(
                    "consumer skipped records; reading them again",
                    extra={"topic": tp.topic, "partition": tp.partition, "offset": expected},
                )
                await self._seek(tp, expected)
            self._release(message)
            return False
        self._rewound.pop(tp, None)
        self._next[tp] = offset + 1
        return True

    async def _start_of(self, tp: Any) -> int | None:
        """Where the group reads `tp` from when Faust books no committed offset for it (never
        committed, committed at 0, or not yet read back after a rebalance); None if the broker
        cannot tell (the record is let through, as before).

        Faust drops records it fetched as a recovery ends, and seeks back only the partitions it
        holds a committed offset for (faust_compat.start_offset): without this, the first record
        after such a hole passed for the partition's first, and its commit covered the hole (a
        frozen-worker run lost a session's first 85 events: the worker frozen first had never
        committed that partition).
        """
        start = self._start.get(tp)
        if start is None:
            generation = self._generation
            try:
                start = await asyncio.wait_for(
                    faust_compat.start_offset(self.app.consumer, tp), START_LOOKUP_S
                )
            except Exception as exc:  # revoked meanwhile, or the broker did not answer
                log.warning(
                    "could not read where a partition starts",
                    extra={"partition": tp.partition, "error": type(exc).__name__},
                )
                return None
            if self.app.consumer_generation_id != generation:
                return None  # a rebalance meanwhile: the record is from the generation before
            self._start[tp] = start
        return start

    def reread(self, events: list[Any]) -> None:
        """Treat these records (delivered, never acknowledged) as missing: they are read again,
        and they leave Faust's unacked set (`_release`)."""
        for event in events:
            self._release(event.message)
            tp, offset = event.message.tp, event.message.offset
            if tp in self._next:
                self._next[tp] = min(self._next[tp], offset)

    def _release(self, message: Any) -> None:
        """Take a record nobody will ack out of Faust's unacked set (it is read again later).

        A revocation waits for that set to empty (`wait_empty`); a refused or given-back record
        left in it would hold the rebalance for ever. It stays unacked, so no commit passes it.
        """
        faust_compat.forget_unacked(self.app.consumer, message)

    async def retry(self) -> None:
        """Seek again for every partition whose missing record has not come for 2 s."""
        if self._generation != self.app.consumer_generation_id:
            return  # a rebalance re-reads from the committed offsets anyway
        now = time.monotonic()
        for tp, (expected, since) in list(self._rewound.items()):
            if now - since >= RETRY_SEEK_S:
                await self._seek(tp, expected)

    async def _seek(self, tp: Any, offset: int) -> None:
        self._rewound[tp] = (offset, time.monotonic())
        try:
            await self.app.consumer.seek(tp, offset)
        except Exception as exc:  # revoked meanwhile: the rebalance re-reads it
            log.warning(
                "seek failed", extra={"partition": tp.partition, "error": type(exc).__name__}
            )


async def shorten_fetch_wait(app: faust.App, seconds: float, timeout_s: float = 60.0) -> None:
    """Let a fetch wait at most `seconds` at the broker for records (Faust fixes 1.5 s).

    aiokafka sends one fetch at a time to a broker, for the partitions of which it holds no
    unread records, and the broker holds it until one of those has a record or the wait is
    over. The partitions left out meanwhile are fetched only after it: a compaction that
    arrives for one of them waits up to the whole 1.5 s, and so do the session's held events,
    while the fold sits idle. Faust builds its consumer with `fetch_max_wait_ms=1500` and no
    setting, so this sets aiokafka's fetcher attribute once it exists
    (faust_compat.set_fetch_max_wait). Should it never appear, the worker logs it and keeps
    Faust's wait.
    """
    milliseconds = int(seconds * 1000)
    if await _once_built(lambda: faust_compat.set_fetch_max_wait(app, milliseconds), timeout_s):
        log.info("fetch wait shortened", extra={"ms": milliseconds})
        return
    log.warning("could not shorten the consumer's fetch wait; Faust's 1.5 s is kept")


async def commit_only_as_member(app: faust.App, timeout_s: float = 60.0) -> None:
    """Keep the consumer from committing while its group has dropped it (a worker back from a
    stall), once the consumer exists (faust_compat.commit_only_as_member). Should it never
    appear, the worker logs it."""
    if await _once_built(lambda: faust_compat.commit_only_as_member(app), timeout_s):
        log.info("commits only as a group member")
        return
    log.warning("could not keep a dropped consumer from committing")


async def _once_built(set_up: Callable[[], bool], timeout_s: float) -> bool:
    """Try `set_up` every 0.1 s until it succeeds (Faust's consumer thread has built aiokafka's
    consumer) or `timeout_s` has passed; whether it did."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if set_up():
            return True
        await asyncio.sleep(0.1)
    return False


class OrderedAcks:
    """Acknowledges an agent's records to Faust once everything they wrote and sent is
    acknowledged by the broker, and never before a record the agent read earlier.

    Until a record is acknowledged its offset is not committed: after a crash it is delivered
    again. The order matters as much: Faust commits a partition up to the end of the first
    unbroken run of acknowledged offsets, whatever lies unacknowledged below that run (its gap
    booking, which we turn off, is what normally fills such holes). Records acknowledged out of
    order (a later one whose writes the broker confirmed first, say one without outputs while
    the one before waits for its flush request) would let a commit pass the earlier record,
    and a crash then lose it. A write the broker refuses stops the chain: nothing later is
    acknowledged, and the records are read again after a restart.

    Records whose turn comes when their consumer generation can no longer vouch for their
    writes (`clear(generation)` false, StallGuard.clear: a stall not yet over its grace, a
    rebalance begun, or another generation) go to `on_stale` instead, to be read again. Such
    writes may have reached the changelog after another worker's, and the fence leaves them
    out of recoveries, while an ack would still let a commit pass the records: Faust counts
    the ack of a record read before a rebalance, and a worker dropped from the group during a
    stall commits with no generation, which the broker takes whenever the group is empty (a
    frozen-worker run lost a session's last 12 events so, both workers having frozen in turn).
    """

    def __init__(
        self,
        clear: Callable[[int], Awaitable[bool]] | None = None,
        on_stale: Callable[[list[Any]], None] = lambda _events: None,
    ) -> None:
        self.clear = clear
        self.on_stale = on_stale
        self._tail: asyncio.Future[None] | None = None

    def add(self, events: Any, durable: Any, generation: int | None = None) -> None:
        """Acknowledge `events` (one or a list, read in `generation`) once `durable` resolves
        and those before are."""
        batch = events if isinstance(events, list) else [events]
        previous = self._tail
        self._tail = asyncio.ensure_future(self._ack_in_turn(batch, durable, previous, generation))
        self._tail.add_done_callback(_report_refused)

    async def _ack_in_turn(
        self, events: list[Any], durable: Any, previous: Any, generation: int | None
    ) -> None:
        await durable
        if previous is not None:
            try:
                await previous
            except Exception:
                raise _ChainStopped from None
        if generation is not None and self.clear is not None and not await self.clear(generation):
            log.warning(
                "records confirmed after a stall or a rebalance are read again",
                extra={"records": len(events)},
            )
            self.on_stale(events)
            return
        for event in events:
            event.ack()


class _ChainStopped(Exception):
    """An earlier record's write was refused: this one waits for a restart too."""


def _report_refused(future: asyncio.Future[None]) -> None:
    if future.cancelled():
        return
    error = future.exception()
    if error is not None and not isinstance(error, _ChainStopped):
        log.error(
            "a write was not acknowledged; these records and later ones are not acked",
            extra={"error": type(error).__name__},
        )


class StallGuard:
    """Keeps a worker that may have been dropped from its group from writing what it folded.

    A process that stalls past its session timeout (SIGSTOP, a fold step holding the GIL) sends
    no heartbeat: the group drops it and gives its partitions to another worker, which rebuilds
    their state from the changelog and folds on. Resumed, the stalled worker still holds the
    batch it was folding and the records it had fetched, and learns that it was dropped only at
    its next heartbeat. Committing that batch then writes an older state of its sessions after
    the new owner's: the changelog's last value wins at the next recovery, so a session the new
    owner had already answered goes back to waiting on a request whose answers were consumed
    (stuck for good, restarts included), or to an older sequence number.

    So a watchdog ticks on the event loop, and a gap between two ticks longer than `lease_s`
    (less than the session timeout by two heartbeats: a shorter stall cannot cost the
    membership) is a stall. A batch is committed only when no stall happened within the last
    `grace_s` (long enough for the first heartbeat after it to answer), and then only if no
    rebalance began since the batch's first record was read (Faust sets `app.rebalancing` as
    soon as the revocation starts, from its consumer thread). Otherwise the batch is abandoned.
    The same check comes before a committed batch's journals are deleted, once its outputs are
    acknowledged (FoldRuntime.lease): a journal left is replayed, harmlessly.
    """

    def __init__(
        self,
        app: Any,
        lease_s: float,
        grace_s: float,
        tick_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.lease_s = lease_s
        self.grace_s = grace_s
        self.tick_s = tick_s
        self.clock = clock
        self._last = clock()
        self._stalled_at = float("-inf")

    @classmethod
    def for_settings(cls, app: Any, settings: WorkerSettings) -> StallGuard:
        """The guard for a worker's session timeout and heartbeat interval."""
        beat, timeout = settings.heartbeat_interval_s, settings.session_timeout_s
        return cls(app, max(timeout - 2 * beat, timeout / 2), 2 * beat + 1.0)

    async def watch(self) -> None:
        """Tick until cancelled (an app task)."""
        # The time from building the app to its tasks starting (recovery, joining the group)
        # is no stall: the watch starts the clock.
        self._last = self.clock()
        while True:
            await asyncio.sleep(self.tick_s)
            self.tick()

    def tick(self) -> None:
        """One watchdog tick: a long gap since the last is a stall."""
        now = self.clock()
        if now - self._last > self.lease_s:
            self._stalled_at = now
            log.warning("event loop stalled", extra={"seconds": round(now - self._last, 1)})
        self._last = now

    def generation(self) -> int:
        """The consumer generation now."""
        return int(self.app.consumer_generation_id)

    def stalled(self) -> bool:
        """Whether a stall is going on (no tick for `lease_s`) or ended within `grace_s`."""
        now = self.clock()
        return now - self._last > self.lease_s or now - self._stalled_at < self.grace_s

    async def clear(self, generation: int) -> bool:
        """Whether a batch read in `generation` may be committed (after any stall's grace)."""
        while self.stalled():
            await asyncio.sleep(self.tick_s)
        return not self.app.rebalancing and self.generation() == generation


class FoldBatcher:
    """The fold agent's batches: records folded back to back, committed and acked together.

    Faust hands the agent one record at a time, about as fast as it folds them, so its queue
    rarely holds a second record: whether one is waiting says nothing. Instead a batch lingers:
    it is committed when it is full, or when no record followed the last one within `linger_s`
    (the drain of a fetched batch delivers records far faster than that; a quiet stream, a
    rebalance pause or a record Faust drops ends the batch after `linger_s`). The commit runs
    while the agent waits for the next record, never while it folds one: `before` (at the top
    of each iteration) awaits it, so records are folded and committed in order. The commit ends
    once the batch is handed to the producer (FoldRuntime.commit); the broker's acknowledgements
    come while the next batch is folded, and `OrderedAcks` acks the records then. No batch waits
    longer than `linger_s` for records: Faust waits for every fetched record to be acked before
    it hands a partition over (`stream_wait_empty`).
    """

    def __init__(
        self,
        runtime: FoldRuntime,
        limit: int,
        linger_s: float,
        on_abandon: Callable[[list[Any]], None] = lambda _events: None,
        guard: StallGuard | None = None,
        on_stale: Callable[[list[Any]], None] = lambda _events: None,
    ) -> None:
        self.runtime = runtime
        self.limit = limit
        self.linger_s = linger_s
        self.on_abandon = on_abandon
        self.guard = guard
        # Acks of a batch confirmed after a stall or a rebalance are given up (OrderedAcks).
        self.acks = OrderedAcks(None if guard is None else guard.clear, on_stale)
        self.abandoned = 0  # batches the guard kept from being committed
        self._generation = 0  # the consumer generation the open batch was read in
        self._events: list[Any] = []
        self._committing: list[Any] = []  # the batch being committed, until its acks are queued
        self._task: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    async def before(self) -> None:
        """Wait for the batch being committed (its error, if any, is raised here)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            task, self._task = self._task, None
            await task

    async def add(self, event: Any) -> None:
        """Fold one record into the batch."""
        if not self._events and self.guard is not None:
            self._generation = self.guard.generation()
        await self.runtime.fold(_record(event.message))
        self._events.append(event)

    def after(self) -> None:
        """Commit now if the batch is full, else once `linger_s` passes without a record."""
        if not self._events:
            return
        if len(self._events) >= self.limit or self.runtime.batch_full or self.linger_s <= 0:
            self._commit()
        else:
            self._timer = asyncio.get_running_loop().call_later(self.linger_s, self._commit)

    def close(self) -> None:
        """The agent stops (or its commit failed): what is not committed is abandoned.

        The open batch's writes are dropped and its records handed to `on_abandon`, which makes
        the consumer read them again: Faust would otherwise commit past them once a later record
        is acknowledged, as if they had been processed.
        """
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        abandoned, self._committing, self._events = self._committing + self._events, [], []
        self.runtime.discard()
        if abandoned:
            self.on_abandon(abandoned)

    def _commit(self) -> None:
        self._timer = None
        if self._task is None and self._events:
            self._committing, self._events = self._events, []
            self._task = asyncio.ensure_future(self._commit_events(self._committing))

    async def _commit_events(self, events: list[Any]) -> None:
        if self.guard is not None and not await self.guard.clear(self._generation):
            # Its partitions may be another worker's by now: nothing of it is written, and
            # the records are read again by whoever owns them after the rebalance.
            log.warning(
                "batch abandoned after a stall or a rebalance", extra={"records": len(events)}
            )
            self.abandoned += 1
            self._committing = []
            self.runtime.discard()
            self.on_abandon(events)
            return
        self.acks.add(events, await self.runtime.commit(), self._generation)
        self._committing = []


class Stopwatch:
    """Time split into laps, each added to the counter child of the kind it is: where the fold
    agent's time goes (awaiting records, awaiting its commit, folding), for operators and the
    bench to tell what a worker that is not busy waits for."""

    KINDS = ("awaiting_records", "awaiting_commit", "folding")

    def __init__(self, counter: Counter, clock: Callable[[], float] = time.perf_counter) -> None:
        self._children = {kind: counter.labels(kind=kind) for kind in self.KINDS}
        self._clock = clock
        self._last = clock()

    def lap(self, kind: str) -> None:
        """Add the seconds since the last lap (or the start) to `kind`."""
        now = self._clock()
        self._children[kind].inc(now - self._last)
        self._last = now


def _add_fold(
    app: faust.App,
    settings: WorkerSettings,
    topics: Topics,
    send: Sender,
    metrics: Metrics,
    offsets: ContiguousOffsets,
    step_hook: Callable[[SourceRecord], None] | None = None,
    diff_model: DiffModel | None = None,
) -> SessionTracker:
    options = {"driver": "rocksdict"} if settings.local_store else None
    table = app.tables.add(
        StateTable(
            app,
            name="state",
            beacon=app.tables.beacon,
            key_type=str,
            value_type=bytes,
            partitions=settings.partitions,
            extra_topic_configs={"max.message.bytes": str(MAX_RECORD_BYTES)},
            options=options,
            help="Fold state: sid/... keys, orjson values (one changelog record per write).",
        )
    )
    table.on_recovered_records = metrics.records_recovered.inc
    table.fence = Fence()
    table.on_fenced_records = metrics.records_fenced.inc
    backend: FaustBackend
    if settings.local_store:
        backend = LocalBackend(table, table.fence)
    else:
        at_least_once = settings.processing_guarantee == "at_least_once"
        backend = FaustBackend(table, direct=at_least_once, fence=table.fence)
    table.on_rejoined = backend.forget
    table.on_rows = backend.recovered
    fault_injection.tune_changelog(backend.writer)  # tests only: off unless its variable is set
    tracker = SessionTracker(backend, settings.prune, settings.partitions)
    runtime = FoldRuntime(
        backend,
        send,
        topics,
        settings.prune,
        metrics,
        tracker,
        journal=settings.processing_guarantee == "at_least_once",
        ledger=settings.ledger_config,
    )
    runtime.step_hook = step_hook
    inputs = _topic(app, topics.session_events, topics.compaction_events)
    guard = StallGuard.for_settings(app, settings)
    runtime.lease = guard
    app.task(guard.watch)

    async def fold(stream: faust.StreamT[bytes]) -> None:
        """Fold session events and compactions into the state table, in batches."""
        records = stream.noack()
        batcher = FoldBatcher(
            runtime,
            settings.batch_records,
            settings.batch_linger_s,
            offsets.reread,
            guard,
            on_stale=offsets.reread,
        )
        watch = Stopwatch(metrics.fold_agent_seconds)
        try:
            async for event in records.events():
                watch.lap("awaiting_records")
                await batcher.before()
                watch.lap("awaiting_commit")
                if await offsets.admit(event.message):
                    await batcher.add(event)
                batcher.after()
                watch.lap("folding")
        finally:
            batcher.close()

    async def count_dead_letters(stream: faust.StreamT[bytes]) -> None:
        """Count each session's dead letters into the state table."""
        acks = OrderedAcks(guard.clear, offsets.reread)
        async for event in stream.noack().events():
            if await offsets.admit(event.message):
                generation = guard.generation()
                record = _record(event.message)
                acks.add(event, await runtime.handle_dead_letter(record), generation)

    async def on_recovered() -> None:
        tracker.rebuild()
        # After every recovery (a start, any assignment): a session whose recovered state waits
        # on an answer already consumed is freed by asking again (agents.py, keep_requests).
        await runtime.resend_outstanding(settings.partitions, _active(app, topics))

    app.agent(inputs, name="fold", concurrency=1)(fold)
    app.agent(_topic(app, topics.dead_letters), name="dead-letters", concurrency=1)(
        count_dead_letters
    )
    table.on_recover(on_recovered)
    local_plans = state_api.register(
        app,
        table,
        backend,
        settings.prune,
        topics,
        settings.bootstrap,
        settings.ledger_config,
        settings.security,
        live=_live(settings, topics, backend, diff_model or OfflineModel(), metrics),
    )
    _add_gateway(app, settings, metrics.registry, local_plans)
    return tracker


def _live(
    settings: WorkerSettings,
    topics: Topics,
    backend: FaustBackend,
    diff_model: DiffModel,
    metrics: Metrics,
) -> WorkerLive:
    """The live routes over the fold's table and session-events (web/live_worker.py)."""
    reader = KeyReader(settings.bootstrap, topics.session_events, settings.security)
    logs = live_worker.SessionLogs(reader, settings.partitions, settings.live_sessions)
    config, ledger = settings.prune, settings.ledger_config
    calls = LiveMetrics.create(metrics.registry)
    return WorkerLive(backend, logs, config, ledger, diff_model, settings.live_wait_s, calls)


def _add_summarizer(
    app: faust.App,
    topics: Topics,
    runtime: SummarizeRuntime,
    offsets: ContiguousOffsets,
    threads: int,
) -> None:
    async def summarize(stream: faust.StreamT[bytes]) -> None:
        """Answer flush requests with compaction events."""
        acks = OrderedAcks()
        if threads <= 1:
            async for event in stream.noack().events():
                if await offsets.admit(event.message):
                    acks.add(event, await runtime.handle(_record(event.message)))
            return
        # Up to `threads` answers out at once, one per session; still acked in offset order.
        pool: AnswerPool[Any] = AnswerPool(threads, offsets.reread)
        async for event in stream.noack().events():
            if await offsets.admit(event.message):
                record = _record(event.message)
                answer = partial(runtime.answered, record)
                acks.add(event, await pool.submit(record.key, event, answer))

    app.agent(_topic(app, topics.flush_requests), name="summarize", concurrency=1)(summarize)


def _topic(app: faust.App, *names: str) -> faust.TopicT:
    return app.topic(
        *names,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
    )


def _sender(app: faust.App, topics: Topics) -> Sender:
    by_name = {name: _topic(app, name) for name in topics.all()}

    async def send(output: Output) -> Any:
        return await by_name[output.topic].send(key=output.key, value=output.value)

    return send


def _record(message: Any) -> SourceRecord:
    return SourceRecord(
        message.topic, message.partition, message.offset, message.key, message.value
    )


def _add_gateway(
    app: faust.App,
    settings: WorkerSettings,
    registry: CollectorRegistry,
    local: state_api.LocalPlans | None,
) -> None:
    """The gateway's routes on a fold worker's web port (web/gateway.py): each session's plan
    comes from its owner, in process when that is this worker (`local`), else through the
    state API's plan route (asked on this worker's own web server, which proxies it to the
    owner), and is cached between changes (web/plan_cache.py)."""
    route = PlanRoute(str(app.conf.canonical_url), settings.token)
    gateway = Gateway(
        dict(settings.upstreams),
        settings.token,
        registry,
        plans=PlanCache(route if local is None else local_first(local, route), registry),
        policy=CachePolicy(settings.min_freed_tokens, settings.cache_ttl_s),
    )

    def add_routes(web: Any) -> None:
        # Faust calls this as its web server starts, before the aiohttp app is frozen.
        gateway.add_routes(web.web_app)
        web.web_app.on_cleanup.append(route.close)

    app.on_webserver_init = add_routes  # type: ignore[method-assign]


def _add_metrics_page(app: faust.App, metrics: Metrics) -> None:
    class PrometheusMetrics(View):
        async def get(self, request: Request) -> Response:
            body = generate_latest(metrics.registry)
            return self.bytes(body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.page("/metrics", name="metrics")(PrometheusMetrics)


def _add_health_page(app: faust.App) -> None:
    class Health(View):
        async def get(self, request: Request) -> Response:
            return self.json({"status": "ok"})

    app.page("/health", name="health")(Health)


def _active(app: faust.App, topics: Topics) -> set[int]:
    """Partitions of session-events this worker owns now."""
    try:
        assigned = app.assignor.assigned_actives()
    except Exception:  # not assigned yet
        return set()
    return {tp.partition for tp in assigned if tp.topic == topics.session_events}


def _roles_by_topic(settings: WorkerSettings, topics: Topics) -> dict[str, str]:
    roles: dict[str, str] = {}
    if settings.folds:
        for name in (topics.session_events, topics.compaction_events, topics.dead_letters):
            roles[name] = "fold"
    if settings.summarizes:
        roles[topics.flush_requests] = "summarize"
    return roles


def consumer_lag(app: faust.App, roles: Mapping[str, str]) -> dict[str, int]:
    """Unread records on the worker's assigned input partitions, by role.

    Lag is the partition's high-water mark minus the next offset this worker will read (the last
    one it read, else the last it committed); a partition it has neither read nor committed since
    it started is left out.
    """
    lag = dict.fromkeys(set(roles.values()), 0)
    try:
        assignment = app.consumer.assignment()
    except Exception:  # not started
        return lag
    monitor = app.monitor
    for tp in assignment:
        role = roles.get(tp.topic)
        if role is None:
            continue
        highwater = _highwater(app, tp)
        read = monitor.tp_read_offsets.get(tp)
        position = read + 1 if read is not None else monitor.tp_committed_offsets.get(tp)
        if highwater is None or position is None:
            continue
        lag[role] += max(0, highwater - position)
    return lag


def _highwater(app: faust.App, tp: Any) -> int | None:
    try:
        return app.consumer.highwater(tp)
    except Exception:  # no fetch for it yet
        return None


__all__ = [
    "MAX_RECORD_BYTES",
    "WorkerSettings",
    "consumer_lag",
    "faust_options",
    "make_app",
]
