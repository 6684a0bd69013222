"""What the Kafka runtime's agents do with one record: the steps, the runtimes, the gauges.

Three agents, each a loop over its records:
- fold (session-events and compaction-events): `fold_record` decodes the envelope and runs the
  pruning folds and the rule ledger (`step.fold_step`) over a `WriteSet`; `FoldRuntime` folds
  records that arrive back to back into one `Batch` and commits the batch's writes (each key
  once, a session's writes as one group that lands whole) and its outputs (flush requests,
  ledger pass requests, flush-metrics) kept in a journal until the broker has them
  (kafka/table_store.py), so a crash at any point is repaired by redelivery; it also records
  where each toolResult entry sits in the log, and keeps each outstanding request as sent
  (`keep_requests`), which a recovered worker sends again while its session still waits on it
  (`FoldRuntime.resend_outstanding`).
- dead-letter count (dead-letters): `count_dead_letter` keeps each session's count, once per
  record, for the state API (the embedded runtime counts the same dead letters).
- summarize (flush-requests): `SummarizeRuntime` answers a request in a thread (a real model
  takes seconds; the event loop must keep heart-beating; several at once with
  `--answer-threads`, answers.py) and sends the compaction: a pruning
  flush through the model port, a ledger pass through the diff model, with the embedded
  runtime's answerer and failure policy (runtime/step.py), so both runtimes answer alike. An
  answer it cannot send (over the topics' record size, or refused by the producer) is replaced
  by the step's small error answer, so no record it makes can stop it or leave a barrier up.
Records that cannot be read go to the dead-letter topic with a reason; logs carry ids, offsets
and reason codes, never message text or tool output.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from pydantic import ValidationError

from sessionfold.events.envelope import (
    SESSION_EVENT_KINDS,
    CompactionEnvelope,
    EntryEnvelope,
    Envelope,
    EnvelopeError,
    FlushMetricsEnvelope,
    FlushRequestEnvelope,
    Kind,
    LedgerRequestEnvelope,
    PruningCompactionEnvelope,
    SchemaVersionError,
    decode,
    encode,
    from_dict,
)
from sessionfold.events.flush import read_compaction, read_request
from sessionfold.events.ledger import read_ledger_request
from sessionfold.projections.ledger.config import DEFAULT_LEDGER, LedgerConfig
from sessionfold.projections.ledger.state import load_head as load_ledger_head
from sessionfold.projections.pruning import context_metrics, digest, windows
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.config import PruneConfig
from sessionfold.projections.store import Store
from sessionfold.streams.kafka.limits import MAX_MESSAGE_BYTES, refused_for_size
from sessionfold.streams.kafka.table_store import (
    DELETED,
    Backend,
    Journal,
    Output,
    Pending,
    TableStore,
    Write,
    WriteSet,
    dead_letter_key,
    journal_key,
    key_writes,
    offset_key,
    read_view,
    request_key,
    start_key,
)
from sessionfold.streams.kafka.topics import Topics, partition_of
from sessionfold.streams.runtime.step import Answer, Answerer, error_answer, fold_step, topic_of
from sessionfold.streams.worker.prometheus import FleetSnapshot, Metrics

log = logging.getLogger(__name__)

#: Sends one record; the awaitable it returns resolves once the broker acknowledged it.
Sender = Callable[[Output], Awaitable[Awaitable[Any]]]


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """The parts of a consumed Kafka record a step needs."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Fault:
    """Why a record was dead-lettered: a short code (the metric `kind`) and a content-free note."""

    reason: str
    error: str


@dataclass(slots=True)
class FoldResult:
    """What folding one record did."""

    kind: str | None = None
    fresh: bool = False  # a session event above the session's last sequence number
    missing: int = 0  # sequence numbers between the session's last and this event's
    compaction: str | None = None  # applied, ignored, ledger, unreadable
    outputs: list[Any] = field(default_factory=list)
    fault: Fault | None = None


# --- the steps (no I/O beyond the store they are handed) --------------------------------------


def read_envelope(record: SourceRecord) -> Any:
    """The record's envelope, or the Fault that sends it to the dead-letter topic."""
    if record.value is None:
        return Fault("undecodable", "record has no value")
    try:
        envelope = decode(record.value)
    except SchemaVersionError as exc:
        return Fault("newer-schema", f"envelope schema_version {exc.found} is newer than this one")
    except EnvelopeError as exc:
        return Fault("undecodable", str(exc))  # the message names the cause, never the content
    if record.key != envelope.session_id.encode():
        # The key decides the partition, and so which worker holds the session's state.
        return Fault("key-mismatch", "record key is not the envelope's session id")
    return envelope


