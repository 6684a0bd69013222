"""The gateway: `sessionfold serve` answers the model APIs Claude Code and Codex call and
forwards each call to the real provider, streaming the answer back as it comes.

Point an agent at serve (Claude Code: `ANTHROPIC_BASE_URL=http://127.0.0.1:6068`; Codex: a
`model_providers` entry whose `base_url` is `http://127.0.0.1:6068/v1`) and each call goes to
the upstream of its API (`--anthropic-upstream`, `--openai-upstream`) with the agent's own
headers, its key among them, and the answer comes back byte for byte: status, headers (but the
hop-by-hop ones) and body, each chunk written as it arrives. The gateway never retries a call
and never answers for the provider: an upstream it cannot reach is a 502 in the API's own error
shape, an upstream error passes as it came. Nothing of a call is logged, stored or counted but
its API, its session id (from the agent's headers: model_api.py), its outcome and the usage its
answer reports (read out of the stream as it passes: `UsageTap`).

When serve has an API token, a call must carry it in `X-Sessionfold-Token` (the agent's own
`Authorization` is its provider key): Claude Code's `ANTHROPIC_CUSTOM_HEADERS`, a Codex
provider's `http_headers`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from sessionfold.streams.web.anthropic_api import ANTHROPIC
from sessionfold.streams.web.auth import GATEWAY_TOKEN_HEADER
from sessionfold.streams.web.cache_policy import CachePolicy, Chain, Tail
from sessionfold.streams.web.live_contract import MAX_CONTEXT_BODY_BYTES
from sessionfold.streams.web.model_api import USAGE_PARTS, ChainSpan, ModelApi
from sessionfold.streams.web.openai_api import OPENAI

log = logging.getLogger(__name__)

#: Every API the gateway answers.
APIS = (ANTHROPIC, OPENAI)
#: Headers that belong to one connection, not to the call (RFC 9110 §7.6.1), and the ones the
#: HTTP client sets itself for the upstream connection.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
#: The header a call carries serve's API token in (the agent's `Authorization` is its key's).
TOKEN_HEADER = GATEWAY_TOKEN_HEADER.lower()
#: Headers the HTTP client adds unasked; sent upstream only when the agent sent them.
_CLIENT_DEFAULTS = ("accept", "accept-encoding", "user-agent")
#: The most bytes of one stream event the usage tap holds (a bigger event is not read).
MAX_EVENT_BYTES = 4 * 1024 * 1024
#: Sessions whose usage is kept in memory (the least recently used go first).
MAX_SESSIONS = 10_000
#: How long the upstream may take to accept a connection; an answer may stream for as long as
#: the model writes (the agent bounds it).
CONNECT_TIMEOUT_S = 10.0
#: How long a call waits for the fold's plan before it goes upstream unchanged: a caught-up
#: render takes a few ms; a call never waits on the tailer.
PLAN_TIMEOUT_S = 0.25
#: A JSON number of 19 digits or more, which may be an integer past 64 bits (the same after a
#: colon, comma or bracket inside a string: then the call merely goes unchanged).
_LONG_NUMBER = re.compile(rb"[:,\[]\s*-?\d{19}")
#: Every digit as "0": a body with no run of 19 zeros then has no long number at all.
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_NINETEEN_DIGITS = b"0" * 19
#: Fetches the fold's rewrite plan of a session ({"known", "results": {call id: text},
#: "chains": [{"id", "calls", "text"}]}: views/rewrite.py).
PlanSource = Callable[[str], Awaitable[dict[str, Any] | None]]


def has_long_number(body: bytes) -> bool:
    """Whether `body` may hold a JSON integer past 64 bits (`_LONG_NUMBER` matches in it)."""
    # The regex alone walks every byte in Python's engine (3 ms on an 800 KB body); a run of 19
    # digits is rare, and translate plus a substring search are memchr-fast (0.6 ms).
    if _NINETEEN_DIGITS not in body.translate(_DIGITS_AS_ZERO):
        return False
    return _LONG_NUMBER.search(body) is not None


def default_upstreams() -> dict[str, str]:
    """Each API's provider, by API name: where the gateway sends calls unless told."""
    return {api.name: api.default_upstream for api in APIS}


