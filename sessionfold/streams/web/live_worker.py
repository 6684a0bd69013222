"""The live routes on a fold worker: what `sessionfold serve` answers pi, from Kafka's state.

The same four routes and JSON as serve (live_contract.py, docs/live.md), answered by the worker
that owns the session's partition (state_api.py routes them there):

- `context`: waits (bounded) until the fold has folded the leaf entry (the branch digest knows
  its id) and no flush is outstanding or holding events (the pruning head's `out` and `held`),
  then renders the view (views/context.py) over the worker's table and the session's entries;
- `compact`: the ledger's compaction pass over the table's ledger state, as a compact request
  after the last folded event would run it (`sessionfold ledger compact FILE`'s pass);
- `recall`: the recall tool's text, originals from the session's entries;
- `status`: the pending batches, metrics and footer;
- `plan`: the gateway's rewrite plan (views/rewrite.py) of the render `context` would give.

The entries are not in the table (the log is the archive): `SessionLogs` keeps each session's
`LogEntry` items and `/pruner compact` points in memory, an LRU over sessions, and fills one
incrementally from session-events: the session's partition, from the offset it stopped at (the
first time from the session's first record, whose position the fold records), only the
session's key (`KeyReader`). A call then reads only what the partition got since the last one,
and renders in time that grows with the context's own size.

The view is rendered on the event loop, between two awaits, so the fold (on the same loop)
never changes the table under it; Kafka reads and model calls run on threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sessionfold.events.envelope import CommandEnvelope, EnvelopeError, WorldEnvelope, decode
from sessionfold.ports.ledger.model import DiffModel
from sessionfold.projections.ledger.config import LedgerConfig
from sessionfold.projections.ledger.fold import LedgerFold
from sessionfold.projections.ledger.state import load_head as load_ledger_head
from sessionfold.projections.pruning import digest
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.config import PruneConfig
from sessionfold.projections.store import Store
from sessionfold.projections.views.base import LogEntry, entry_at, log_entry
from sessionfold.projections.views.context import (
    ContextView,
    RenderMemo,
    compact_point,
    context_at,
)
from sessionfold.projections.views.recall import recall_text
from sessionfold.streams.kafka.key_reader import KeyReader
from sessionfold.streams.kafka.table_store import Backend, read_view, start_key
from sessionfold.streams.kafka.topics import partition_of
from sessionfold.streams.runtime import step
from sessionfold.streams.web import live_contract as contract

log = logging.getLogger(__name__)

#: Sessions whose entries a worker keeps in memory by default (least recently asked go first).
DEFAULT_CACHED_SESSIONS = 64
#: How many times a render reads the log again when the fold moved on during the read.
CATCH_UP_READS = 3


class LogUnavailable(Exception):
    """Session-events could not be read (the broker is unreachable, say): `error` names the
    exception's class, never its message."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


@dataclass
class SessionLog:
    """One session's entries and compact points as read from session-events so far."""

    session_id: str
    partition: int | None = None
    next_offset: int | None = None  # None: not located yet (read from the first record)
    last_seq: int = 0
    entries: list[LogEntry] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)  # the entries' seqs (ascending), for cuts
    compacts: list[tuple[int, str | None]] = field(default_factory=list)
    reclaim: dict[str, int] | None = None  # the last context render's tokens (the footer's)
    memo: RenderMemo = field(default_factory=RenderMemo)  # its last render, kept
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def add(self, value: bytes) -> None:
        """Take one record of the session (a record already taken, by seq, is skipped)."""
        try:
            envelope = decode(value)
        except EnvelopeError:
            return  # the fold dead-letters it too; the reader's placeholder holds its place
        if envelope.session_id != self.session_id or isinstance(envelope, WorldEnvelope):
            return  # a World snapshot carries the seq it follows: it is not the view's
        if envelope.seq <= self.last_seq:
            return
        self.last_seq = envelope.seq  # every sequenced event: the pruning head counts them all
        item = log_entry(envelope)
        if item is not None:
            self.entries.append(item)
            self.seqs.append(item.seq)
        elif isinstance(envelope, CommandEnvelope) and envelope.payload.name == "compact":
            self.compacts.append((envelope.seq, envelope.time))

    def upto(self, seq: int) -> tuple[list[LogEntry], list[tuple[int, str | None]]]:
        """The entries and compact points at or before `seq`."""
        entries = self.entries[: bisect_right(self.seqs, seq)]
        return entries, [c for c in self.compacts if c[0] <= seq]

    def entry_at(self, seq: int) -> dict[str, Any] | None:
        """The entry with sequence number `seq`, or None."""
        return entry_at(self.entries, self.seqs, seq)


