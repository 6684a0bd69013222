"""The gateway's rewrite on any body: a request it can read gets the plan's texts in the
results the plan names and nothing else changed; anything else (truncated JSON, wrong types,
odd blocks, a plan source that fails or hangs) goes upstream byte for byte. Never an error."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.streams.web.anthropic_api import ANTHROPIC
from sessionfold.streams.web.cache_policy import CachePolicy
from sessionfold.streams.web.gateway import _LONG_NUMBER, Gateway, has_long_number
from sessionfold.streams.web.model_api import ModelApi
from sessionfold.streams.web.openai_api import OPENAI

PLAN = {"known": True, "results": {"a": "[Summarized a]", "c": "[Summarized c]"}}

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**18) + 1, 10**18 - 1) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)


def _rewrite(api: ModelApi, body: bytes, plan: Any = PLAN, path: str = "/v1/x") -> bytes:
    async def source(_session: str) -> Any:
        if isinstance(plan, Exception):
            raise plan
        if plan == "hang":
            await asyncio.sleep(10)
        return plan

    gateway = Gateway({}, policy=CachePolicy(min_freed_tokens=0), plans=source)
    return asyncio.run(gateway._rewritten(api, "s", body, path))


def _anthropic(results: list[tuple[str, Any]]) -> dict[str, Any]:
    blocks = [
        {"type": "tool_result", "tool_use_id": call, "content": content, "cache_control": {}}
        for call, content in results
    ]
    calls = [{"type": "tool_use", "id": call, "name": "Bash", "input": {}} for call, _ in results]
    return {
        "model": "m",
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": calls},
            {"role": "user", "content": [*blocks, {"type": "text", "text": "more"}]},
        ],
    }


@settings(max_examples=100, deadline=None)
@given(
    results=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), JSON_VALUES),
        max_size=4,
        unique_by=lambda r: r[0],
    ),
    extra=JSON_VALUES,
)
def test_only_the_planned_results_change(results: list[tuple[str, Any]], extra: Any) -> None:
    request = _anthropic(results)
    request["extra"] = extra
    body = orjson.dumps(request)
    sent = orjson.loads(_rewrite(ANTHROPIC, body))
    expected = copy.deepcopy(request)
    for block in expected["messages"][2]["content"]:
        if block.get("tool_use_id") in PLAN["results"]:
            block["content"] = PLAN["results"][block["tool_use_id"]]
    assert sent == expected


@settings(max_examples=150, deadline=None)
@given(body=st.binary(max_size=200) | JSON_VALUES.map(lambda v: json.dumps(v).encode()))
def test_any_other_body_goes_as_it_came(body: bytes) -> None:
    for api in (ANTHROPIC, OPENAI):
        out = _rewrite(api, body)
        assert out == body or orjson.loads(out) == orjson.loads(body)


def test_a_truncated_body_and_a_failing_or_hung_plan_send_the_body_unchanged() -> None:
    body = orjson.dumps(_anthropic([("a", "x" * 100)]))
    assert _rewrite(ANTHROPIC, body[:-7]) == body[:-7]
    assert _rewrite(ANTHROPIC, body, RuntimeError("fold process gone")) == body
    assert _rewrite(ANTHROPIC, body, "hang") == body
    assert _rewrite(ANTHROPIC, body, {"known": False, "results": {}}) == body


def test_a_body_with_an_integer_past_64_bits_goes_unchanged() -> None:
    """orjson would read it as a float and write it back changed."""
    body = orjson.dumps(_anthropic([("a", "x")]))[:-1] + b',"n":123456789012345678901234567890}'
    assert _rewrite(ANTHROPIC, body) == body


#: Bodies made of JSON punctuation, spaces, letters and digit runs around 19 long.
_NUMBERISH = st.lists(
    st.sampled_from([b":", b",", b"[", b" ", b"\n", b"-", b"a", b'"', b"0", b"9"])
    | st.integers(min_value=15, max_value=22).map(lambda n: b"7" * n),
    max_size=30,
).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(body=_NUMBERISH)
def test_the_fast_long_number_check_agrees_with_the_pattern(body: bytes) -> None:
    """The translate pre-check only skips bodies the pattern cannot match."""
    assert has_long_number(body) == (_LONG_NUMBER.search(body) is not None)


def test_codex_outputs_get_the_plans_texts() -> None:
    request = {
        "input": [
            {"type": "function_call", "call_id": "a", "name": "exec_command", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "a", "output": "long output"},
            {"type": "function_call_output", "call_id": "b", "output": "kept"},
        ]
    }
    sent = orjson.loads(_rewrite(OPENAI, orjson.dumps(request)))
    assert [item.get("output") for item in sent["input"]] == [None, "[Summarized a]", "kept"]


def test_the_plan_is_asked_while_the_body_is_still_coming() -> None:
    """A call whose headers name its session has its plan asked at once: the round trip to
    the fold overlaps the body's read (a body sent in two halves 0.3 s apart here), where it
    used to wait for the whole body."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer
    from scripted_models import AnthropicModel, Turn, Usage

    times: dict[str, float] = {}

    async def source(_session: str) -> Any:
        times.setdefault("asked", time.monotonic())
        return {"known": True, "results": {}, "chains": []}

    async def halves() -> Any:
        yield b'{"model": "m", "messages": ['
        await asyncio.sleep(0.3)
        times["sent"] = time.monotonic()
        yield b'{"role": "user", "content": "hi"}]}'

    async def call(upstream: str) -> int:
        gateway = Gateway({"anthropic": upstream, "openai": upstream}, plans=source)
        app = web.Application()
        gateway.add_routes(app)
        async with TestClient(TestServer(app)) as client:
            headers = {"X-Claude-Code-Session-Id": "s", "Content-Type": "application/json"}
            answer = await client.post("/v1/messages", data=halves(), headers=headers)
            await answer.read()
            return answer.status

    with AnthropicModel([Turn(text="ok", usage=Usage(1, 1))]) as model:
        assert asyncio.run(call(model.url)) == 200
    assert times["asked"] < times["sent"] - 0.2


