"""The live API `sessionfold serve` answers: what a running pi agent asks before each model call.

- `POST /sessions/{id}/context` `{"leaf", "messages", "wait_ms"?}`: waits (bounded) until the
  leaf entry is folded and no flush of the session is with the model (`LiveSession.settled`;
  other sessions' flushes never hold it up), then renders the context as `sessionfold context
  FILE --format json` does for the file as read so far; `changed` false means "keep pi's own
  array" (nothing pruned, or pi's array is not the one the file gives: `reason` says which).
  `stale` when the wait ran out. `epoch` counts the flush attempts folded: the answer only
  changes when it moves. The checks and the answers' shapes are live_contract.py's, shared
  with the fold workers. A session whose file is not folded yet (a start) is waited for; an
  optional `sessionFile` is tailed when it lies under an allowed root, else the answer's
  reason is `not-watched`. Every session route marks its session live (`LiveFolds.asked`).
- `POST /sessions/{id}/compact`: the rule ledger's compaction pass over the file as it is, as
  `sessionfold ledger compact FILE` runs it: `{"status": "summary", "summary", "details",
  "span_record"}`, or `{"status": "fallback", "reason"}` so pi's own compaction runs.
- `POST /sessions/{id}/recall` `{"ids": [...], "whole"?: bool}`: the recall tool's text
  (views/recall.py).
- `GET /sessions/{id}/refs/{ref}`: one original tool result.
- `GET /sessions/{id}/status`: pending batches, metrics, rearmed, last flush, the footer text.
- `GET /sessions/{id}`: the session document of `sessionfold fold --json`.
- `POST /sessions/{id}/client-events`: fail-opens the extension reports (counted only).
- `GET /health`, `GET /metrics` (no token); every other route wants the bearer token when serve
  has one (web/auth.py).
Logs carry session ids, counts and reasons, never message text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sessionfold.ports.ledger.model import DiffModel
from sessionfold.projections.ledger.config import DEFAULT_LEDGER, LedgerConfig
from sessionfold.projections.pruning.digest import message_of
from sessionfold.projections.views.chains import resolve_ref
from sessionfold.projections.views.recall import recall_text
from sessionfold.streams.publishing.session_file import read_session_file
from sessionfold.streams.runtime.ledger_loop import fold_records
from sessionfold.streams.runtime.live import LiveFolds, LiveSession, Rendered
from sessionfold.streams.web import live_contract as contract
from sessionfold.streams.web.auth import token_middleware
from sessionfold.streams.web.live_contract import (
    DEFAULT_WAIT_S,
    MAX_BODY_BYTES,
    MAX_CONTEXT_BODY_BYTES,
    MAX_ID_CHARS,
    MAX_RECALL_IDS,
    MAX_SMALL_BODY_BYTES,
    READ_TIMEOUT_S,
    UNKNOWN_GRACE_S,
    WAIT_STEP_S,
    BadRequest,
    ContextRequest,
    LiveMetrics,
)

if TYPE_CHECKING:
    from sessionfold.streams.web.handover import Handover

log = logging.getLogger(__name__)

#: How often a waiting call looks again when the tailer wakes it (a safety net), seconds.
WAKE_STEP_S = 0.5
#: The longest a status call waits for its leaf (`wait_ms`), ms.
STATUS_WAIT_MAX_MS = 5000.0

__all__ = [
    "DEFAULT_WAIT_S",
    "LIVE_ROUTES",
    "MAX_ID_CHARS",
    "MAX_RECALL_IDS",
    "OUTCOME_HEADER",
    "LiveApi",
    "LiveMetrics",
    "add_live_routes",
    "bounded_middleware",
    "json_response",
    "plan_response",
    "timed_middleware",
]


#: The largest body each live route reads, by its path (the rest: MAX_SMALL_BODY_BYTES).
BODY_LIMITS = {"/sessions/{session_id}/context": MAX_CONTEXT_BODY_BYTES}

#: The live routes (method, path, handler's name), the same on serve's API process
#: (live_front.py) and on the fold process or a worker (here).
LIVE_ROUTES = (
    ("GET", "/health", "health"),
    ("GET", "/metrics", "prometheus"),
    ("GET", "/sessions/{session_id}", "document"),
    ("GET", "/sessions/{session_id}/status", "status"),
    ("GET", "/sessions/{session_id}/refs/{ref}", "ref"),
    ("POST", "/sessions/{session_id}/context", "context"),
    ("POST", "/sessions/{session_id}/compact", "compact"),
    ("POST", "/sessions/{session_id}/recall", "recall"),
    ("POST", "/sessions/{session_id}/client-events", "client_events"),
    ("GET", "/sessions/{session_id}/plan", "plan"),
)


def add_live_routes(app: web.Application, handlers: object) -> None:
    """Route every live route of `app` to the method of `handlers` named for it."""
    for method, path, name in LIVE_ROUTES:
        app.router.add_route(method, path, getattr(handlers, name))


@dataclass
class LiveApi:
    """The routes over one `LiveFolds`."""

    live: LiveFolds
    wait_s: float = DEFAULT_WAIT_S
    diff_model: DiffModel | None = None
    ledger: LedgerConfig = DEFAULT_LEDGER
    metrics: LiveMetrics | None = None
    #: serve's fold process: what its answers were made from goes to the API process
    #: (live_front.py), and each answer says its outcome in a header for that process' metrics.
    handover: Handover | None = None
    #: Run first on the render thread (serve's fold process lowers its CPU priority there).
    on_render_thread: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        if self.metrics is None:
            self.metrics = LiveMetrics.create(CollectorRegistry())
        #: Per session: set (and dropped) when a poll folded lines of its file, what the
        #: context calls waiting for it wait on. Per session, so a busy fleet's lines wake
        #: only the calls they concern.
        self._woken: dict[str, asyncio.Event] = {}
        #: Per session: the last render a plan was made of, and that plan encoded.
        self._plans: dict[str, tuple[Rendered, bytes]] = {}
        #: Whether the tailer wakes waiting calls (`_hook`): then their look again is only a
        #: safety net, not a poll every WAIT_STEP_S.
        self._hooked = False
        #: Renders run on one thread while the app runs: more would only contend for the GIL
        #: with the event loop (which answers kept renders) and the tailer, and lengthen every
        #: call's wait for it.
        self._renders: ThreadPoolExecutor | None = None
        #: `live.set_aside_total` as counted in `metrics` so far.
        self._set_aside_counted = 0

    # --- the routes -------------------------------------------------------------------------

    async def context(self, request: web.Request) -> web.Response:
        """The context the model should be sent (see the module docstring)."""
        session_id = _id(request)
        body = await _body(request)
        try:
            asked = contract.context_request(body, self.wait_s)
        except BadRequest as exc:
            raise _bad(str(exc)) from None
        leaf, wait = asked.leaf, asked.wait_s
        started = time.monotonic()
        live = self.live
        live.asked(session_id)  # live: its flushes go to the model
        if (
            asked.session_file is not None
            and session_id not in live.sessions
            and live.holder(session_id) is None
        ):
            refused = live.adopt(asked.session_file, session_id)
            if refused is not None:  # its reason is in serve's log (one warning a file)
                return json_response(
                    contract.unchanged(session_id, leaf, 0, contract.NOT_WATCHED, stale=False)
                )
        while True:
            found = await self._wait_for(
                session_id, leaf, started + wait, started + min(wait, UNKNOWN_GRACE_S)
            )
            if found == "unknown":
                # pi writes a new session's file only once its first model call has answered:
                # nothing of it is there to prune yet.
                return json_response(
                    contract.unchanged(session_id, leaf, 0, "unknown-session", stale=False)
                )
            kept = self._kept(session_id, asked) if found == "folded" else None
            if kept is None:
                kept = await asyncio.get_running_loop().run_in_executor(
                    self._renders, self._context_now, session_id, asked, found != "folded"
                )
            if kept is not None:
                break
            # A flush of the session went to the model between the wait and the render: wait
            # for its answer too (within the same bound).
        head, field, payload = kept
        return json_response(head, spliced=None if payload is None else (field, payload))

    def _kept(
        self, session_id: str, request: ContextRequest
    ) -> tuple[dict[str, Any], str, bytes | None] | None:
        """The answer from the kept render, on the loop, when the session folded nothing since
        (else None: render in a thread). Without the lock: the counters move only after a
        fold, so equal counters mean the kept render is of the state as it stands (or was a
        fold ago, at a line's end), and the leaf was folded before it (`_wait_for`)."""
        session = self.live.sessions.get(session_id)
        rendered = None if session is None else session.rendered
        if session is None or rendered is None or rendered.state != session.state():
            return None
        if not rendered.settled:
            return None  # a stale call's render, half a flush
        return self._answer(session_id, request, False, rendered)

    async def _wait_for(
        self, session_id: str, leaf: str | None, deadline: float, unknown_until: float
    ) -> Literal["folded", "unknown", "stale"]:
        """`folded` once the leaf (with none, the session) is folded and the session is
        settled (no answer of it with the model: `LiveSession.settled`); `unknown` when no
        file holds the session by `unknown_until`; `stale` when that is not so by `deadline`.

        The look takes no lock and no thread (a dict and a set lookup): waiting calls cost the
        tailer nothing. A poll that folded lines of the session wakes them (`_woken`); the
        step is the bound when nothing wakes them (a `LiveFolds` polled by some other loop)."""
        poked = False
        step = WAKE_STEP_S if self._hooked else WAIT_STEP_S
        while True:
            session = self.live.sessions.get(session_id)
            if _done(session, leaf) and (leaf is not None or self.live.holder(session_id) is None):
                return "folded"  # most calls: no event made, nothing for the tailer to wake
            # Taken before the look again: a fold after it sets this one (the tailer and the
            # answers wake only the sessions that have one, after they folded theirs).
            woken = self._woken.setdefault(session_id, asyncio.Event())
            session = self.live.sessions.get(session_id)
            if _done(session, leaf) and (leaf is not None or self.live.holder(session_id) is None):
                return "folded"
            now = time.monotonic()
            # A file whose name or header says it holds the session, not folded yet (a start's
            # fold, a file the call named): wait for it as for a leaf.
            pending = session is None and self.live.holder(session_id) is not None
            if session is None and not pending:
                if now >= unknown_until:
                    if self._woken.get(session_id) is woken and not woken.is_set():
                        del self._woken[session_id]  # no event kept for ids no file holds
                    return "unknown"
                self.live.rescan.set()  # a file just written: the tailer looks for it now
                left = unknown_until - now
            else:
                left = deadline - now
                if left <= 0:
                    return "stale"
            if not poked and (session is None or session.settled):
                # pi writes the leaf entry before it asks: one poll of its file now most likely
                # folds it (once a call: a leaf that never comes must not keep the tailer
                # polling); a file not folded yet is folded before the others.
                self.live.want(session_id)
                poked = session is not None or pending
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), min(left, step))

    async def _present(self, session_id: str) -> bool:
        """Whether the session is held, once a file its name or header says holds it (an
        evicted session's, a start's fold) is folded, within `wait_s`: a call that needs the
        session's state waits for that fold as a context call does. The caller marked the
        session asked first, so it is not evicted again before it answers."""
        if session_id in self.live.sessions:
            return True
        if self.live.holder(session_id) is None:
            return False
        started = time.monotonic()
        await self._wait_for(session_id, None, started + self.wait_s, started)
        return session_id in self.live.sessions

    def _wake(self, session_id: str) -> None:
        """Wake the calls waiting for `session_id` (on the loop); later ones wait on a fresh
        event."""
        woken = self._woken.pop(session_id, None)
        if woken is not None:
            woken.set()

    def _context_now(
        self, session_id: str, request: ContextRequest, stale: bool
    ) -> tuple[dict[str, Any], str, bytes | None] | None:
        """The answer's fields, and its encoded array (or patch) when it carries one; None
        when, not `stale`, the session is no longer settled (wait for its answer first)."""
        try:
            rendered = self.live.rendered(session_id, contract.epoch_of)
        except KeyError:  # dropped since the wait (its file set aside or replaced)
            answer = contract.unchanged(session_id, request.leaf, 0, "unknown-session", False)
            return answer, "", None
        if not stale and not rendered.settled:
            return None  # half a flush, which no synchronous fold shows (a rare race)
        return self._answer(session_id, request, stale, rendered)

    def _answer(
        self,
        session_id: str,
        request: ContextRequest,
        stale: bool,
        rendered: Rendered,
    ) -> tuple[dict[str, Any], str, bytes | None]:
        """The answer's fields from one render, and the field its encoded array (or patch)
        goes in, with the encoding, when it carries one."""
        answer = contract.context_head(
            session_id,
            request,
            rendered.epoch,
            stale,
            rendered.tokens,
            rendered.identities,
            lambda: rendered.pruned,
        )
        if not stale and self.handover is not None:
            # serve's API process answers the calls after this one from what it is handed.
            self.handover.answered(session_id, request.patch, rendered)
        if not answer["changed"]:
            return answer, "", None
        # The render's array (or patch) goes out as encoded once per render (`_json` splices
        # it in), not built and encoded again per call.
        if request.patch:
            return answer, "patch", rendered.patch_json
        return answer, "messages", rendered.messages_json

    async def plan(self, request: web.Request) -> web.Response:
        """The gateway's rewrite plan for the session as it is folded now (views/rewrite.py):
        never waits for a leaf (the gateway passes results the fold has not seen yet), only for
        an evicted session's file to be folded again."""
        session_id = _id(request)
        self.live.asked(session_id)  # live, and kept (never evicted)
        if not await self._present(session_id):
            encoded: bytes | None = contract.unknown_plan(session_id)
        else:
            encoded = await asyncio.get_running_loop().run_in_executor(
                self._renders, self._plan_now, session_id
            )
        return plan_response(request, encoded or contract.unknown_plan(session_id))

    def _plan_now(self, session_id: str) -> bytes | None:
        """The plan of the session's current render, encoded once per render."""
        try:
            rendered = self.live.rendered(session_id, contract.epoch_of)
        except KeyError:  # dropped meanwhile
            return None
        kept = self._plans.get(session_id)
        if kept is not None and kept[0] is rendered:
            return kept[1]
        encoded = contract.plan_json(session_id, rendered.view, rendered.epoch)
        self._plans[session_id] = (rendered, encoded)
        return encoded

    async def compact(self, request: web.Request) -> web.Response:
        """The ledger's compaction summary for the session as its file stands, or a fallback."""
        session_id = _id(request)
        await _body(request)
        self.live.asked(session_id)
        with self.live.lock:
            session = self.live.sessions.get(session_id)
            # An evicted session's file is all this needs: no fold of it again.
            path = self.live.evicted.get(session_id) if session is None else session.path
        if path is None:
            return json_response(contract.fallback("unknown-session"))
        try:
            payload = await asyncio.to_thread(self._compaction, path)
        except Exception as exc:  # never an error pi cannot survive: its own compaction runs
            log.warning(
                "live compact failed", extra={"session": session_id, "error": type(exc).__name__}
            )
            return json_response(contract.fallback(f"error:{type(exc).__name__}"))
        return json_response(contract.compact_answer(payload))

    def _compaction(self, path: Any) -> dict[str, Any] | None:
        """`sessionfold ledger compact FILE`'s passes over the file: the last one's payload."""
        from sessionfold.ports.ledger.model import OfflineModel

        model = self.diff_model or OfflineModel()
        run = fold_records(read_session_file(path), model, config=self.ledger, compact=True)
        return run.payloads[-1] if run.payloads else None

    async def recall(self, request: web.Request) -> web.Response:
        """The recall tool's text for the refs or tool call ids asked."""
        session_id = _id(request)
        body = await _body(request)
        try:
            ids = contract.recall_request(body)
            whole = contract.recall_whole(body)
        except BadRequest as exc:
            raise _bad(str(exc)) from None
        self.live.asked(session_id)
        await self._present(session_id)
        with self.live.lock:
            session = self.live.sessions.get(session_id)
            if session is None:
                return json_response({"error": "unknown session"}, 404)
            store = self.live.runtime.store
            text, found = recall_text(store, session_id, ids, session.entry_at, whole)
        return json_response({"text": text, "found": found})

    async def ref(self, request: web.Request) -> web.Response:
        """One original tool result, by ref."""
        session_id = _id(request)
        ref = request.match_info["ref"]
        if not _is_id(ref):
            raise _bad("ref too long")
        self.live.asked(session_id)
        await self._present(session_id)
        with self.live.lock:
            session = self.live.sessions.get(session_id)
            if session is None:
                return json_response({"error": "unknown session"}, 404)
            seq = resolve_ref(self.live.runtime.store, session_id, ref)
            entry = session.entry_at(seq) if seq is not None else None
        message = message_of(entry) if entry is not None else None
        if message is None or message.get("role") != "toolResult":
            return json_response({"error": "unknown ref"}, 404)
        return json_response(
            {
                "session_id": session_id,
                "ref": ref,
                "seq": seq,
                "tool_call_id": message.get("toolCallId"),
                "tool_name": message.get("toolName"),
                "is_error": bool(message.get("isError", False)),
                "content": message.get("content"),
            }
        )

    async def status(self, request: web.Request) -> web.Response:
        """A small document to poll each turn. With `?leaf=ID&wait_ms=N` it first waits (as a
        context call does, at most N ms, 5 s at most) until the leaf is folded and no flush of
        the session is with the model: the footer then shows the state the turn left, not the
        one before its last lines were read (issue #40)."""
        session_id = _id(request)
        leaf = request.query.get("leaf")
        # Asked first: a session folded again for this call is not evicted before it answers.
        self.live.asked(session_id)
        if leaf:
            try:
                asked = float(request.query.get("wait_ms", "0"))
            except ValueError:
                asked = math.nan
            if not math.isfinite(asked):
                raise _bad("wait_ms is not a number")
            wait = min(max(asked, 0.0), STATUS_WAIT_MAX_MS)
            started = time.monotonic()
            until = started + wait / 1000
            await self._wait_for(
                session_id, leaf[:MAX_ID_CHARS], until, min(until, started + UNKNOWN_GRACE_S)
            )
        else:
            await self._present(session_id)
        with self.live.lock:
            if session_id not in self.live.sessions:
                return json_response(contract.unknown_status(session_id))
            document = self.live.document(session_id)
            kept = self.live.sessions[session_id].rendered  # the last render: the footer's reclaim
            reclaim = None if kept is None else kept.tokens
            answer = contract.status_answer(session_id, self.live.runtime.store, document, reclaim)
        return json_response(answer)

    async def document(self, request: web.Request) -> web.Response:
        """The session document (`sessionfold fold --json`'s)."""
        session_id = _id(request)
        self.live.asked(session_id)
        await self._present(session_id)
        with self.live.lock:
            if session_id not in self.live.sessions:
                return json_response({"error": "unknown session"}, 404)
            return json_response(self.live.document(session_id))

    async def client_events(self, request: web.Request) -> web.Response:
        """Count what the extension reports (fail-opens by kind)."""
        body = await _body(request)
        assert self.metrics is not None
        self.metrics.fail_open(body.get("kind"))
        return web.Response(status=204)

    async def health(self, _request: web.Request) -> web.Response:
        """Always 200 while the server runs: the sessions held, the files set aside now and
        since the start (docs/live.md, Faults)."""
        return json_response(
            {
                "status": "ok",
                "sessions": self.live.session_count(),
                "files_set_aside": self.live.files_set_aside(),
                "files_set_aside_total": self.live.set_aside_total,
            }
        )

    async def prometheus(self, _request: web.Request) -> web.Response:
        """The live metrics in Prometheus' text format."""
        assert self.metrics is not None
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    # --- the app ------------------------------------------------------------------------------

    def app(
        self, token: str | None, read_timeout_s: float | None = READ_TIMEOUT_S
    ) -> web.Application:
        """The aiohttp application: the routes behind the token guard, each one timed, each
        body read within its route's bound (and `read_timeout_s`, None: no bound)."""
        app = web.Application(
            middlewares=[
                token_middleware(token),
                timed_middleware(self.metrics, with_outcome=self.handover is not None),
                bounded_middleware(read_timeout_s),
            ],
            client_max_size=MAX_BODY_BYTES + 1,  # read() refuses a body of the bound itself
        )
        app.on_startup.append(self._hook)
        app.on_cleanup.append(self._unhook)
        add_live_routes(app, self)
        return app

    async def _hook(self, _app: web.Application) -> None:
        """Have the live folds wake waiting calls (the tailer runs on its own thread)."""
        loop = asyncio.get_running_loop()

        def woken(session_id: str) -> None:
            # Only when a call waits for the session: every hop onto the loop costs it a turn
            # at the GIL, which at a busy fleet's line rate starved the calls it answers.
            if session_id not in self._woken:
                return
            # The loop may close under a last poll: nobody waits any more then.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake, session_id)

        handover = self.handover

        def moved(session_id: str) -> None:
            handover.moved(session_id)  # type: ignore[union-attr]
            woken(session_id)

        self.live.on_lines = woken if handover is None else moved
        metrics = self.metrics
        assert metrics is not None
        counted = threading.Lock()
        live = self.live

        def set_aside() -> None:
            # The total so far less what was counted: also the files set aside before the
            # app started (serve's tailer starts first).
            with counted:
                metrics.files_set_aside.inc(live.set_aside_total - self._set_aside_counted)
                self._set_aside_counted = live.set_aside_total
            if handover is not None:
                handover.set_aside()  # counted where serve's /metrics is: the API process

        def dropped(session_id: str) -> None:
            if handover is not None:
                handover.dropped(session_id)
            woken(session_id)  # a call waiting for it answers unknown-session

        self.live.on_set_aside = set_aside
        self.live.on_dropped = dropped
        set_aside()
        self._hooked = True
        self._renders = ThreadPoolExecutor(
            1, thread_name_prefix="sessionfold-render", initializer=self.on_render_thread
        )

    async def _unhook(self, _app: web.Application) -> None:
        self.live.on_lines = None
        self.live.on_set_aside = None
        self.live.on_dropped = None
        self._hooked = False
        renders, self._renders = self._renders, None
        if renders is not None:
            renders.shutdown(wait=False, cancel_futures=True)