class SessionLogs:
    """The sessions' logs in memory, least recently asked evicted beyond `capacity`."""

    def __init__(self, reader: KeyReader, partitions: int, capacity: int) -> None:
        self.reader = reader
        self.partitions = partitions
        self.capacity = max(1, capacity)
        self.sessions: OrderedDict[str, SessionLog] = OrderedDict()

    def get(self, session_id: str) -> SessionLog:
        """The session's log (an empty one the first time), marked as just asked."""
        found = self.sessions.get(session_id)
        if found is None:
            found = self.sessions[session_id] = SessionLog(session_id)
            while len(self.sessions) > self.capacity:
                self.sessions.popitem(last=False)
        self.sessions.move_to_end(session_id)
        return found

    async def fill(self, session_id: str, store: Store, seq: int) -> SessionLog:
        """The session's log, read on from session-events unless it holds `seq` already;
        LogUnavailable when the read failed."""
        session_log = self.get(session_id)
        async with session_log.lock:
            if session_log.last_seq >= seq:
                return session_log
            if session_log.partition is None:
                start = store.get(start_key(session_id))
                if start is not None:
                    session_log.partition, session_log.next_offset = start["p"], start["o"]
                else:  # folded before the fold recorded where sessions start
                    session_log.partition = partition_of(session_id, self.partitions)
            try:
                found = await asyncio.to_thread(
                    self.reader.read,
                    session_log.partition,
                    session_log.next_offset,
                    session_id.encode(),
                )
            except Exception as exc:  # a Kafka failure: the routes answer stale or 503, no 500
                log.warning(
                    "live: session-events not read",
                    extra={"session": session_id, "error": type(exc).__name__},
                )
                raise LogUnavailable(type(exc).__name__) from None
            for _offset, value in found.records:
                session_log.add(value)
            session_log.next_offset = found.next_offset
        return session_log

    def reclaim(self, session_id: str) -> dict[str, int] | None:
        """The last context render's tokens of a session still cached, else None."""
        found = self.sessions.get(session_id)
        return None if found is None else found.reclaim


def known(store: Store, session_id: str) -> bool:
    """Whether any session event of the session has been folded."""
    return store.get(pruning.row_key(session_id, "h")) is not None


def settled(store: Store, session_id: str, leaf: str | None) -> bool:
    """Whether the fold has folded `leaf` (when named) and no flush is outstanding or holding
    events: the state pi-condense's synchronous flush leaves before the model call."""
    head = pruning.load_head(store, session_id)
    if head["out"] is not None or head["held"]:
        return False
    return leaf is None or digest.is_folded(store, session_id, leaf)


