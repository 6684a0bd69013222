"""The gateway's plan cache on a fold worker: a session's rewrite plan, kept between changes.

A fold worker's gateway (docs/live.md, "Fleet") takes each session's plan from the worker that
owns the session, through the state API's plan route, and applies it itself: the agent's body
never leaves the worker it reached. The plan is asked at every model call, but it changes only
when the session's fold does (a flush, a compaction), so the cache keeps the last plan of each
session and asks the route with `If-None-Match` naming it: an unchanged plan is a 304 without a
body (a round trip of a few hundred bytes), a changed one comes whole. The tag is a digest of
the plan's bytes (live_contract.py `plan_tag`), computed here from the body, so it holds
through Faust's proxy, which passes only an answer's status and body.

A worker asks itself first (`local_first`): the sessions it owns are planned in process, no
HTTP; only the others' go to the route. The owner still renders the session to know whether
its plan changed (its render memo makes an
unchanged render cheap): what the cache saves is the plan's bytes on the wire and their
parsing, per call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import orjson
from prometheus_client import CollectorRegistry, Counter

from sessionfold.streams.web.live_contract import not_modified, plan_tag

#: Asks the plan route: (session id, the tag of the plan kept or None) -> (status, body).
PlanFetch = Callable[[str, str | None], Awaitable[tuple[int, bytes]]]
#: Sessions whose plans are kept (the least recently asked go first).
MAX_SESSIONS = 10_000


class PlanUnavailable(Exception):
    """The plan route gave no plan (an owner rebalancing, unreachable: any status but 200 and
    a 304 for a kept plan); the gateway sends the call unchanged."""

    def __init__(self, status: int) -> None:
        super().__init__(f"plan route answered {status}")
        self.status = status


@dataclass
class PlanCache:
    """A `PlanSource` (gateway.py) over `fetch`, with each session's last plan and its tag."""

    fetch: PlanFetch
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    capacity: int = MAX_SESSIONS
    plans: OrderedDict[str, tuple[str, dict[str, Any]]] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self.answers = Counter(
            "sessionfold_gateway_plan_answers_total",
            "Plan route answers the gateway's plan cache got, by kind (full: a plan sent "
            "whole; unchanged: a 304 for the plan kept; unavailable: no plan).",
            ["answer"],
            registry=self.registry,
        )

    async def __call__(self, session_id: str) -> dict[str, Any]:
        """The session's plan now (PlanUnavailable when the route gives none)."""
        kept = self.plans.get(session_id)
        try:
            status, body = await self.fetch(session_id, None if kept is None else kept[0])
        except Exception:
            self.answers.labels("unavailable").inc()
            raise
        if status == 304 and kept is not None:
            self.answers.labels("unchanged").inc()
            self.plans.move_to_end(session_id)
            return kept[1]
        if status != 200:
            self.answers.labels("unavailable").inc()
            raise PlanUnavailable(status)
        plan = orjson.loads(body)
        if not isinstance(plan, dict):
            self.answers.labels("unavailable").inc()
            raise PlanUnavailable(status)
        self.answers.labels("full").inc()
        self.plans[session_id] = (plan_tag(body), plan)
        self.plans.move_to_end(session_id)
        while len(self.plans) > self.capacity:
            self.plans.popitem(last=False)
        return plan


#: The plan route's answer where this worker owns the session; None where another does.
LocalPlan = Callable[[str], Awaitable[tuple[int, bytes] | None]]


def local_first(local: LocalPlan, route: PlanFetch) -> PlanFetch:
    """A `PlanFetch` that answers from `local` the sessions this worker owns (the tag checked
    here, as the route checks it) and asks `route` for the others."""

    async def fetch(session_id: str, tag: str | None) -> tuple[int, bytes]:
        found = await local(session_id)
        if found is None:
            return await route(session_id, tag)
        status, encoded = found
        if status == 200 and not_modified(tag, encoded):
            return 304, b""
        return found

    return fetch


class PlanRoute:
    """Asks a state API's plan route over HTTP (a `PlanFetch`): the worker's own web server,
    which answers for the sessions it owns and proxies the others' to their owner."""

    def __init__(self, base_url: str, token: str | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self._client: httpx.AsyncClient | None = None

    async def __call__(self, session_id: str, tag: str | None) -> tuple[int, bytes]:
        """The route's status and body for the session (`If-None-Match: tag` when given)."""
        if self._client is None:  # made on the running loop, at the first call
            self._client = httpx.AsyncClient(base_url=self.base_url, trust_env=False)
        headers = {} if self.token is None else {"Authorization": f"Bearer {self.token}"}
        if tag is not None:
            headers["If-None-Match"] = tag
        answer = await self._client.get(
            f"/sessions/{quote(session_id, safe='')}/plan", headers=headers
        )
        return answer.status_code, answer.content

    async def close(self, *_args: object) -> None:
        """Close the HTTP client (an aiohttp app's cleanup signal calls it with the app)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