#: The header serve's fold process gives each answer's metric outcome in (live_front.py
#: counts it and drops the header).
OUTCOME_HEADER = "X-Sessionfold-Outcome"


def timed_middleware(metrics: LiveMetrics | None, with_outcome: bool = False) -> Any:
    """A middleware timing each call into `metrics` (by route and outcome) and giving its
    time in a `Server-Timing` header; with `with_outcome`, the outcome in `OUTCOME_HEADER`."""
    assert metrics is not None

    @web.middleware
    async def timed(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        route = request.match_info.route.name or _route_name(request)
        started = time.monotonic()
        response = await handler(request)
        took = time.monotonic() - started
        outcome = response.headers.pop(OUTCOME_HEADER, None) or _outcome(response)
        metrics.seconds.labels(route).observe(took)
        metrics.calls.labels(route, outcome).inc()
        if with_outcome:
            response.headers[OUTCOME_HEADER] = outcome
        # The server's own time (W3C Server-Timing): a client tells it from its own delays.
        response.headers["Server-Timing"] = f"total;dur={took * 1000:.3f}"
        return response

    return timed


def bounded_middleware(read_timeout_s: float | None, limits: dict[str, int] = BODY_LIMITS) -> Any:
    """A middleware reading each body before its handler, within its route's bound
    (`limits` by path, `BODY_LIMITS` by default) and `read_timeout_s` (None: no bound): a body
    declared or found larger is
    answered 413, one not in within the time 408, and the connection is closed (the rest of
    the body is never read, nor relayed). The handler's `request.read()` gets the bytes read."""

    @web.middleware
    async def bounded(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        resource = request.match_info.route.resource
        path = None if resource is None else resource.canonical
        limit = limits.get(path, MAX_SMALL_BODY_BYTES) if path else MAX_SMALL_BODY_BYTES
        length = request.content_length
        if length is not None and length > limit:
            return _closed(413, "the body is too large", length, limit)
        if not request.can_read_body:
            return await handler(request)
        # aiohttp's own bound, per route: read() raises once the body reaches it. The apps'
        # is the context route's (MAX_BODY_BYTES), so the hot route needs no clone (36 us).
        if limit != MAX_BODY_BYTES:
            request = request.clone(client_max_size=limit + 1)
        try:
            if request.content.is_eof():  # came whole with the headers: nothing to wait for
                await request.read()
            else:
                async with asyncio.timeout(read_timeout_s):
                    await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _closed(413, "the body is too large", None, limit)
        except TimeoutError:
            return _closed(408, "the body did not come in time", None, limit)
        return await handler(request)

    return bounded


def _closed(status: int, why: str, length: int | None, limit: int) -> web.Response:
    """An error answer after which the connection is closed (its body is not read on)."""
    log.info("live: a request refused", extra={"status": status, "bytes": length, "limit": limit})
    response = json_response({"error": why}, status)
    response.force_close()
    return response


def _done(session: LiveSession | None, leaf: str | None) -> bool:
    """Whether a context call for `leaf` (None: any) of `session` may be answered now."""
    return session is not None and session.settled and (leaf is None or leaf in session.ids)


def _route_name(request: web.Request) -> str:
    """The route's last fixed part (`context`, `status`, ...): a bounded label."""
    resource = request.match_info.route.resource
    canonical = resource.canonical if resource is not None else "unknown"
    last = canonical.rstrip("/").rsplit("/", 1)[-1]
    return "session" if last == "{session_id}" else "ref" if last == "{ref}" else last or "root"


def _outcome(response: web.StreamResponse) -> str:
    outcome = getattr(response, "sessionfold_outcome", None)
    return outcome if isinstance(outcome, str) else str(response.status)


def _id(request: web.Request) -> str:
    session_id = request.match_info["session_id"]
    if not _is_id(session_id):
        raise _bad("session id too long")
    return session_id


def _is_id(value: Any) -> bool:
    return contract.is_id(value)


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        raise _bad("the body is not JSON") from None
    if not isinstance(body, dict):
        raise _bad("the body is not a JSON object")
    return body


def _bad(why: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        text=orjson.dumps({"error": why}).decode(), content_type="application/json"
    )


def json_response(
    body: Any, status: int = 200, spliced: tuple[str, bytes] | None = None
) -> web.Response:
    """`body` as a JSON answer (with `spliced`'s encoded field appended), its outcome kept
    for the metrics when it is a context answer."""
    encoded = orjson.dumps(body)
    if spliced is not None:
        # The render's array or patch, encoded once per render: spliced in as the last field,
        # the bytes orjson.dumps of the whole answer gives.
        field, payload = spliced
        encoded = encoded[:-1] + b',"' + field.encode() + b'":' + payload + b"}"
    response = web.Response(body=encoded, status=status, content_type="application/json")
    if isinstance(body, dict) and "changed" in body:
        response.sessionfold_outcome = contract.outcome(body)  # type: ignore[attr-defined]
    return response


def plan_response(request: web.Request, encoded: bytes) -> web.Response:
    """The plan route's answer: the plan with its `ETag`, or a 304 without a body when the
    request's `If-None-Match` names it (a gateway's cached plan is still the plan)."""
    tag = {"ETag": contract.plan_tag(encoded)}
    if contract.not_modified(request.headers.get("If-None-Match"), encoded):
        return web.Response(status=304, headers=tag)
    return web.Response(body=encoded, content_type="application/json", headers=tag)
