"""The state API on a fold worker's web server.

- `GET /sessions/{id}`: the session's projections, the same document as one session of
  `sessionfold fold --json` (runtime/step.py's `session_document`), the rule ledger (`ledger`)
  included when the workers fold it.
- `GET /sessions/{id}/flushes`: its flush-metrics records, the outstanding request id and the
  number of events the flush barrier holds.
- `GET /sessions/{id}/refs/{ref}`: the original tool output a summary's ref `tN` stands for,
  read back from session-events at the offset the fold recorded for that toolResult entry.
- `POST /sessions/{id}/context`, `/compact`, `/recall`, `GET /sessions/{id}/status`, `/plan`:
  the live routes `sessionfold serve` has, with the same JSON (live_worker.py, docs/live.md), when
  `register` is given a `WorkerLive`. A POST is proxied to the owner with its body.
  `POST /sessions/{id}/client-events` (the extension's fail-opens) is counted where it arrives.
  `/plan` carries an `ETag` (a digest of the plan's bytes: live_contract.py `plan_tag`) and is a
  304 without a body when `If-None-Match` names it, so a gateway's cached plan costs a small
  answer while the session does not change (web/plan_cache.py).

Every view is routed by Faust's router on the session id (`faust_compat.route_request`), so any
fold worker can be asked: the one that owns the session's partition answers (the request is
proxied to it, with the caller's headers: the API token goes along). An unknown session or ref
is a 404 with a JSON `error`; a session id or ref longer than `MAX_ID_CHARS` is a 400, refused
before it is routed. A request the worker cannot answer yet is a 503 with `Retry-After`, never
a 500: one it cannot route yet (`not ready`, with a `reason` from `faust_compat.ROUTING_REASONS`:
at start-up before the producer has the changelog topic's metadata, a partition nobody owns yet,
an owner whose web server does not answer), and a read while the owner rebuilds the session's
changelog partition from the changelog (`recovering`; a partition it has rebuilt answers while
the others still recover). Each kind of 503 is logged as one line a minute at most, with its
reason and count, no traceback (`NotReadyLog`); `not_ready_middleware` does the same for Faust's
own `/router` views. Every view asks for the API token when the worker has one (web/auth.py).
Reads see a session as of its last committed batch (the writes of a journal an interrupted
batch left are applied over the table for the read).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import faust
import orjson
from faust.types import TP
from faust.web import Request, Response, View
from kafka import TopicPartition

from sessionfold.events.envelope import EntryEnvelope, EnvelopeError, decode
from sessionfold.projections.ledger.config import DEFAULT_LEDGER, LedgerConfig
from sessionfold.projections.pruning import digest, index
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.config import PruneConfig
from sessionfold.projections.store import Store
from sessionfold.streams.kafka import clients, faust_compat
from sessionfold.streams.kafka.faust_compat import RecoveryProgress
from sessionfold.streams.kafka.security import PLAINTEXT, KafkaSecurity
from sessionfold.streams.kafka.table_store import Backend, dead_letter_key, offset_key, read_view
from sessionfold.streams.kafka.topics import Topics, partition_of
from sessionfold.streams.runtime import step
from sessionfold.streams.web import live_contract
from sessionfold.streams.web.auth import GATEWAY_PREFIX
from sessionfold.streams.web.live_contract import BadRequest
from sessionfold.streams.web.live_worker import LogUnavailable, WorkerLive

#: A state view as registered (view, request, the session id, the path's other parts).
Handler = Callable[..., Awaitable[Response]]

log = logging.getLogger(__name__)

#: Seconds a 503's `Retry-After` asks the client to wait: start-up and a rebalance take seconds.
RETRY_AFTER_S = 1
#: Shortest time between two log lines about one kind of 503.
NOT_READY_LOG_INTERVAL_S = 60.0

#: How long a ref read waits for its record.
READ_TIMEOUT_S = 10.0
#: Longest session id or ref the API accepts (pi's session ids are 36-character UUIDs).
MAX_ID_CHARS = 256


def known(store: Store, session_id: str) -> bool:
    """Whether any session event of the session has been folded."""
    return store.get(pruning.row_key(session_id, "h")) is not None


def dead_letter_count(store: Store, session_id: str) -> int:
    """How many dead letters the session has."""
    row = store.get(dead_letter_key(session_id))
    return 0 if row is None else int(row["n"])


def session_document(
    store: Store,
    session_id: str,
    config: PruneConfig,
    ledger: LedgerConfig | None = DEFAULT_LEDGER,
) -> dict[str, Any] | None:
    """One session as `sessionfold fold --json` reports it; None if the session is unknown."""
    if not known(store, session_id):
        return None
    return step.session_document(
        store, session_id, config, ledger, dead_letter_count(store, session_id)
    )


def flushes_document(store: Store, session_id: str) -> dict[str, Any] | None:
    """The session's flush attempts and barrier; None if unknown."""
    if not known(store, session_id):
        return None
    head = pruning.load_head(store, session_id)
    return {
        "session_id": session_id,
        "flush_attempts": pruning.flush_records(store, session_id),
        "outstanding": head["out"],
        "held_events": len(head["held"]),
    }