@dataclass(frozen=True)
class GatewayMetrics:
    """The gateway's Prometheus counters (bounded labels: api, outcome, part)."""

    calls: Counter
    tokens: Counter
    chars: Counter
    fail_open: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> GatewayMetrics:
        """The counters, registered in `registry`."""
        return cls(
            Counter(
                "sessionfold_gateway_calls_total",
                "Model API calls the gateway relayed, by API and outcome "
                "(answered: the upstream's answer passed on, whatever its status; unreachable: "
                "no upstream answer; cut: the stream ended early on either side).",
                ["api", "outcome"],
                registry=registry,
            ),
            Counter(
                "sessionfold_gateway_tokens_total",
                "Tokens the upstream's answers report, by API and part (input read fresh, "
                "cache_read, cache_write, output).",
                ["api", "part"],
                registry=registry,
            ),
            Counter(
                "sessionfold_gateway_request_chars_total",
                "Request body bytes the agents asked to send and the gateway sent, by API "
                "(sent below asked: what the rewrite freed).",
                ["api", "side"],
                registry=registry,
            ),
            Counter(
                "sessionfold_gateway_unchanged_total",
                "Calls sent upstream unchanged although their session has a plan, by reason "
                "(plan-timeout, plan-unavailable, rewrite-numbers, rewrite-invalid, "
                "rewrite-failed).",
                ["reason"],
                registry=registry,
            ),
        )


class UsageTap:
    """Reads the usage an answer's server-sent events report as they pass, holding at most one
    event's bytes; only the API's usage events are parsed."""

    def __init__(self, api: ModelApi) -> None:
        self.api = api
        self.usage: dict[str, int] = {}
        self._pending = bytearray()
        self._off = False

    def feed(self, chunk: bytes) -> None:
        """Take the next bytes of the stream."""
        if self._off:
            return
        self._pending += chunk
        while (end := self._pending.find(b"\n\n")) >= 0:
            block = bytes(self._pending[:end])
            del self._pending[: end + 2]
            self._event(block)
        if len(self._pending) > MAX_EVENT_BYTES:
            self._off = True  # no usage event is that large: stop reading, keep relaying
            self._pending.clear()

    def _event(self, block: bytes) -> None:
        name = ""
        data: list[bytes] = []
        for line in block.split(b"\n"):
            line = line.rstrip(b"\r")
            if line.startswith(b"event:"):
                name = line[6:].strip().decode("utf-8", "replace")
            elif line.startswith(b"data:"):
                data.append(line[5:].strip())
        if name not in self.api.usage_events:
            return
        try:
            parsed = orjson.loads(b"\n".join(data))
        except orjson.JSONDecodeError:
            return
        found = self.api.usage_of(name, parsed)
        if found:
            self.usage.update(found)


