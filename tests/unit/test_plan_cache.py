"""The gateway's plan cache (web/plan_cache.py) against a plan route that answers as the state
API's does (live_contract.py: an `ETag` digest, 304 on a matching `If-None-Match`):

- whatever the sequence of changes, asks and failures, every ask gives the route's plan of
  that moment, and the route sends a plan whole only when the cache lacks it: the first ask
  of a session (or after it was evicted) and the first after a change; every other ask is a
  304;
- a route that fails or answers anything but a plan raises (the gateway sends the call
  unchanged and counts `plan-unavailable`), and the plan kept before is still used after;
- a worker's own sessions answered in process first (`local_first`) give the same answers and
  counts, and never reach the route;
- the tag is the plan's bytes' digest: two plans share a tag only when they are equal.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from sessionfold.streams.web.anthropic_api import ANTHROPIC
from sessionfold.streams.web.gateway import Gateway
from sessionfold.streams.web.live_contract import not_modified, plan_tag
from sessionfold.streams.web.plan_cache import PlanCache, PlanUnavailable, local_first


class Route:
    """A plan route over plans held in memory: 200 with the plan, 304 when the tag matches,
    `down` answers 503; what it sent is counted."""

    def __init__(self) -> None:
        self.plans: dict[str, bytes] = {}
        self.down = False
        self.full = 0
        self.unchanged = 0

    def set(self, session: str, version: int) -> None:
        results = {f"call-{version}": "stub"} if version else {}
        plan = {"session": session, "known": True, "epoch": version, "results": results}
        self.plans[session] = orjson.dumps(plan)

    async def __call__(self, session: str, tag: str | None) -> tuple[int, bytes]:
        if self.down:
            return 503, b'{"error": "not ready"}'
        encoded = self.plans.get(session) or orjson.dumps({"session": session, "known": False})
        if not_modified(tag, encoded):
            self.unchanged += 1
            return 304, b""
        self.full += 1
        return 200, encoded


def _answers(cache: PlanCache) -> dict[str, float]:
    return {
        kind: cache.registry.get_sample_value(
            "sessionfold_gateway_plan_answers_total", {"answer": kind}
        )
        or 0.0
        for kind in ("full", "unchanged", "unavailable")
    }


SESSIONS = st.sampled_from(["a", "b", "c"])
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("change"), SESSIONS, st.integers(0, 3)),
        st.tuples(st.just("ask"), SESSIONS, st.just(0)),
        st.tuples(st.just("down"), SESSIONS, st.booleans().map(int)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(
    steps=STEPS,
    capacity=st.integers(1, 4),
    owned=st.none() | st.frozensets(SESSIONS),
)
def test_every_ask_gets_the_current_plan_and_only_a_change_is_sent_whole(
    steps: list[tuple[str, str, int]], capacity: int, owned: frozenset[str] | None
) -> None:
    """Asked through the route alone, or the sessions in `owned` answered in process first
    (`local_first`, as the owner's gateway does): the same answers, the same counts; the owned
    sessions never reach the route."""
    route = Route()
    asked: list[str] = []

    async def counted(session: str, tag: str | None) -> tuple[int, bytes]:
        asked.append(session)
        return await route(session, tag)

    async def local(session: str) -> tuple[int, bytes] | None:
        if owned is None or session not in owned:
            return None
        if route.down:
            return 503, b""
        known = route.plans.get(session)
        return 200, known or orjson.dumps({"session": session, "known": False})

    fetch = counted if owned is None else local_first(local, counted)
    cache = PlanCache(fetch, CollectorRegistry(), capacity=capacity)
    held: dict[str, bytes] = {}  # what the cache should hold (a model of its LRU)
    order: list[str] = []
    expected_full = expected_unchanged = expected_unavailable = 0

    async def run() -> None:
        nonlocal expected_full, expected_unchanged, expected_unavailable
        for kind, session, value in steps:
            if kind == "change":
                route.set(session, value)
            elif kind == "down":
                route.down = bool(value)
            else:
                if route.down:
                    with pytest.raises(PlanUnavailable):
                        await cache(session)
                    expected_unavailable += 1
                    continue
                got = await cache(session)
                current = route.plans.get(session) or orjson.dumps(
                    {"session": session, "known": False}
                )
                assert orjson.dumps(got) == current
                if held.get(session) == current:
                    expected_unchanged += 1
                else:
                    expected_full += 1
                held[session] = current
                if session in order:
                    order.remove(session)
                order.append(session)
                while len(order) > capacity:
                    held.pop(order.pop(0))

    asyncio.run(run())
    if owned is None:
        assert (route.full, route.unchanged) == (expected_full, expected_unchanged)
    else:
        assert not set(asked) & owned
    assert _answers(cache) == {
        "full": expected_full,
        "unchanged": expected_unchanged,
        "unavailable": expected_unavailable,
    }
    assert len(cache.plans) <= capacity


def test_a_failing_route_raises_and_the_kept_plan_serves_again_after() -> None:
    route = Route()
    route.set("s", 1)
    cache = PlanCache(route)

    async def run() -> None:
        first = await cache("s")
        route.down = True
        with pytest.raises(PlanUnavailable):
            await cache("s")
        route.down = False
        assert await cache("s") == first

    asyncio.run(run())
    assert (route.full, route.unchanged) == (1, 1)


@pytest.mark.parametrize("answer", [(200, b"[1, 2]"), (304, b""), (404, b"{}"), (500, b"")])
def test_anything_but_a_plan_or_a_304_for_a_kept_one_is_unavailable(
    answer: tuple[int, bytes],
) -> None:
    async def fetch(_session: str, _tag: str | None) -> tuple[int, bytes]:
        return answer

    cache = PlanCache(fetch)
    with pytest.raises(PlanUnavailable):
        asyncio.run(cache("s"))
    assert _answers(cache)["unavailable"] == 1


def test_a_route_that_raises_is_counted_and_the_gateway_sends_the_body_unchanged() -> None:
    async def fetch(_session: str, _tag: str | None) -> tuple[int, bytes]:
        raise ConnectionError("owner gone")

    registry = CollectorRegistry()
    cache = PlanCache(fetch, registry)
    gateway = Gateway({}, plans=cache, registry=registry)
    body = b'{"messages": []}'
    sent = asyncio.run(gateway._rewritten(ANTHROPIC, "s", body, "/v1/messages"))
    assert sent is body
    assert _answers(cache)["unavailable"] == 1
    reasons = {"reason": "plan-unavailable"}
    assert registry.get_sample_value("sessionfold_gateway_unchanged_total", reasons) == 1


@settings(max_examples=200, deadline=None)
@given(a=st.binary(max_size=64), b=st.binary(max_size=64), weak=st.booleans())
def test_a_tag_names_its_plan_only(a: bytes, b: bytes, weak: bool) -> None:
    tag = ("W/" if weak else "") + plan_tag(a)
    assert not_modified(f'"other", {tag}', b) == (a == b)
    assert not not_modified(None, a) and not not_modified("", a)