@dataclass(frozen=True, slots=True)
class RefLocation:
    """Where the original behind a ref sits: its index record and its log position."""

    session_id: str
    ref: str
    key: str
    seq: int
    partition: int
    offset: int


def locate_ref(store: Store, session_id: str, ref: str) -> RefLocation | str:
    """The log position of a ref's original, or why there is none."""
    if not known(store, session_id):
        return "unknown session"
    occurrence = index.resolve_ref(store, session_id, ref)
    record = None if occurrence is None else index.record(store, session_id, occurrence)
    if occurrence is None or record is None:
        return "unknown ref"
    seq = record["seq"]
    position = None if seq is None else store.get(offset_key(session_id, seq))
    if seq is None or position is None:
        return "original not located"
    return RefLocation(session_id, ref, occurrence, seq, position["p"], position["o"])


def read_record(
    bootstrap: str, topic: str, partition: int, offset: int, security: KafkaSecurity = PLAINTEXT
) -> bytes | None:
    """The value of one record, read by position without joining a consumer group."""
    consumer = clients.reader(bootstrap, "sessionfold-state-api", security)
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        deadline = time.monotonic() + READ_TIMEOUT_S
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=500, max_records=1)
            for records in batch.values():
                for record in records:
                    if record.offset == offset:
                        value: bytes | None = record.value
                        return value
                    return None  # the offset is gone (compacted or truncated)
        return None
    finally:
        consumer.close()


def ref_document(location: RefLocation, value: bytes | None, topic: str) -> dict[str, Any] | None:
    """The original toolResult message behind a ref; None if the log does not hold it."""
    if value is None:
        return None
    try:
        envelope = decode(value)
    except EnvelopeError:
        return None
    if (
        not isinstance(envelope, EntryEnvelope)
        or envelope.session_id != location.session_id
        or envelope.seq != location.seq
    ):
        return None
    message = digest.message_of(envelope.payload.entry) or {}
    return {
        "session_id": location.session_id,
        "ref": location.ref,
        "key": location.key,
        "seq": location.seq,
        "tool_call_id": message.get("toolCallId"),
        "tool_name": message.get("toolName"),
        "is_error": bool(message.get("isError", False)),
        "content": message.get("content"),
        "location": {"topic": topic, "partition": location.partition, "offset": location.offset},
    }


def changelog_partition(app: Any, table: Any, session_id: str) -> TP:
    """The table's changelog partition holding the session's state: the partition number of
    its session-events records (every topic is partitioned alike, topics.py)."""
    partitions = table.partitions or app.conf.topic_partitions
    return TP(table.changelog_topic.get_topic_name(), partition_of(session_id, partitions))


def recovering(
    app: Any, session_id: str, progress: RecoveryProgress, tp: TP
) -> dict[str, Any] | None:
    """The 503 body while the worker rebuilds the session's changelog partition `tp`, else None.

    Recovery applies the changelog in Faust's chunks (`recovery_buffer_size` records), not in
    the groups the fold wrote whole: in between, a session's head can count rows not applied
    yet, and its document would be half of two states (a frozen-worker run read one and the
    view raised). A partition whose every record up to the recovery's highwater is applied is
    whole, so its sessions are served while other partitions recover.
    """
    if not app.in_recovery or progress.recovered(tp):
        return None
    return {"error": "recovering", "session_id": session_id}


def too_long(*ids: str) -> bool:
    """Whether any of the ids is longer than the API accepts."""
    return any(len(value) > MAX_ID_CHARS for value in ids)