@dataclass
class WorkerLive:
    """The live routes' answers over a fold worker's table (`state`) and session-events."""

    state: Backend
    logs: SessionLogs
    config: PruneConfig
    ledger: LedgerConfig | None
    diff_model: DiffModel
    wait_s: float = contract.DEFAULT_WAIT_S
    metrics: contract.LiveMetrics | None = None  # calls and their time, where answered

    async def context(self, session_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """The context route's answer (BadRequest for a body the contract refuses)."""
        request = contract.context_request(body, self.wait_s)
        started = time.monotonic()
        deadline = started + request.wait_s
        unknown_until = started + min(request.wait_s, contract.UNKNOWN_GRACE_S)
        while True:
            now = time.monotonic()
            stale, give_up = now >= deadline, now >= unknown_until
            answer = await self._context_now(session_id, request, stale, give_up)
            if answer is not None:
                return answer
            await asyncio.sleep(contract.WAIT_STEP_S)

    async def _context_now(
        self,
        session_id: str,
        request: contract.ContextRequest,
        stale: bool,
        give_up_unknown: bool,
    ) -> dict[str, Any] | None:
        """The answer if the state is settled at the leaf (or `stale`), else None."""
        leaf = request.leaf
        store = read_view(self.state, session_id)
        if not known(store, session_id):
            if not give_up_unknown:
                return None
            # pi writes a new session's file only once its first model call has answered (and
            # so publishes nothing of it before): there is nothing to prune yet.
            return contract.unchanged(session_id, leaf, 0, "unknown-session", stale=False)
        if not stale and not settled(store, session_id, leaf):
            return None
        for _ in range(CATCH_UP_READS):
            seq = pruning.load_head(store, session_id)["seq"]
            try:
                session_log = await self.logs.fill(session_id, store, seq)
            except LogUnavailable:
                if not stale:
                    return None  # wait and read again
                epoch = contract.epoch_of(store, session_id)
                return contract.unchanged(session_id, leaf, epoch, "log-unavailable", stale=True)
            store = read_view(self.state, session_id)  # the fold may have gone on meanwhile
            if not stale and not settled(store, session_id, leaf):
                return None
            if session_log.last_seq >= pruning.load_head(store, session_id)["seq"]:
                break
        else:
            if not stale:
                return None  # the log lags the fold: look again
        view = self._view(session_log, store, session_id)
        session_log.reclaim = view.tokens
        epoch = contract.epoch_of(store, session_id)
        return contract.context_answer(session_id, request, view, epoch, stale)

    def _view(self, session_log: SessionLog, store: Store, session_id: str) -> ContextView:
        """The context at the state's sequence number (no await: the fold cannot move)."""
        seq = pruning.load_head(store, session_id)["seq"]
        entries, compacts = session_log.upto(seq)
        points = [compact_point(s, t, store, session_id) for s, t in compacts]
        return context_at(entries, store, session_id, self.config, points, session_log.memo)

    async def plan(self, session_id: str) -> bytes:
        """The plan route's answer, encoded (live_contract.py `plan_json`): the rewrite of the
        session as folded now, never waiting for a leaf, as serve's (LogUnavailable when
        session-events cannot be read)."""
        store = read_view(self.state, session_id)
        if not known(store, session_id):
            return contract.unknown_plan(session_id)
        for _ in range(CATCH_UP_READS):
            seq = pruning.load_head(store, session_id)["seq"]
            session_log = await self.logs.fill(session_id, store, seq)
            store = read_view(self.state, session_id)  # the fold may have gone on meanwhile
            if session_log.last_seq >= pruning.load_head(store, session_id)["seq"]:
                break
        view = self._view(session_log, store, session_id)
        return contract.plan_json(session_id, view, contract.epoch_of(store, session_id))

    async def compact(self, session_id: str) -> dict[str, Any]:
        """The compact route's answer: the ledger's pass as a compact request now runs it."""
        if self.ledger is None:
            return contract.fallback("ledger-off")
        deadline = time.monotonic() + self.wait_s
        while True:
            store = read_view(self.state, session_id)
            if not known(store, session_id):
                return contract.fallback("unknown-session")
            head = load_ledger_head(store, session_id)
            if head is None or head["pending"] is None:
                break
            if time.monotonic() >= deadline:
                return contract.fallback("busy")  # a pass of the fold's own is outstanding
            await asyncio.sleep(contract.WAIT_STEP_S)
        seq = head["seq"] if head is not None else pruning.load_head(store, session_id)["seq"]
        # Over a read view: the request's writes are dropped, the table never changes.
        requests = LedgerFold(store, self.ledger).request_pass(
            session_id, seq + 1, "compact-request"
        )
        if not requests:
            return contract.compact_answer(None)
        try:
            payload, _error = await asyncio.to_thread(
                step.pass_payload, requests[0], self.diff_model, self.ledger, None
            )
        except Exception as exc:  # never an error pi cannot survive: its own compaction runs
            log.warning(
                "live compact failed", extra={"session": session_id, "error": type(exc).__name__}
            )
            return contract.fallback(f"error:{type(exc).__name__}")
        return contract.compact_answer(payload)

    async def recall(self, session_id: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The recall route's answer; None for an unknown session (LogUnavailable when
        session-events cannot be read)."""
        ids = contract.recall_request(body)
        whole = contract.recall_whole(body)
        store = read_view(self.state, session_id)
        if not known(store, session_id):
            return None
        seq = pruning.load_head(store, session_id)["seq"]
        session_log = await self.logs.fill(session_id, store, seq)
        store = read_view(self.state, session_id)
        text, found = recall_text(store, session_id, ids, session_log.entry_at, whole)
        return {"text": text, "found": found}

    def status(self, session_id: str) -> dict[str, Any]:
        """The status route's answer."""
        store = read_view(self.state, session_id)
        if not known(store, session_id):
            return contract.unknown_status(session_id)
        # The dead-letter count is not part of the status: the document is read without it.
        document = step.session_document(store, session_id, self.config, None, 0)
        return contract.status_answer(session_id, store, document, self.logs.reclaim(session_id))