@dataclass
class Gateway:
    """The gateway's routes: each API's calls relayed to its upstream (base URLs by API name)."""

    upstreams: dict[str, str]
    token: str | None = None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    #: Per session: the usage its answers reported, summed (least recently used first).
    sessions: OrderedDict[str, dict[str, int]] = field(default_factory=OrderedDict)
    #: Where the rewrite plans come from (serve: the fold process); None: pass-through only.
    plans: PlanSource | None = None
    policy: CachePolicy = field(default_factory=CachePolicy)

    def __post_init__(self) -> None:
        self.metrics = GatewayMetrics.create(self.registry)
        self._client: httpx.AsyncClient | None = None
        self._warned: set[str] = set()  # the fail-open kinds warned about once

    def add_routes(self, app: web.Application) -> None:
        """Route every API's calls (and the usage route) on `app`; the client opens with it."""
        for api in APIS:
            handler = self._handler(api)
            for method, path in api.routes:
                app.router.add_route(method, path, handler)
        app.router.add_route("GET", "/gateway/sessions/{session_id}", self.session_usage)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)

    def body_limits(self) -> dict[str, int]:
        """The largest body each gateway route reads: an agent's whole context (requests of a
        full 200k-token window are a few MB; Anthropic's own limit is 32 MB)."""
        return {path: MAX_CONTEXT_BODY_BYTES for api in APIS for _method, path in api.routes}

    def _handler(self, api: ModelApi) -> Any:
        async def relay(request: web.Request) -> web.StreamResponse:
            return await self.relay(api, request)

        return relay

    async def session_usage(self, request: web.Request) -> web.Response:
        """What the gateway counted for one session: calls and the usage they reported."""
        found = self.sessions.get(request.match_info["session_id"])
        if found is None:
            return web.json_response({"error": "no call of this session"}, status=404)
        return web.json_response(found)

    async def relay(self, api: ModelApi, request: web.Request) -> web.StreamResponse:
        """One call: its bytes upstream as they came, the upstream's answer back as it comes."""
        if self.token is not None and not _token_ok(request, self.token):
            return _error(api, 401, "authentication_error", f"sessionfold: {GATEWAY_TOKEN_HEADER}")
        assert self._client is not None
        headers = {k.lower(): v for k, v in request.headers.items()}
        # The plan is asked as soon as the headers name the session (both agents' do): its
        # round trip to the fold overlaps the body's read.
        session = api.session_of(headers, b"")
        plan = self._ask_plan(session)
        try:
            body = await request.read()
        except BaseException:
            if plan is not None:
                plan.cancel()
            raise
        if session is None:  # named in the body only
            session = api.session_of(headers, body)
            plan = self._ask_plan(session)
        asked = len(body)
        if session is not None and plan is not None:
            body = await self._rewritten(api, session, body, request.path, plan)
        self.metrics.chars.labels(api.name, "asked").inc(asked)
        self.metrics.chars.labels(api.name, "sent").inc(len(body))
        sent = _upstream_headers(request)
        upstream_url = self.upstreams[api.name].rstrip("/") + str(request.rel_url)
        outgoing = self._client.build_request(
            request.method, upstream_url, headers=sent, content=body or None
        )
        named = {k.lower() for k, _v in sent}
        for name in _CLIENT_DEFAULTS:
            if name not in named:
                outgoing.headers.pop(name, None)
        try:
            upstream = await self._client.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            self.metrics.calls.labels(api.name, "unreachable").inc()
            log.warning(
                "gateway: the upstream did not answer",
                extra={"api": api.name, "error": type(exc).__name__},
            )
            return _error(api, 502, "api_error", "sessionfold gateway: the upstream did not answer")
        return await self._stream(api, request, upstream, session)

    async def _stream(
        self,
        api: ModelApi,
        request: web.Request,
        upstream: httpx.Response,
        session: str | None,
    ) -> web.StreamResponse:
        headers = [
            (k, v) for k, v in upstream.headers.multi_items() if k.lower() not in _HOP_BY_HOP
        ]
        kind = upstream.headers.get("content-type", "")
        tap = None
        if kind.startswith("text/event-stream") and "content-encoding" not in upstream.headers:
            tap = UsageTap(api)
        response = web.StreamResponse(status=upstream.status_code)
        for name, value in headers:
            response.headers.add(name, value)
        length = upstream.headers.get("content-length")
        if length is not None and length.isdigit():
            response.content_length = int(length)  # the raw bytes are passed: it still holds
        outcome = "answered"
        try:
            await response.prepare(request)
            async for chunk in upstream.aiter_raw():
                if tap is not None:
                    tap.feed(chunk)
                await response.write(chunk)
            await response.write_eof()
        except (httpx.HTTPError, ConnectionError) as exc:
            outcome = "cut"  # the upstream's stream broke, or the agent went away
            log.warning(
                "gateway: a stream ended early",
                extra={"api": api.name, "error": type(exc).__name__},
            )
        finally:
            await upstream.aclose()
        self.metrics.calls.labels(api.name, outcome).inc()
        self._count(api, session, tap.usage if tap is not None else {})
        return response

    def _ask_plan(self, session: str | None) -> asyncio.Future[dict[str, Any] | None] | None:
        """The session's plan, asked now (None: no session, or no plans to ask)."""
        if session is None or self.plans is None:
            return None
        return asyncio.ensure_future(self.plans(session))

    async def _rewritten(
        self,
        api: ModelApi,
        session: str,
        body: bytes,
        path: str,
        asked: asyncio.Future[dict[str, Any] | None] | None = None,
    ) -> bytes:
        """`body` with the session's rewrite applied, or `body` itself when there is nothing
        to apply or anything fails (fail open: one warning per kind). `asked`: the plan,
        asked already."""
        assert self.plans is not None
        try:
            plan = await asyncio.wait_for(asked or self.plans(session), PLAN_TIMEOUT_S)
        except TimeoutError:
            return self._open_fail("plan-timeout", body)
        except Exception:  # the fold process down or answering wrong: fail open
            return self._open_fail("plan-unavailable", body)
        if not isinstance(plan, dict) or not plan.get("known"):
            return body  # a session the fold does not hold
        results, chains = plan.get("results"), _chains(plan.get("chains"))
        if not isinstance(results, dict) or not (results or chains):
            return body  # nothing summarized yet
        if has_long_number(body):
            # orjson reads an integer past 64 bits as a float: sending it again would change it
            return self._open_fail("rewrite-numbers", body)
        try:
            parsed = orjson.loads(body)
            found = api.results(parsed)
            present = {call: len(orjson.dumps(block)) for call, block in found}
            spans = api.chain_spans(parsed, {key: chain.calls for key, chain in chains.items()})
            chosen = self.policy.choose(
                session,
                results,
                present,
                time.monotonic(),
                path.endswith("/count_tokens"),
                chains,
                {key: span.other for key, span in spans.items()},
                _tail(api, parsed, spans),
            )
            if not chosen:
                return body
            covered = {call for chain in chosen.chains.values() for call in chain.calls}
            for call, block in found:
                if call in chosen.texts and call not in covered:
                    api.replace(block, chosen.texts[call])
            # from the last range back, so that the earlier ranges' indices hold
            for key in sorted(chosen.chains, key=lambda k: spans[k].start, reverse=True):
                api.drop_chain(parsed, spans[key], chosen.chains[key].text)
            expected = [call for call, _block in found if call not in covered]
            if [call for call, _block in api.results(parsed)] != expected:
                return self._open_fail("rewrite-invalid", body)
            if chosen.chains and _breaks_pairing(api, parsed, body):
                return self._open_fail("rewrite-invalid", body)
            return orjson.dumps(parsed)
        except Exception:  # a body the rewrite cannot read: sent as it came
            return self._open_fail("rewrite-failed", body)

    def _open_fail(self, kind: str, body: bytes) -> bytes:
        self.metrics.fail_open.labels(kind).inc()
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("gateway: a call went upstream unchanged", extra={"reason": kind})
        return body

    def _count(self, api: ModelApi, session: str | None, usage: dict[str, int]) -> None:
        for part in USAGE_PARTS:
            if usage.get(part):
                self.metrics.tokens.labels(api.name, part).inc(usage[part])
        if session is None:
            return
        record = self.sessions.pop(session, None)
        if record is None:
            log.info("gateway: a session's first call", extra={"api": api.name, "session": session})
            record = {"calls": 0, **dict.fromkeys(USAGE_PARTS, 0)}
        record["calls"] += 1
        for part, tokens in usage.items():
            record[part] += tokens
        self.sessions[session] = record
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)

    async def _open(self, _app: web.Application) -> None:
        timeout = httpx.Timeout(CONNECT_TIMEOUT_S, read=None, write=None, pool=None)
        # No connection limit (every agent's call in flight holds one), no redirects followed,
        # no proxy from the environment: the upstream is the one the user named.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self._client = httpx.AsyncClient(
            timeout=timeout, limits=limits, follow_redirects=False, trust_env=False
        )

    async def _close(self, _app: web.Application) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def _breaks_pairing(api: ModelApi, rewritten: Any, body: bytes) -> bool:
    """Whether the rewrite broke the API's pairing of calls and results: the agent's own body
    is parsed again only when the rewritten one has a problem (it may have had it already)."""
    problem = api.problem(rewritten)
    return problem is not None and problem != api.problem(orjson.loads(body))