def fold_record(
    store: Store,
    record: SourceRecord,
    config: PruneConfig,
    ledger: LedgerConfig | None = DEFAULT_LEDGER,
) -> FoldResult:
    """Fold one session-events or compaction-events record into `store`."""
    envelope = read_envelope(record)
    if isinstance(envelope, Fault):
        return FoldResult(fault=envelope)
    if isinstance(envelope, CompactionEnvelope):
        outcome = _compaction_outcome(store, envelope)
        outputs = fold_step(store, envelope, config, ledger)
        forget_answered(store, envelope.session_id)
        keep_requests(store, envelope.session_id, outputs)
        return FoldResult(kind="compaction", compaction=outcome, outputs=outputs)
    if envelope.kind not in SESSION_EVENT_KINDS:
        return FoldResult(fault=Fault("unexpected-kind", f"{envelope.kind.value} is not folded"))
    session_id = envelope.session_id
    # A World snapshot is unsequenced (it carries the seq it follows): the ledger decides.
    world = envelope.kind == Kind.WORLD
    last = pruning.load_head(store, session_id)["seq"]
    fresh = world or envelope.seq > last
    # The reader numbers a session's entries without holes (a dead letter keeps its number as a
    # placeholder): a jump is events this state never got, lost or past the topic's retention.
    missing = 0 if world or not fresh else envelope.seq - last - 1
    if fresh and last == 0 and store.get(start_key(session_id)) is None:
        # Where the session's records begin: the live routes read its entries back from here.
        store.put(start_key(session_id), {"p": record.partition, "o": record.offset})
    if fresh and _is_tool_result(envelope):
        # Where the original sits, so a ref can be read back (the index points at the seq).
        position = {"p": record.partition, "o": record.offset}
        store.put(offset_key(session_id, envelope.seq), position)
    outputs = fold_step(store, envelope, config, ledger)
    keep_requests(store, session_id, outputs)
    return FoldResult(kind=envelope.kind.value, fresh=fresh, missing=missing, outputs=outputs)


# --- outstanding requests, kept so a recovered worker can send them again ---------------------

#: The folds that raise requests, by the tag of the row their outstanding request is kept in.
PRUNING_FOLD, LEDGER_FOLD = "pr", "ledger"


def request_fold(envelope: FlushRequestEnvelope) -> str:
    """Which fold raised a request: the ledger (a pass) or pruning (a flush)."""
    return LEDGER_FOLD if isinstance(envelope, LedgerRequestEnvelope) else PRUNING_FOLD


def request_id_of(envelope: FlushRequestEnvelope) -> str | None:
    """The id a request's answer must name."""
    if isinstance(envelope, LedgerRequestEnvelope):
        return read_ledger_request(envelope).get("request")
    return getattr(envelope.payload, "request_id", None)


def awaited_request(store: Store, session_id: str, fold: str) -> str | None:
    """The id of the request the session's `fold` waits on (its barrier is up), or None."""
    if fold == PRUNING_FOLD:
        return pruning.load_head(store, session_id)["out"]
    head = load_ledger_head(store, session_id)
    return None if head is None else head.get("pending")


def keep_requests(store: Store, session_id: str, outputs: list[Any]) -> None:
    """Keep each request a step raised, as sent, in the session's runtime rows.

    It is written in the same batch (journal) as the state that waits on it, so whatever
    changelog state says a request is outstanding also holds the request: if that state comes
    back after its answer was consumed (an older value the changelog ends with), a recovered
    worker sends it again (`outstanding_requests`). One row per fold and session, overwritten
    by the fold's next request; Kafka only (the embedded runtime never loses an answer).
    """
    for envelope in outputs:
        if isinstance(envelope, FlushRequestEnvelope):
            kept = request_key(session_id, request_fold(envelope))
            store.put(kept, envelope.model_dump(mode="json"))


def forget_answered(store: Store, session_id: str) -> None:
    """Drop the kept request of each fold whose barrier an answer took down."""
    for fold in (PRUNING_FOLD, LEDGER_FOLD):
        kept = request_key(session_id, fold)
        if store.get(kept) is not None and awaited_request(store, session_id, fold) is None:
            store.delete(kept)


#: How a kept request's row key ends, by fold.
_KEPT_SUFFIXES = {fold: request_key("", fold) for fold in (PRUNING_FOLD, LEDGER_FOLD)}


def outstanding_requests(
    table: Backend, partitions: int, active: set[int]
) -> list[FlushRequestEnvelope]:
    """The kept requests of the sessions on `active` partitions whose folds still wait on them.

    Only keys are scanned (the recovery's session scan reads them all anyway); a value is read
    for each kept request, one per fold and session at most. A request whose answer was applied
    after all, or that another request replaced, is left out.
    """
    found: list[FlushRequestEnvelope] = []
    for table_key in list(table.keys()):
        for fold, suffix in _KEPT_SUFFIXES.items():
            if not table_key.endswith(suffix):
                continue
            session_id = table_key[: -len(suffix)]
            if partition_of(session_id, partitions) not in active:
                continue
            view = read_view(table, session_id)
            try:
                envelope = from_dict(view.get(table_key))
            except EnvelopeError:
                log.warning("kept request unreadable", extra={"session": session_id})
                continue
            awaited = awaited_request(view, session_id, fold)
            if isinstance(envelope, FlushRequestEnvelope) and awaited == request_id_of(envelope):
                found.append(envelope)
    return found