def register(
    app: faust.App,
    table: Any,
    state: Backend,
    config: PruneConfig,
    topics: Topics,
    bootstrap: str,
    ledger: LedgerConfig | None = DEFAULT_LEDGER,
    security: KafkaSecurity = PLAINTEXT,
    not_ready: NotReadyLog | None = None,
    live: WorkerLive | None = None,
) -> LocalPlans | None:
    """Add the state views to a fold worker's web server (`table` routes, `state` answers);
    with `live`, the live routes too (live_worker.py), and the plans this worker answers
    without HTTP (its gateway's, `LocalPlans`)."""
    not_ready = not_ready or NOT_READY
    routed = _routed(app, table, not_ready)
    progress = faust_compat.watch_recovery(app)
    unless_recovering = _unless_recovering(app, table, progress, not_ready)

    @routed
    @unless_recovering
    async def session(view: View, request: Request, session_id: str) -> Response:
        document = session_document(read_view(state, session_id), session_id, config, ledger)
        if document is None:
            return _json(view, {"error": "unknown session", "session_id": session_id}, 404)
        return _json(view, document)

    @routed
    @unless_recovering
    async def flushes(view: View, request: Request, session_id: str) -> Response:
        document = flushes_document(read_view(state, session_id), session_id)
        if document is None:
            return _json(view, {"error": "unknown session", "session_id": session_id}, 404)
        return _json(view, document)

    @routed
    @unless_recovering
    async def original(view: View, request: Request, session_id: str, ref: str) -> Response:
        location = locate_ref(read_view(state, session_id), session_id, ref)
        if isinstance(location, str):
            return _json(view, {"error": location, "session_id": session_id, "ref": ref}, 404)
        value = await asyncio.to_thread(
            read_record,
            bootstrap,
            topics.session_events,
            location.partition,
            location.offset,
            security,
        )
        document = ref_document(location, value, topics.session_events)
        if document is None:
            error = {"error": "original not in the log", "session_id": session_id, "ref": ref}
            return _json(view, error, 404)
        return _json(view, document)

    # The length check runs before routing: an id too long is refused where it arrives.
    class Session(View):
        async def get(self, request: Request, session_id: str) -> Response:
            if too_long(session_id):
                return _too_long(self)
            return await session(self, request, session_id)

    class Flushes(View):
        async def get(self, request: Request, session_id: str) -> Response:
            if too_long(session_id):
                return _too_long(self)
            return await flushes(self, request, session_id)

    class Ref(View):
        async def get(self, request: Request, session_id: str, ref: str) -> Response:
            if too_long(session_id, ref):
                return _too_long(self)
            return await original(self, request, session_id, ref)

    app.page("/sessions/{session_id}", name="session")(Session)
    local = None
    if live is not None:
        _register_live(app, live, routed, unless_recovering, not_ready)
        local = LocalPlans(app, table, live, progress)
    app.page("/sessions/{session_id}/flushes", name="session-flushes")(Flushes)
    app.page("/sessions/{session_id}/refs/{ref}", name="session-ref")(Ref)
    return local


def _register_live(
    app: Any,
    live: WorkerLive,
    routed: Callable[[Handler], Handler],
    unless_recovering: Callable[[Handler], Handler],
    not_ready: NotReadyLog,
) -> None:
    """The live routes (docs/live.md), routed and guarded as the state views are; the owner
    counts each call it answers in `live.metrics` (`timed`)."""

    def timed(route: str) -> Callable[[Handler], Handler]:
        return _timed(live, route)

    @routed
    @unless_recovering
    @timed("context")
    async def context(view: View, request: Request, session_id: str) -> Response:
        body = await _object_body(request)
        if body is None:
            return _bad_body(view, "the body is not a JSON object")
        try:
            answer = await live.context(session_id, body)
        except BadRequest as exc:
            return _bad_body(view, str(exc))
        response = _json(view, answer)
        response.sessionfold_outcome = live_contract.outcome(answer)  # type: ignore[attr-defined]
        return response

    @routed
    @unless_recovering
    @timed("compact")
    async def compact(view: View, request: Request, session_id: str) -> Response:
        if await _object_body(request) is None:
            return _bad_body(view, "the body is not a JSON object")
        return _json(view, await live.compact(session_id))

    @routed
    @unless_recovering
    @timed("recall")
    async def recall(view: View, request: Request, session_id: str) -> Response:
        body = await _object_body(request)
        if body is None:
            return _bad_body(view, "the body is not a JSON object")
        try:
            answer = await live.recall(session_id, body)
        except BadRequest as exc:
            return _bad_body(view, str(exc))
        except LogUnavailable:
            busy = {"error": "not ready", "reason": "log", "session_id": session_id}
            return _unavailable(view, busy, "log", not_ready)
        if answer is None:
            return _json(view, {"error": "unknown session", "session_id": session_id}, 404)
        return _json(view, answer)

    @routed
    @unless_recovering
    @timed("status")
    async def status(view: View, request: Request, session_id: str) -> Response:
        return _json(view, live.status(session_id))

    plan = routed(unless_recovering(timed("plan")(_plan(live, not_ready))))
    app.page("/sessions/{session_id}/context", name="live-context")(_session_view(context, "post"))
    app.page("/sessions/{session_id}/compact", name="live-compact")(_session_view(compact, "post"))
    app.page("/sessions/{session_id}/recall", name="live-recall")(_session_view(recall, "post"))
    app.page("/sessions/{session_id}/status", name="live-status")(_session_view(status, "get"))
    app.page("/sessions/{session_id}/plan", name="live-plan")(_session_view(plan, "get"))

    app.page("/sessions/{session_id}/client-events", name="live-client-events")(
        _client_events_view(live)
    )