def _responses(results: list[tuple[str, str]], after: str) -> dict[str, Any]:
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "go"}]
    for call, output in results:
        items.append({"type": "function_call", "call_id": call, "name": "x", "arguments": "{}"})
        items.append({"type": "function_call_output", "call_id": call, "output": output})
    items.append({"type": "message", "role": "user", "content": after})
    return {"model": "m", "input": items}


def _anthropic_rounds(results: list[tuple[str, str]], after: str) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for call, output in results:
        use = {"type": "tool_use", "id": call, "name": "x", "input": {}}
        messages.append({"role": "assistant", "content": [use]})
        result = {"type": "tool_result", "tool_use_id": call, "content": output}
        messages.append({"role": "user", "content": [result]})
    messages.append({"role": "user", "content": after})
    return {"model": "m", "messages": messages}


@pytest.mark.parametrize(("api", "build"), [(ANTHROPIC, _anthropic_rounds), (OPENAI, _responses)])
def test_a_small_change_near_the_end_is_made_at_once_and_an_early_one_waits(
    api: ModelApi, build: Callable[[list[tuple[str, str]], str], dict[str, Any]]
) -> None:
    """Under `min_freed_tokens` a change is made at once when the request from the result it
    changes to the end is at most three times what it frees (little to write again), and held
    while that is longer: the gateway measures from the turn holding the result."""
    rounds = [("a", "x" * 400), ("b", "y" * 4000), ("c", "z" * 4000)]
    plans: list[dict[str, str]] = []

    async def source(_session: str) -> Any:
        return {"known": True, "results": plans[-1], "chains": []}

    gateway = Gateway({}, policy=CachePolicy(min_freed_tokens=10**9), plans=source)

    def stubbed(plan: dict[str, str], after: str) -> set[str]:
        """The results the call with `plan` sent rewritten."""
        plans.append(plan)
        request = build(rounds, after)
        out = orjson.loads(asyncio.run(gateway._rewritten(api, "s", orjson.dumps(request), "/")))
        before = dict(api.results(request))
        return {call for call, block in api.results(out) if block != before[call]}

    assert stubbed({"a": "A"}, "now") == {"a"}  # a session's first call takes the plan
    # c frees ~1,000 tokens and from its result to the end is about as much: made at once
    assert stubbed({"a": "A", "c": "C"}, "now") == {"a", "c"}
    # b frees as much, but from its result to the end the request holds c's result and a
    # 40,000-char message: over three times what b frees, so b waits
    assert stubbed({"a": "A", "b": "B", "c": "C"}, "w" * 40_000) == {"a", "c"}
    # with a short last message b's change is made
    assert stubbed({"a": "A", "b": "B", "c": "C"}, "short") == {"a", "b", "c"}