def _compaction_outcome(store: Store, envelope: CompactionEnvelope) -> str:
    if not isinstance(envelope, PruningCompactionEnvelope):
        return "ledger"
    try:
        payload = read_compaction(envelope)
    except ValidationError:
        return "unreadable"
    outstanding = pruning.load_head(store, envelope.session_id)["out"]
    return "applied" if payload.request_id == outstanding else "ignored"


def _is_tool_result(envelope: Envelope) -> bool:
    if not isinstance(envelope, EntryEnvelope):
        return False
    message = digest.message_of(envelope.payload.entry)
    return message is not None and message.get("role") == "toolResult"


def dead_letter_value(record: SourceRecord, fault: Fault) -> bytes:
    """The dead-letter topic's record for a record a worker could not use (the bytes included)."""
    value = record.value or b""
    return orjson.dumps(
        {
            "source": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "reason": fault.reason,
            "error": fault.error,
            "size": len(value),
            "session_id": _session_of(record.key),
            "raw_b64": base64.b64encode(value).decode("ascii"),
        }
    )


def count_dead_letter(store: Store, record: SourceRecord) -> bool:
    """Count one dead-letter record for its session; False when it was counted already.

    A redelivered record is recognised by its offset. A worker that crashed after
    dead-lettering a record and before committing dead-letters it again at a new offset; such a
    copy is recognised by the source offset it names.
    """
    session_id = _session_of(record.key)
    if session_id is None:
        return False
    row_key = dead_letter_key(session_id)
    row = store.get(row_key) or {"n": 0, "o": -1, "src": {}}
    if record.offset <= row["o"]:
        return False
    row["o"] = record.offset
    counted = True
    source = _source_of(record.value)
    if source is not None:
        topic, offset = source
        counted = offset > row["src"].get(topic, -1)
        row["src"][topic] = max(offset, row["src"].get(topic, -1))
    if counted:
        row["n"] += 1
    store.put(row_key, row)
    return counted


def _source_of(value: bytes | None) -> tuple[str, int] | None:
    """(topic, offset) a worker's own dead letter names; None for a publisher's."""
    try:
        body = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("offset"), int):
        return None
    return str(body.get("source")), body["offset"]


def read_request_record(record: SourceRecord) -> FlushRequestEnvelope | Fault:
    """A flush-requests record's envelope, or the Fault that dead-letters it."""
    envelope = read_envelope(record)
    if isinstance(envelope, Fault):
        return envelope
    if not isinstance(envelope, FlushRequestEnvelope):
        return Fault("unexpected-kind", f"{envelope.kind.value} is not a flush request")
    if isinstance(envelope, LedgerRequestEnvelope):
        request = read_ledger_request(envelope)
        if not all(isinstance(request.get(k), t) for k, t in _LEDGER_REQUEST_FIELDS.items()):
            return Fault("invalid-request", "ledger pass request lacks its ids")
        return envelope
    try:
        read_request(envelope)
    except ValidationError as exc:
        return Fault("invalid-request", f"{exc.error_count()} invalid fields")
    return envelope


#: What a ledger pass request must name for its answer (even a fallback) to be written.
_LEDGER_REQUEST_FIELDS = {"request": str, "session": str, "span": int, "seq": int}


def _session_of(key: bytes | None) -> str | None:
    return None if key is None else key.decode("utf-8", "replace")


# --- metrics ----------------------------------------------------------------------------------


def observe_fold(metrics: Metrics, result: FoldResult) -> None:
    """Count what one fold step did."""
    if result.fault is not None:
        metrics.dead_letters.labels(kind=result.fault.reason).inc()
        return
    if result.compaction is not None:
        metrics.compactions.labels(outcome=result.compaction).inc()
    elif result.kind is not None:
        counter = metrics.events_folded if result.fresh else metrics.events_duplicate
        counter.labels(kind=result.kind).inc()
        if result.missing:
            metrics.events_missing.inc(result.missing)
    for envelope in result.outputs:
        payload = envelope.payload
        if isinstance(envelope, FlushRequestEnvelope):
            metrics.flush_requests.labels(trigger=getattr(payload, "trigger", "unknown")).inc()
        elif isinstance(envelope, FlushMetricsEnvelope):
            metrics.flush_attempts.labels(
                trigger=getattr(payload, "trigger", "unknown"),
                outcome=getattr(payload, "outcome", "unknown"),
            ).inc()


def observe_answer(metrics: Metrics, compaction: Any, outcome: str, seconds: float) -> None:
    """Count one summarizer answer: duration, usage, batch outcomes."""
    metrics.summarizer_requests.labels(outcome=outcome).inc()
    metrics.summarizer_duration.observe(seconds)
    if not isinstance(compaction, PruningCompactionEnvelope):
        return  # a ledger pass: its calls and sizes go to its span record
    payload = read_compaction(compaction)
    metrics.summarizer_tokens.labels(kind="input").inc(payload.usage.input_tokens)
    metrics.summarizer_tokens.labels(kind="output").inc(payload.usage.output_tokens)
    metrics.summarizer_cost.inc(max(payload.usage.cost, 0.0))
    metrics.summarizer_model_calls.inc(payload.usage.calls)
    for result in payload.results:
        metrics.summarizer_batches.labels(outcome=result.outcome).inc()