@dataclass
class LocalPlans:
    """The plan route's answer for the sessions this worker owns, without HTTP: its gateway
    asks here first (web/plan_cache.py `local_first`) and takes the route only for the
    sessions another worker owns."""

    app: Any
    table: Any
    live: WorkerLive
    progress: RecoveryProgress

    async def __call__(self, session_id: str) -> tuple[int, bytes] | None:
        """(status, plan) as the route answers when this worker owns the session (a 503
        without a body while it recovers the session or cannot read its log); None when
        another worker owns it, or nobody does yet (the route answers that)."""
        try:
            if too_long(session_id) or not faust_compat.owns(self.app, self.table.name, session_id):
                return None
        except Exception:  # no owner yet, routing not ready: the route's 503 says why
            return None
        tp = changelog_partition(self.app, self.table, session_id)
        if recovering(self.app, session_id, self.progress, tp) is not None:
            return 503, b""
        try:
            return 200, await self.live.plan(session_id)
        except LogUnavailable:
            return 503, b""


def _plan(live: WorkerLive, not_ready: NotReadyLog) -> Handler:
    """The plan route, run where the session is: the plan with its `ETag`, or a 304 without a
    body when `If-None-Match` names it (web/plan_cache.py)."""

    async def plan(view: View, request: Request, session_id: str) -> Response:
        try:
            encoded = await live.plan(session_id)
        except LogUnavailable:
            busy = {"error": "not ready", "reason": "log", "session_id": session_id}
            return _unavailable(view, busy, "log", not_ready)
        tag = {"ETag": live_contract.plan_tag(encoded)}
        if live_contract.not_modified(request.headers.get("If-None-Match"), encoded):
            return view.bytes(b"", status=304, headers=tag)
        return view.bytes(encoded, content_type="application/json", headers=tag)

    return plan


def _session_view(handler: Handler, method: str) -> type[View]:
    """A View answering `method` on a session's path with `handler` (ids checked first)."""

    async def answer(self: View, request: Request, session_id: str) -> Response:
        if too_long(session_id):
            return _too_long(self)
        return await handler(self, request, session_id)

    return type(f"Live{method.title()}", (View,), {method: answer})


def _client_events_view(live: WorkerLive) -> type[View]:
    """The extension's fail-open reports: counted where they arrive (no session state)."""

    class ClientEvents(View):
        async def post(self, request: Request, session_id: str) -> Response:
            body = await _object_body(request)
            if body is None:
                return _bad_body(self, "the body is not a JSON object")
            if live.metrics is not None:
                live.metrics.fail_open(body.get("kind"))
            return self.bytes(b"", status=204)

    return ClientEvents


def _timed(live: WorkerLive, route: str) -> Callable[[Handler], Handler]:
    """A live route's handler that counts each answer (outcome, time) in `live.metrics`."""

    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def measured(view: View, request: Request, session_id: str) -> Response:
            started = time.monotonic()
            response = await handler(view, request, session_id)
            if live.metrics is not None:
                outcome = getattr(response, "sessionfold_outcome", None)
                outcome = outcome if isinstance(outcome, str) else str(response.status)
                live.metrics.observe(route, outcome, time.monotonic() - started)
            return response

        return measured

    return wrap


async def _object_body(request: Request) -> dict[str, Any] | None:
    """The request's JSON object body, or None when it is not one."""
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def _bad_body(view: View, why: str) -> Response:
    return _json(view, {"error": why}, 400)