def _tail(api: ModelApi, parsed: Any, spans: dict[str, ChainSpan]) -> Tail:
    """The request's chars from the first of some results or chains (a chain from its prompt,
    which takes its text) to its end; the turns are encoded only when the policy asks."""

    def chars(calls: set[str], chains: set[str]) -> int:
        turns, holding = api.turns(parsed)
        starts = [holding[call] for call in calls if call in holding]
        starts += [spans[key].start for key in chains if key in spans]
        return len(orjson.dumps(turns[min(starts, default=0) :]))

    return chars


def _chains(found: Any) -> dict[str, Chain]:
    """The plan's compressed chains by id (a chain of the wrong shape is left out)."""
    chains: dict[str, Chain] = {}
    for item in found if isinstance(found, list) else []:
        if not isinstance(item, dict):
            continue
        key, calls, text = item.get("id"), item.get("calls"), item.get("text")
        if (
            isinstance(key, str)
            and isinstance(text, str)
            and isinstance(calls, list)
            and calls
            and all(isinstance(call, str) for call in calls)
        ):
            chains[key] = Chain(tuple(calls), text)
    return chains


def _upstream_headers(request: web.Request) -> list[tuple[str, str]]:
    """The agent's headers for the upstream: all but the hop-by-hop ones and serve's token."""
    return [
        (k, v)
        for k, v in request.headers.items()
        if k.lower() not in _HOP_BY_HOP and k.lower() != TOKEN_HEADER
    ]


def _token_ok(request: web.Request, token: str) -> bool:
    import hmac

    presented = request.headers.get(TOKEN_HEADER)
    if presented is None:
        return False
    try:
        return hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), token.encode())
    except UnicodeError:
        return False


def _error(api: ModelApi, status: int, kind: str, message: str) -> web.Response:
    """An answer of the gateway's own, in the API's error shape."""
    return web.Response(
        status=status, body=api.error_body(kind, message), content_type="application/json"
    )