# --- the runtimes -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """One session's share of the fleet gauges."""

    pending_batches: int
    held_events: int
    outstanding: bool
    gap_tokens: int


def session_summary(store: Store, session_id: str, config: PruneConfig) -> SessionSummary:
    """Pending batches, held events, barriers (pruning and ledger) and frontier gap of one
    session."""
    session = pruning.open_session(store, session_id, config)
    ledger = load_ledger_head(store, session_id) or {"buffer": [], "pending": None}
    return SessionSummary(
        pending_batches=len(windows.capture(session)),
        held_events=len(session.head["held"]) + len(ledger["buffer"]),
        outstanding=session.busy or ledger["pending"] is not None,
        gap_tokens=context_metrics.snapshot(store, session_id)["frontier_gap_tokens"],
    )


class SessionTracker:
    """The sessions a fold worker holds state for, and their gauge values.

    A session's values are recomputed at the first scrape after an event changed it, so a scrape
    costs the sessions that changed since the last one, not the whole fleet.
    """

    def __init__(self, table: Backend, config: PruneConfig, partitions: int) -> None:
        self.table = table
        self.config = config
        self.partitions = partitions
        self._sessions: dict[str, tuple[int, SessionSummary | None]] = {}

    def touch(self, session_id: str, partition: int) -> None:
        """A session changed: recompute its values at the next scrape."""
        self._sessions[session_id] = (partition, None)

    def rebuild(self) -> None:
        """Find every session the table holds (after a recovery)."""
        suffix = "/pr/h"
        for table_key in list(self.table.keys()):
            if table_key.endswith(suffix):
                session_id = table_key[: -len(suffix)]
                self.touch(session_id, partition_of(session_id, self.partitions))

    def snapshot(self, active: set[int]) -> FleetSnapshot:
        """Totals over the sessions on the `active` partitions (the others are forgotten)."""
        pending = held = outstanding = 0
        gaps = []
        for session_id, (partition, summary) in list(self._sessions.items()):
            if partition not in active:
                del self._sessions[session_id]
                continue
            if summary is None:
                view = read_view(self.table, session_id)
                summary = session_summary(view, session_id, self.config)
                self._sessions[session_id] = (partition, summary)
            pending += summary.pending_batches
            held += summary.held_events
            outstanding += summary.outstanding
            gaps.append(summary.gap_tokens)
        return FleetSnapshot(len(gaps), pending, held, outstanding, gaps)


#: Bytes a batch may pile up before it is committed: each session's writes are one group, which
#: must fit in one changelog record batch (MAX_RECORD_BYTES, 25 MiB, in app.py). Values are encoded
#: only at the commit, so a batch counts the bytes of the records it folded and of their outputs:
#: a fold keeps no more of an event than the event holds (events/, "nothing is copied").
BATCH_MAX_BYTES = 1024 * 1024


#: Size from which a record is folded off the event loop (see `FoldRuntime.fold`).
OFFLOAD_BYTES = 16 * 1024


@dataclass(slots=True)
class _SessionPart:
    """One session's share of a batch: the keys its records wrote, the records they send."""

    partition: int
    keys: dict[str, None] = field(default_factory=dict)  # an ordered set
    outputs: list[Output] = field(default_factory=list)


class Batch:
    """Records folded one after another and committed together.

    Each record is folded over `pending` (the writes of the records before it in the batch, over
    the table), and its writes are added to it, so every key is encoded and written to the table
    (and its changelog) once per batch however many records wrote it.
    """

    def __init__(self, table: Backend) -> None:
        self.pending = Pending(table)
        self.parts: dict[str, _SessionPart] = {}
        self.acks: list[Awaitable[Any]] = []
        self.folded: list[tuple[FoldResult, str | None, int]] = []
        #: The records whose writes `pending` holds, in order (to fold them again: `refold`).
        self.records: list[tuple[SourceRecord, str]] = []
        self.size = 0

    def add(
        self, session_id: str, record: SourceRecord, writes: WriteSet, outputs: list[Output]
    ) -> None:
        """Add one record's writes and outputs to its session's share."""
        part = self.parts.get(session_id)
        if part is None:
            part = self.parts[session_id] = _SessionPart(record.partition)
        values = self.pending.values
        for k, value in writes.puts.items():
            values[k] = value
            part.keys[k] = None
        for k in writes.deletes:
            values[k] = DELETED
            part.keys[k] = None
        part.outputs += outputs
        self.records.append((record, session_id))
        self.size += len(record.value or b"") + sum(len(o.value) for o in outputs)

    def journal(self, part: _SessionPart) -> Journal:
        """A session's share: each key's last value (encoded here, once), then the outputs in
        order (`commit` writes the one as a group, the other as a journal)."""
        values = self.pending.values
        puts = []
        deletes = []
        for k in part.keys:
            value = values[k]
            if value is DELETED:
                deletes.append(k)
            else:
                puts.append((k, orjson.dumps(value)))
        return Journal(tuple(puts), tuple(sorted(deletes)), tuple(part.outputs))