class NotReadyLog:
    """One log line per kind of 503 (`reason`) a minute at most, with how many requests got
    it since that kind's last line: at start-up every request would log one."""

    def __init__(
        self,
        interval_s: float = NOT_READY_LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._logger = logger
        self._logged: dict[str, float] = {}  # reason -> when its last line was written
        self._since: dict[str, int] = {}  # reason -> 503s answered since its last line

    def note(self, reason: str) -> None:
        """Count one 503 for `reason`; log it if its kind has no line in the last interval."""
        self._since[reason] = self._since.get(reason, 0) + 1
        now = self._clock()
        last = self._logged.get(reason)
        if last is not None and now - last < self.interval_s:
            return
        self._logged[reason] = now
        requests = self._since.pop(reason)
        self._logger.info(
            "state API answers 503 (retry after %ds): reason=%s requests=%d",
            RETRY_AFTER_S,
            reason,
            requests,
        )


#: The worker's one NotReadyLog (a worker is a process), shared by the views and the middleware.
NOT_READY = NotReadyLog()


def not_ready_middleware(not_ready: NotReadyLog | None = None) -> Any:
    """An aiohttp middleware for the routes the state views do not guard (Faust's `/router`
    views): a routing failure (`faust_compat.routing_failure`) is a 503, not a 500 with a
    traceback, and every 503 carries `Retry-After`; each logged by `NotReadyLog`."""
    from aiohttp import web

    log_503 = not_ready or NOT_READY

    @web.middleware
    async def answer_503(request: web.Request, handler: Any) -> web.StreamResponse:
        if str(getattr(request, "path", "")).startswith(GATEWAY_PREFIX):
            passed: web.StreamResponse = await handler(request)
            return passed  # the upstream's answer passes as it came
        try:
            response: web.StreamResponse = await handler(request)
        except Exception as exc:
            reason = faust_compat.routing_failure(exc)
            if reason is None:
                raise
            log_503.note(reason)
            body = {"error": "not ready", "reason": reason}
            return web.json_response(body, status=503, headers=_retry_after())
        if response.status == 503 and "Retry-After" not in response.headers:
            # Faust's own 503 (ServiceUnavailable): its router knows no owner of the partition.
            log_503.note("assignment")
            response.headers.update(_retry_after())
        return response

    return answer_503


def _routed(app: Any, table: Any, not_ready: NotReadyLog) -> Callable[[Handler], Handler]:
    """A view answered by the worker owning the session's partition (the request proxied to it
    by `faust_compat.route_request`), or a 503 while the request cannot be routed yet."""

    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def routed(view: View, request: Request, session_id: str, *args: Any) -> Response:
            # A POST's body goes along to the owner (Faust's own proxy would drop it).
            sent = await request.read() if request.method == "POST" else None
            try:
                answer = await faust_compat.route_request(
                    app, table.name, session_id, view.web, request, sent
                )
            except faust_compat.NotRoutable as exc:
                body = {"error": "not ready", "reason": exc.reason, "session_id": session_id}
                return _unavailable(view, body, exc.reason, not_ready)
            if answer is None:  # this worker owns the partition
                return await handler(view, request, session_id, *args)
            if answer.status == 503 and "Retry-After" not in answer.headers:
                # Faust's proxy keeps only the owner's body, content type and status.
                answer.headers.update(_retry_after())
            proxied: Response = answer
            return proxied

        return routed

    return wrap


def _unless_recovering(
    app: Any, table: Any, progress: RecoveryProgress, not_ready: NotReadyLog | None = None
) -> Callable[[Handler], Handler]:
    """A view (run where the session's partition is) that answers 503 while the session's
    changelog partition is recovered (`recovering`)."""
    log_503 = not_ready or NOT_READY

    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def guarded(view: View, request: Request, session_id: str, *args: Any) -> Response:
            tp = changelog_partition(app, table, session_id)
            busy = recovering(app, session_id, progress, tp)
            if busy is not None:
                return _unavailable(view, busy, "recovering", log_503)
            return await handler(view, request, session_id, *args)

        return guarded

    return wrap


def _unavailable(view: View, body: Any, reason: str, not_ready: NotReadyLog) -> Response:
    """A 503 with `Retry-After`, counted (and maybe logged) under `reason`."""
    not_ready.note(reason)
    return _json(view, body, 503, headers=_retry_after())


def _retry_after() -> dict[str, str]:
    return {"Retry-After": str(RETRY_AFTER_S)}


def _too_long(view: View) -> Response:
    return _json(view, {"error": "id too long", "limit": MAX_ID_CHARS}, 400)


def _json(
    view: View, body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return view.bytes(
        orjson.dumps(body), content_type="application/json", status=status, headers=headers
    )
