"""`sessionfold serve`'s API process: the live routes, with the fold in a process of its own.

serve runs two processes (cli/serve.py). The fold process runs `LiveFolds` (the tailer, the
folds, the answers to flushes, the renders) and the live API over it (live_api.py) on a private
Unix socket; this process listens on serve's port and answers most calls there by handing them
on as they came (`LiveFront._relay`: the answer's bytes come back as they are). A caught-up
context call, though, is answered here, from what the fold process handed over after its last
answer for the session (`Handover`, handover.py): so it never waits for the GIL behind the
folds, which at a busy fleet's line rate put its p99 in the hundreds of milliseconds
(docs/live.md).

What is handed over, per session, by the fold process (a pipe, one frame per message):

- `render`: after a context answer the fold process made from a settled render (not stale):
  the render's state was the session's then, its epoch, tokens, the unpruned array's shape,
  whether the context differs from it, the encoded array or patch the call asked for, and the
  entry ids folded since the last render handed over (so this process knows every leaf folded
  up to the render);
- `form`: the other encoding of the same render, when a later call asks for it;
- `moved`: the session folded something since the render handed over (a line, an answer):
  that render no longer answers. Sent by the fold's `on_lines` hook, which runs after every
  fold of the session, so a render is dropped here once the state it was made at has moved.

A call is answered here when the session has a render handed over that no `moved` followed and
the call's leaf is among the ids folded up to it: the answer the fold process would give for
the same state (live_contract.context_head, the same encoded bytes spliced in). Anything else
(a leaf not folded yet, a session no render of which is kept, the other routes) goes to the
fold process, which waits and renders as before. Frames are read on this process' event loop;
the fold process writes them from its own threads, under a lock.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sessionfold.projections.views.context import Identity
from sessionfold.streams.web import live_contract as contract
from sessionfold.streams.web.auth import token_middleware
from sessionfold.streams.web.gateway import Gateway
from sessionfold.streams.web.handover import MESSAGES, PATCH, read_frame
from sessionfold.streams.web.live_api import (
    BODY_LIMITS,
    OUTCOME_HEADER,
    LiveMetrics,
    add_live_routes,
    bounded_middleware,
    json_response,
    timed_middleware,
)
from sessionfold.streams.web.live_contract import MAX_BODY_BYTES, READ_TIMEOUT_S, BadRequest

log = logging.getLogger(__name__)

#: How many times a relayed call tries to connect to the fold process, and the pause between.
CONNECT_TRIES = 20
CONNECT_PAUSE_S = 0.05
#: The headers of a relayed answer kept as the fold process gave them.
_KEPT_HEADERS = ("Content-Type", "Retry-After", "WWW-Authenticate")


@dataclass
class KeptRender:
    """A render the fold process handed over: what a context answer is made from."""

    epoch: int
    tokens: dict[str, int]
    identities: list[Identity]
    pruned: bool
    forms: dict[str, bytes]  # the encoded array or patch, by form (those asked so far)
    #: `identities` as a request's JSON shape gives them: a call's shape equal to it needs no
    #: check item by item (contract.context_request's `known`).
    shape: list[list[str | None]] = field(init=False)

    def __post_init__(self) -> None:
        self.shape = [list(identity) for identity in self.identities]


@dataclass
class HandedSession:
    """A session as the API process knows it: the ids folded up to its last render handed
    over, and that render while the session folded nothing since."""

    ids: set[str] = field(default_factory=set)
    kept: KeptRender | None = None


@dataclass
class LiveFront:
    """The API process' routes: caught-up context calls from `sessions`, the rest relayed to
    the fold process' API on `socket_path`."""

    socket_path: str
    wait_s: float = contract.DEFAULT_WAIT_S
    metrics: LiveMetrics | None = None
    sessions: dict[str, HandedSession] = field(default_factory=dict)
    #: Calls answered here (the rest were relayed): a test's and a profile's figure.
    answered_here: int = 0
    #: The fold process' files set aside, as counted in `metrics` so far.
    set_aside_counted: int = 0

    def __post_init__(self) -> None:
        if self.metrics is None:
            self.metrics = LiveMetrics.create(CollectorRegistry())
        self._client: aiohttp.ClientSession | None = None

    async def receive(self, reader: asyncio.StreamReader, ready: asyncio.Future[int]) -> None:
        """Apply the fold process' frames until its pipe ends (`ready` gets its session count
        at its first frame)."""
        while True:
            try:
                message = await read_frame(reader)
            except asyncio.IncompleteReadError:
                return
            if message[0] == "ready":
                if not ready.done():
                    ready.set_result(message[1])
                continue
            self.apply(message)

    def apply(self, message: tuple[Any, ...]) -> None:
        """Apply one frame of the fold process (`render`, `form`, `moved`, `dropped` or
        `set-aside`)."""
        kind, session_id = message[0], message[1]
        if kind == "set-aside":  # the total: a frame sent twice counts nothing twice
            assert self.metrics is not None
            total = int(message[1])
            if total > self.set_aside_counted:
                self.metrics.files_set_aside.inc(total - self.set_aside_counted)
                self.set_aside_counted = total
            return
        if kind == "dropped":
            self.sessions.pop(session_id, None)  # its ids too: another file's may follow
            return
        handed = self.sessions.get(session_id)
        if handed is None:
            handed = self.sessions[session_id] = HandedSession()
        if kind == "render":
            _, _, ids, (epoch, tokens, identities, pruned, forms) = message
            handed.ids.update(ids)
            handed.kept = KeptRender(epoch, tokens, identities, pruned, forms)
        elif kind == "form":
            if handed.kept is not None:
                handed.kept.forms[message[2]] = message[3]
        elif kind == "moved":
            handed.kept = None

    # --- the routes -------------------------------------------------------------------------

    async def context(self, request: web.Request) -> web.Response:
        """A caught-up call from the render handed over, any other relayed."""
        body = await request.read()
        # A body that is no JSON object is refused here: never relayed for the fold process
        # to read and parse again (the answer is the one it gives).
        parsed = _json_object(body)
        if not isinstance(parsed, dict):
            return parsed
        answered = self._caught_up(request.match_info["session_id"], parsed)
        if answered is not None:
            self.answered_here += 1
            return answered
        return await self._relay(request, body)

    def caught_up(self, session_id: str, body: bytes) -> web.Response | None:
        """The answer from the session's render handed over, if the call may have it (else
        None: a bad body is the fold process' to refuse, as everything else)."""
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        return self._caught_up(session_id, parsed) if isinstance(parsed, dict) else None

    def _caught_up(self, session_id: str, parsed: dict[str, Any]) -> web.Response | None:
        """`caught_up` of a body parsed."""
        handed = self.sessions.get(session_id)
        kept = None if handed is None else handed.kept
        if handed is None or kept is None or not contract.is_id(session_id):
            return None
        try:
            asked = contract.context_request(parsed, self.wait_s, (kept.shape, kept.identities))
        except BadRequest:
            return None
        if asked.leaf is not None and asked.leaf not in handed.ids:
            return None
        answer = contract.context_head(
            session_id, asked, kept.epoch, False, kept.tokens, kept.identities, lambda: kept.pruned
        )
        if not answer["changed"]:
            return json_response(answer)
        form = PATCH if asked.patch else MESSAGES
        encoded = kept.forms.get(form)
        if encoded is None:
            return None  # the fold process encodes it, and hands it over
        return json_response(answer, spliced=(form, encoded))

    async def relay(self, request: web.Request) -> web.Response:
        """Any other route: the fold process' answer."""
        return await self._relay(request, await request.read())

    # The routes the fold process answers, relayed as they came.
    health = document = status = ref = compact = recall = plan = relay

    async def fetch_plan(self, session_id: str) -> dict[str, Any] | None:
        """The fold process' rewrite plan for a session (the gateway's), or None when it is
        not answering (the caller bounds the wait)."""
        assert self._client is not None
        async with self._client.get(f"/sessions/{quote(session_id, safe='')}/plan") as answer:
            if answer.status != 200:
                return None
            plan: dict[str, Any] = orjson.loads(await answer.read())
            return plan

    async def client_events(self, request: web.Request) -> web.Response:
        """Count what the extension reports (here: this process' metrics are serve's)."""
        parsed = _json_object(await request.read())
        if not isinstance(parsed, dict):  # the fold process' 400, never relayed
            return parsed
        assert self.metrics is not None
        self.metrics.fail_open(parsed.get("kind"))
        return web.Response(status=204)

    async def prometheus(self, _request: web.Request) -> web.Response:
        """The live metrics in Prometheus' text format."""
        assert self.metrics is not None
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _relay(self, request: web.Request, body: bytes) -> web.Response:
        """The call as it came, to the fold process' API; its answer as it came back."""
        assert self._client is not None
        data = body if request.method == "POST" else None
        for attempt in range(CONNECT_TRIES):
            try:
                async with self._client.request(
                    request.method, request.rel_url, data=data, headers=_content_type(request)
                ) as answer:
                    payload = await answer.read()
                    headers = {k: answer.headers[k] for k in _KEPT_HEADERS if k in answer.headers}
                    outcome = answer.headers.get(OUTCOME_HEADER)
                    status = answer.status
                break
            except aiohttp.ClientConnectorError as exc:
                # Not connected, so nothing was sent: trying again is safe (a full accept
                # queue refuses a connection at once).
                if attempt + 1 < CONNECT_TRIES:
                    await asyncio.sleep(CONNECT_PAUSE_S)
                    continue
                return _unanswered(exc)
            except (aiohttp.ClientError, OSError) as exc:
                return _unanswered(exc)
        response = web.Response(body=payload, status=status, headers=headers)
        if outcome is not None:
            response.headers[OUTCOME_HEADER] = outcome  # counted (and dropped) by the middleware
        return response

    # --- the app ------------------------------------------------------------------------------

    def app(
        self,
        token: str | None,
        read_timeout_s: float | None = READ_TIMEOUT_S,
        gateway: Gateway | None = None,
    ) -> web.Application:
        """The aiohttp application: live_api.py's routes behind the token guard, each timed,
        each body read within its route's bound and `read_timeout_s`; with `gateway`, the
        model API routes Claude Code and Codex call (gateway.py) beside them."""
        limits = dict(BODY_LIMITS)
        if gateway is not None:
            limits.update(gateway.body_limits())
        app = web.Application(
            middlewares=[
                token_middleware(token),
                timed_middleware(self.metrics),
                bounded_middleware(read_timeout_s, limits),
            ],
            client_max_size=MAX_BODY_BYTES + 1,  # read() refuses a body of the bound itself
        )
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        add_live_routes(app, self)
        if gateway is not None:
            gateway.plans = self.fetch_plan
            gateway.add_routes(app)
        return app

    async def _open(self, _app: web.Application) -> None:
        # No connection limit: every waiting context call holds one (200 sessions, 200 calls).
        connector = aiohttp.UnixConnector(path=self.socket_path, limit=0)
        timeout = aiohttp.ClientTimeout(total=None)  # the fold process bounds each wait
        self._client = aiohttp.ClientSession(
            "http://fold", connector=connector, timeout=timeout, auto_decompress=False
        )

    async def _close(self, _app: web.Application) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()


def _json_object(body: bytes) -> dict[str, Any] | web.Response:
    """The body parsed, or the fold process' 400 for a body that is no JSON object."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return json_response({"error": "the body is not JSON"}, 400)
    if not isinstance(parsed, dict):
        return json_response({"error": "the body is not a JSON object"}, 400)
    return parsed


def _unanswered(exc: BaseException) -> web.Response:
    log.warning("live: the fold process did not answer", extra={"error": type(exc).__name__})
    return json_response({"error": "the fold process is not answering"}, 503)


def _content_type(request: web.Request) -> dict[str, str]:
    kind = request.headers.get("Content-Type")
    return {} if kind is None else {"Content-Type": kind}