class Lease(Protocol):
    """Whether this worker may still write what it read in a consumer generation (StallGuard)."""

    def generation(self) -> int:
        """The consumer generation now."""
        ...

    async def clear(self, generation: int) -> bool:
        """Whether what was read in `generation` may still be written (after any stall)."""
        ...


@dataclass(slots=True)
class _OpenJournal:
    """A journal this runtime wrote, while the outputs it holds are not all acknowledged."""

    raw: bytes  # as written: a journal in the table that differs is another's (a crash's)
    sent: list[tuple[Output, Awaitable[Any]]]  # each output, with its acknowledgement

    def unacknowledged(self) -> list[tuple[Output, Awaitable[Any]]]:
        """The outputs the broker has not acknowledged (yet, or at all)."""
        return [(o, ack) for o, ack in self.sent if not _acknowledged(ack)]


@dataclass(slots=True)
class _Closing:
    """A journal whose delete `_close` is handing to the producer."""

    raw: bytes  # as written: in the store until the producer takes the delete (FaustBackend)
    handed: asyncio.Future[None]  # resolved once it has


def _acknowledged(ack: Awaitable[Any]) -> bool:
    done = isinstance(ack, asyncio.Future) and ack.done()
    return done and not ack.cancelled() and ack.exception() is None


class FoldRuntime:
    """The fold agent's work: fold records into a batch, commit the batch, count.

    `fold` folds one record into the open batch (after finishing an interrupted batch of its
    session: an open journal). `commit` makes the batch durable and returns once its writes and
    outputs are handed to the producer, without waiting for the broker: the next batch is folded
    while they are on their way. The awaitable it returns resolves when the broker has
    acknowledged all of them (and the journals they needed are deleted). The agent acknowledges
    the batch's records to Faust only then, so a committed offset never runs ahead of the state
    it produced. `handle` is a batch of one.
    """

    def __init__(
        self,
        table: Backend,
        send: Sender,
        topics: Topics,
        config: PruneConfig,
        metrics: Metrics,
        tracker: SessionTracker,
        journal: bool = True,
        ledger: LedgerConfig | None = DEFAULT_LEDGER,
    ) -> None:
        self.table = table
        self.send = send
        self.topics = topics
        self.config = config
        self.ledger = ledger  # None: the rule ledger is not folded
        self.metrics = metrics
        self.tracker = tracker
        #: Off under exactly_once, where Faust's transaction makes the writes atomic already.
        self.journal = journal
        self.batch = Batch(table)
        #: Records of this many bytes or more are folded in a worker thread (None: never).
        self.offload_bytes: int | None = OFFLOAD_BYTES
        #: Tests only: called (in the fold's thread) before each record is folded.
        self.step_hook: Callable[[SourceRecord], None] | None = None
        #: Asked before a journal is deleted once its outputs are acknowledged (None: always
        #: yes): the group may have moved the session meanwhile (a stall, a rebalance).
        self.lease: Lease | None = None
        #: Per session, the journal it has open while its outputs are on their way.
        self._open: dict[str, _OpenJournal] = {}
        #: Per session, the journal `_close` is deleting, until the producer has the delete.
        self._closing: dict[str, _Closing] = {}

    def _generation(self) -> int:
        """The consumer generation now (0 with no lease): the fence epoch of what is read now."""
        return 0 if self.lease is None else self.lease.generation()

    def discard(self) -> None:
        """Drop the open batch, unwritten: its records are to be read again."""
        self.batch = Batch(self.table)

    @property
    def batch_full(self) -> bool:
        """Whether the open batch holds enough bytes to be committed now."""
        return self.batch.size >= BATCH_MAX_BYTES

    async def handle(self, record: SourceRecord) -> Awaitable[Any]:
        """Fold one record and commit it; the awaitable resolves when its effect is durable."""
        await self.fold(record)
        return await self.commit()

    async def fold(self, record: SourceRecord) -> None:
        """Fold one record into the open batch (nothing is written before `commit`).

        A record whose fold raises is dead-lettered and its writes dropped; since it may have
        changed in place values the batch's earlier records wrote (a Pending hands them over as
        they are), those records are folded again from the table first (`refold`).
        """
        batch = self.batch
        session_id = _session_of(record.key)
        if session_id is not None:
            batch.acks += await self._finish_open_journal(session_id, record.partition)
        writes = WriteSet(batch.pending)
        try:
            result = await self._step(writes, record, first=True)
        except Exception as exc:
            # A fold bug must not stop the partition: the record is set aside, nothing written.
            log.error(
                "fold failed; record dead-lettered",
                extra={
                    "topic": record.topic,
                    "partition": record.partition,
                    "offset": record.offset,
                    "session": session_id,
                    "error": type(exc).__name__,
                },
            )
            await self.refold()
            batch = self.batch
            writes = WriteSet(batch.pending)
            result = FoldResult(fault=Fault("fold-error", type(exc).__name__))
        if result.fault is not None:
            batch.acks.append(await self._dead_letter(record, result.fault))
        if session_id is not None:
            batch.add(session_id, record, writes, self._outputs(result))
        batch.folded.append((result, session_id, record.partition))

    async def refold(self) -> None:
        """Fold the open batch's records again over the table, into a fresh Pending.

        The folds are deterministic and the table holds what it held when they were first
        folded (nothing is written between two folds but the deletes of open journals, which
        no fold reads), so each record writes and sends what it did; its dead letters, metrics
        and finished journals are not repeated.
        """
        old = self.batch
        batch = Batch(self.table)
        batch.acks, batch.folded = old.acks, old.folded
        for record, session_id in old.records:
            writes = WriteSet(batch.pending)
            result = await self._step(writes, record, first=False)
            batch.add(session_id, record, writes, self._outputs(result))
        self.batch = batch

    async def _step(self, writes: WriteSet, record: SourceRecord, first: bool) -> FoldResult:
        """Fold one record over `writes`; the tests' step hook runs on its first fold only.

        A large record is folded in a thread, so that its step (whose cost grows with the
        record's size, never the session's) leaves the event loop free to serve rebalance
        callbacks, the producer and the web server. Nothing else writes the batch meanwhile, nor
        any key a fold reads (the agent commits only between two folds; the deletes of journals
        still open run on the loop). Small records stay on the loop: a thread hop costs more than
        folding one (bench/fold_offload.py).
        """
        limit = self.offload_bytes
        if limit is not None and len(record.value or b"") >= limit:
            return await asyncio.to_thread(self._fold_step, writes, record, first)
        return self._fold_step(writes, record, first)

    def _outputs(self, result: FoldResult) -> list[Output]:
        return [
            Output(topic_of(e, self.topics), e.session_id.encode(), encode(e))
            for e in result.outputs
        ]

    def _fold_step(self, writes: WriteSet, record: SourceRecord, hook: bool) -> FoldResult:
        if hook and self.step_hook is not None:
            self.step_hook(record)
        return fold_record(writes, record, self.config, self.ledger)

    async def commit(self) -> Awaitable[Any]:
        """Make the open batch durable; the awaitable resolves when the broker has all of it.

        Per session, in this order (the same as for one record):
        Steps 1 and 2, one group (kafka/table_store.py: in the changelog whole or not at all),
        all sessions of a partition in one `write_groups`: the journal, which holds the
        session's outputs of the batch (no journal when it has none and none is open), then the
        keys, each once, with its last value. A session whose previous journal is still open
        (its outputs not all acknowledged) gets a journal that also holds those outputs: it
        replaces the previous one, so a crash from here on replays them with the rest (sent
        twice, answered once downstream: requests by id, compactions by request id).
        Step 3: the outputs, handed to the producer; here `commit` returns, and the next batch
        is folded while the broker acknowledges them.
        Step 4: once every output its journal holds is acknowledged (they are on other topics,
        so nothing else orders them before its removal), the journal is deleted, if it is still
        the session's latest (a later one holds its outputs, and deletes itself). The batch's
        records are acknowledged only after that delete, or once a later journal replaced it:
        no record is acknowledged while a journal older than its effect may still be replayed
        (a journal an earlier version wrote holds writes too, which a replay writes again).
        Each step is taken for every session of the batch before the next.
        """
        batch, self.batch = self.batch, Batch(self.table)
        acks = batch.acks
        journals = []
        for session_id, part in batch.parts.items():
            journal = batch.journal(part)
            if not journal.empty:
                journals.append((session_id, part.partition, journal))
        generation = self._generation()
        opened: list[tuple[str, int, _OpenJournal]] = []
        try:
            acks += await self._write(journals, opened, generation)
        except BaseException:
            # A commit that failed part way (the agent stops, its records are read again)
            # leaves its journals as a crash would: to be replayed, no longer this runtime's.
            for session_id, _partition, flight in opened:
                if self._open.get(session_id) is flight:
                    del self._open[session_id]
            raise
        for result, session_id, partition in batch.folded:
            observe_fold(self.metrics, result)
            if result.missing:
                log.warning(
                    "session events missing before this one",
                    extra={"session": session_id, "missing": result.missing},
                )
            if session_id is not None and result.kind is not None:
                self.tracker.touch(session_id, partition)
        return asyncio.gather(*acks)

    async def _write(
        self,
        journals: list[tuple[str, int, Journal]],
        opened: list[tuple[str, int, _OpenJournal]],
        generation: int,
    ) -> list[Awaitable[Any]]:
        """Steps 1 to 4 of `commit`; each journal written is added to `opened`; the acks."""
        acks: list[Awaitable[Any]] = []
        groups: dict[int, list[list[Write]]] = {}
        for session_id, partition, journal in journals:
            group: list[Write] = []
            # The keys land whole or not at all, so only outputs need a journal. While one is
            # open, each later batch of the session replaces it (carrying what is still
            # unacknowledged): a journal left behind holds nothing older than the session's
            # last batch here. (Left in place instead, one whose delete a rebalance had stopped
            # was replayed late, and a rebalance test with a frozen worker ended with a session
            # unlike the embedded fold's in 2 of 5 runs under CPU contention.)
            if self.journal and (journal.outputs or session_id in self._open):
                closing = self._closing.get(session_id)
                if closing is not None:
                    await closing.handed  # the previous journal's delete goes first
                previous = self._open.get(session_id)
                carried = [] if previous is None else previous.unacknowledged()
                body = Journal(outputs=(*(o for o, _ in carried), *journal.outputs))
                flight = _OpenJournal(body.encode(), carried)
                # Registered before the write yields, so the previous journal's step 4 sees
                # that it was replaced.
                self._open[session_id] = flight
                opened.append((session_id, partition, flight))
                group.append((journal_key(session_id), flight.raw))
            group += key_writes(self.table, journal)
            groups.setdefault(partition, []).append(group)
        for partition, partition_groups in groups.items():
            acks.append(await self.table.write_groups(partition_groups, partition, generation))
        sent: dict[str, list[tuple[Output, Awaitable[Any]]]] = {}
        for session_id, _partition, journal in journals:
            sent[session_id] = [(output, await self.send(output)) for output in journal.outputs]
            acks += [ack for _output, ack in sent[session_id]]
        for session_id, partition, flight in opened:
            flight.sent += sent[session_id]
            if flight.unacknowledged():
                acks.append(
                    asyncio.ensure_future(self._close(session_id, partition, flight, generation))
                )
            else:
                # Nothing to wait for (no outputs, or acknowledged already): deleted now.
                self._open.pop(session_id, None)
                delete = self.table.write(journal_key(session_id), None, partition, generation)
                acks.append(await delete)
        return acks

    async def _close(
        self, session_id: str, partition: int, flight: _OpenJournal, generation: int
    ) -> None:
        """Step 4 of `commit` for one session's journal, once its outputs are acknowledged."""
        await asyncio.gather(*(ack for _output, ack in flight.sent))
        if self._open.get(session_id) is not flight:
            return  # replaced: the session's latest journal holds what this one held
        if self.lease is not None and not await self.lease.clear(generation):
            # The session may be another worker's by now, and the delete would remove its
            # journal from the changelog. So the journal stays (replaying it is harmless) and
            # stays open here: the session's next batch on this worker still replaces it.
            return
        if self._open.get(session_id) is not flight:
            return
        del self._open[session_id]
        handed = asyncio.get_running_loop().create_future()
        self._closing[session_id] = _Closing(flight.raw, handed)
        try:
            ack = await self.table.write(journal_key(session_id), None, partition, generation)
        finally:
            del self._closing[session_id]
            handed.set_result(None)
        await ack

    async def resend_outstanding(self, partitions: int, active: set[int]) -> int:
        """Send again every request the sessions on `active` partitions wait on; how many.

        Called once a recovery has rebuilt the table: a session whose changelog state waits on a
        request whose answer was consumed earlier (an older state written back after the answer,
        see `keep_requests`) would otherwise wait for ever. The request goes out with the same
        id and body; the summarizer answers it again, and the fold applies whichever answer
        comes first while the request is outstanding and ignores the rest, so a request that
        was waiting for its first answer anyway costs one more model call and changes nothing.
        """
        envelopes = outstanding_requests(self.table, partitions, active)
        sent = []
        for envelope in envelopes:
            key = envelope.session_id.encode()
            sent.append(await self.send(Output(self.topics.flush_requests, key, encode(envelope))))
            kind = "ledger" if request_fold(envelope) == LEDGER_FOLD else "pruning"
            self.metrics.requests_resent.labels(kind=kind).inc()
        await asyncio.gather(*sent)
        if envelopes:
            log.warning("outstanding requests sent again", extra={"requests": len(envelopes)})
        return len(envelopes)

    async def handle_dead_letter(self, record: SourceRecord) -> Awaitable[Any]:
        """Count one dead-letter record into its session's state (one key: atomic)."""
        writes = WriteSet(TableStore(self.table))
        count_dead_letter(writes, record)
        group = key_writes(self.table, Journal.of(writes))
        return await self.table.write_groups([group], record.partition, self._generation())

    async def _finish_open_journal(self, session_id: str, partition: int) -> list[Awaitable[Any]]:
        """Complete a batch a crash interrupted (its writes and outputs, again: idempotent)."""
        raw = self.table.get(journal_key(session_id))
        closing = self._closing.get(session_id)
        if raw is None or (closing is not None and raw == closing.raw):
            return []  # none, or this runtime's with its delete on the way (`_close`)
        flight = self._open.get(session_id)
        if flight is not None:
            if raw == flight.raw:
                return []  # this runtime's, its outputs on their way (`commit`, step 4)
            del self._open[session_id]  # another worker's, recovered: replayed here
        journal = Journal.decode(raw)
        log.warning("completing an interrupted batch", extra={"session": session_id})
        generation = self._generation()
        acks = [
            await self.table.write_groups([key_writes(self.table, journal)], partition, generation)
        ]
        sent = [await self.send(output) for output in journal.outputs]
        await asyncio.gather(*sent)
        acks.append(await self.table.write(journal_key(session_id), None, partition, generation))
        self.metrics.journal_replays.inc()
        return acks + sent

    async def _dead_letter(self, record: SourceRecord, fault: Fault) -> Awaitable[Any]:
        log.warning(
            "record dead-lettered",
            extra={
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "session": _session_of(record.key),
                "reason": fault.reason,
                "error": fault.error,  # a content-free note: a cause, field paths, a class
            },
        )
        value = dead_letter_value(record, fault)
        return await self.send(Output(self.topics.dead_letters, record.key, value))


class SummarizeRuntime:
    """The summarizer agent's work for one flush request or ledger pass request.

    `max_record_bytes` is the largest record it sends (the topics' `max.message.bytes`); an
    answer over it, or one the producer refuses, goes out as the step's error answer instead.
    With `threads` > 1 the model is asked on a pool of its own that many threads wide (the
    agent then answers that many requests at once, answers.py); ledger passes go one at a time
    whatever `threads` is (the diff model keeps state per call, which two passes would mix).
    """

    def __init__(
        self,
        answerer: Answerer,
        send: Sender,
        topics: Topics,
        metrics: Metrics,
        max_record_bytes: int = MAX_MESSAGE_BYTES,
        threads: int = 0,
    ) -> None:
        self.answerer = answerer
        self.send = send
        self.topics = topics
        self.metrics = metrics
        self.max_record_bytes = max_record_bytes
        # Its own threads: asyncio's default pool is min(32, CPUs + 4) wide and also resolves
        # the brokers' host names, which slow model calls must not queue behind.
        self._threads = (
            ThreadPoolExecutor(threads, thread_name_prefix="sessionfold-answer")
            if threads > 1
            else None
        )
        self._passes = asyncio.Lock()

    async def answered(self, record: SourceRecord) -> Any:
        """Answer one request (or dead-letter it) and wait until the broker has the record."""
        return await (await self.handle(record))

    async def handle(self, record: SourceRecord) -> Awaitable[Any]:
        """Answer one request (or dead-letter it); resolves when the answer is durable."""
        request = read_request_record(record)
        if isinstance(request, Fault):
            log.warning(
                "request dead-lettered",
                extra={
                    "topic": record.topic,
                    "partition": record.partition,
                    "offset": record.offset,
                    "session": _session_of(record.key),
                    "reason": request.reason,
                    "error": request.error,
                },
            )
            value = dead_letter_value(record, request)
            ack = await self.send(Output(self.topics.dead_letters, record.key, value))
            self.metrics.dead_letters.labels(kind=request.reason).inc()
            return ack
        with self.metrics.summarizer_in_progress.track_inprogress():
            started = time.perf_counter()
            answer = await self._ask(request)
            seconds = time.perf_counter() - started
        answer, ack = await self._send_answer(request, answer)
        observe_answer(self.metrics, answer.envelope, answer.outcome, seconds)
        return ack

    async def _ask(self, request: FlushRequestEnvelope) -> Answer:
        """The answerer's answer, asked in a thread (a real model takes seconds)."""
        if isinstance(request, LedgerRequestEnvelope):
            async with self._passes:
                return await self._in_thread(request)
        return await self._in_thread(request)

    async def _in_thread(self, request: FlushRequestEnvelope) -> Answer:
        if self._threads is None:
            return await asyncio.to_thread(self.answerer.answer, request)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, self.answerer.answer, request)

    async def _send_answer(
        self, request: FlushRequestEnvelope, answer: Answer
    ) -> tuple[Answer, Awaitable[Any]]:
        """Send `answer`, or the error answer when it is over `max_record_bytes` or refused for
        its size; the answer sent and its acknowledgement.

        The producer refuses a record over its `max_request_size` at once, the broker one over
        the topic's `max.message.bytes` in the acknowledgement: either way the error answer
        (a few hundred bytes) goes out instead. A refusal for any other reason (the broker
        away) propagates as before: a restart's retry may well succeed.
        """
        key = request.session_id.encode()
        value = encode(answer.envelope)
        if len(value) > self.max_record_bytes:
            return await self._send_error(request, len(value), "unsendable:too-large")
        try:
            ack = await self.send(Output(topic_of(answer.envelope, self.topics), key, value))
        except Exception as exc:
            if not refused_for_size(exc):
                raise
            return await self._send_error(request, len(value), "unsendable:too-large")
        # A task, so the error answer goes out as soon as the refusal comes, awaited or not.
        return answer, asyncio.ensure_future(self._refusal_answered(request, len(value), ack))

    async def _refusal_answered(
        self, request: FlushRequestEnvelope, size: int, ack: Awaitable[Any]
    ) -> Any:
        """`ack`'s result; when the broker refused the record for its size, the error answer's."""
        try:
            return await ack
        except Exception as exc:
            if not refused_for_size(exc):
                raise
        _, fallback_ack = await self._send_error(request, size, "unsendable:too-large")
        return await fallback_ack

    async def _send_error(
        self, request: FlushRequestEnvelope, size: int, code: str
    ) -> tuple[Answer, Awaitable[Any]]:
        log.warning(
            "answer not sent, sending an error answer",
            extra={
                "session": request.session_id,
                "bytes": size,
                "limit": self.max_record_bytes,
                "error": code,
            },
        )
        fallback = error_answer(request, code)
        topic = topic_of(fallback.envelope, self.topics)
        value = encode(fallback.envelope)
        return fallback, await self.send(Output(topic, request.session_id.encode(), value))
