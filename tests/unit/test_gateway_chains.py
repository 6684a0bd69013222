"""The gateway drops a compressed chain whole: every call of the chain with its result and the
assistant messages that made them leave the request, the chain's text follows its prompt, and
the request stays valid for its API (each call answered in the next message or by a later
output). A chain the request's range does not hold exactly is stubbed result by result
instead, and anything else passes as the agent sent it."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.streams.web.anthropic_api import ANTHROPIC
from sessionfold.streams.web.cache_policy import CachePolicy
from sessionfold.streams.web.gateway import Gateway
from sessionfold.streams.web.model_api import ModelApi
from sessionfold.streams.web.openai_api import OPENAI


@dataclass
class Turn:
    """One prompt and its rounds (calls per round); closed: an answer without calls ends it."""

    number: int
    rounds: list[int]
    reminder: bool  # Claude Code adds text beside a round's results
    text_prompt: bool  # the prompt as a plain string
    closed: bool
    environment: bool = False  # a message of another role after the prompt (Claude Code's)

    def calls(self) -> list[list[str]]:
        return [[f"t{self.number}r{r}c{c}" for c in range(n)] for r, n in enumerate(self.rounds)]


TURNS = st.lists(
    st.tuples(
        st.lists(st.integers(1, 3), min_size=0, max_size=3),
        st.booleans(),
        st.booleans(),
        st.booleans(),
    ),
    min_size=1,
    max_size=5,
)
Drawn = list[tuple[list[int], bool, bool, bool]]


def _turns(drawn: Drawn, last_open: bool) -> list[Turn]:
    return [
        Turn(n, rounds, reminder, text, not (last_open and n == len(drawn) - 1), environment)
        for n, (rounds, reminder, text, environment) in enumerate(drawn)
    ]


def _chain_text(turn: Turn) -> str:
    return (
        f'<compressed-chain id="b{turn.number}" tools="x">\nturn {turn.number}\n</compressed-chain>'
    )


def _anthropic(turns: list[Turn], dropped: set[int]) -> dict[str, Any]:
    """The request Claude Code sends; with `dropped` turns as the gateway must make them."""
    messages: list[dict[str, Any]] = []
    for turn in turns:
        prompt: Any = f"prompt {turn.number}"
        if not turn.text_prompt:
            prompt = [{"type": "text", "text": prompt}]
        gone = turn.number in dropped
        if gone:
            blocks = prompt if isinstance(prompt, list) else [{"type": "text", "text": prompt}]
            prompt = [*blocks, {"type": "text", "text": _chain_text(turn)}]
        messages.append({"role": "user", "content": prompt})
        if turn.environment:
            messages.append({"role": "system", "content": "# Environment"})
        for calls in turn.calls():
            uses = [{"type": "tool_use", "id": c, "name": "Bash", "input": {"n": c}} for c in calls]
            results = [
                {"type": "tool_result", "tool_use_id": c, "content": "out " * 50} for c in calls
            ]
            extra = [{"type": "text", "text": "<system-reminder>r</system-reminder>"}]
            if gone:
                if turn.reminder:
                    messages[-2 if turn.environment else -1]["content"] += extra
                continue
            thinking = {"type": "thinking", "thinking": "hm", "signature": "sig"}
            messages.append({"role": "assistant", "content": [thinking, *uses]})
            messages.append({"role": "user", "content": results + (extra if turn.reminder else [])})
        if turn.closed:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": "done"}]})
    return {"model": "m", "stream": True, "messages": messages}


def _responses(turns: list[Turn], dropped: set[int]) -> dict[str, Any]:
    """The request Codex sends; with `dropped` turns as the gateway must make them."""
    items: list[dict[str, Any]] = []
    for turn in turns:
        text = [{"type": "input_text", "text": f"prompt {turn.number}"}]
        items.append({"type": "message", "role": "user", "content": text})
        if turn.environment:
            note = [{"type": "input_text", "text": "# Environment"}]
            items.append({"type": "message", "role": "developer", "content": note})
        if turn.number in dropped:
            chain = [{"type": "input_text", "text": _chain_text(turn)}]
            items.append({"type": "message", "role": "user", "content": chain})
        for calls in turn.calls() if turn.number not in dropped else []:
            items.append({"type": "reasoning", "summary": [], "encrypted_content": "enc"})
            for c in calls:
                items.append({"type": "function_call", "call_id": c, "name": "sh", "arguments": c})
            for c in calls:
                items.append({"type": "function_call_output", "call_id": c, "output": "o " * 50})
        if turn.closed:
            items.append({"type": "reasoning", "summary": [], "encrypted_content": "enc"})
            answer = [{"type": "output_text", "text": "done"}]
            items.append({"type": "message", "role": "assistant", "content": answer})
    return {"model": "m", "stream": True, "input": items, "prompt_cache_key": "s"}


def _plan(
    turns: list[Turn], chained: set[int], short: set[int], headless: bool = False
) -> dict[str, Any]:
    """The fold's plan: a chain per turn in `chained` (missing its last call when in `short`,
    its first when `headless`), and a stub for every call of those turns."""
    chains = []
    results = {}
    for turn in turns:
        if turn.number not in chained:
            continue
        calls = [c for round_ in turn.calls() for c in round_]
        results.update({c: f"[Summarized {c}]" for c in calls})
        if turn.number in short:
            calls = calls[1:] if headless else calls[:-1]
        chains.append({"id": f"b{turn.number}", "calls": calls, "text": _chain_text(turn)})
    return {"known": True, "results": results, "chains": chains}


def _rewrite(api: ModelApi, request: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    async def source(_session: str) -> Any:
        return plan

    gateway = Gateway({}, policy=CachePolicy(min_freed_tokens=0), plans=source)
    sent = asyncio.run(gateway._rewritten(api, "s", orjson.dumps(request), "/v1/x"))
    assert not any(v for v in _fail_open(gateway).values()), _fail_open(gateway)
    return orjson.loads(sent)


def _fail_open(gateway: Gateway) -> dict[str, float]:
    return {
        s.labels["reason"]: s.value
        for m in gateway.metrics.fail_open.collect()
        for s in m.samples
        if s.name.endswith("_total")
    }


def _stubbed(request: dict[str, Any], results: dict[str, str], api: ModelApi) -> dict[str, Any]:
    expected = copy.deepcopy(request)
    for call, block in api.results(expected):
        if call in results:
            api.replace(block, results[call])
    return expected


def _paired_anthropic(messages: list[dict[str, Any]]) -> bool:
    """The Messages API's rule, written apart from the gateway's: the tool_use ids of an
    assistant message are exactly the tool_result ids of the next message, and no result
    answers anything else."""
    for n, message in enumerate(messages):
        content = message["content"] if isinstance(message["content"], list) else []
        results = {b["tool_use_id"] for b in content if b["type"] == "tool_result"}
        before = messages[n - 1]["content"] if n else []
        uses = {b["id"] for b in before if isinstance(b, dict) and b["type"] == "tool_use"}
        if message["role"] == "user" and results != uses and (results or uses):
            return False
        if message["role"] == "assistant" and uses:
            return False  # an assistant message after one with calls: their results lost
    return True


def _sent_and_expected(
    api: ModelApi,
    build: Any,
    drawn: Drawn,
    last_open: bool,
    data: st.DataObject,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The request the gateway sends for drawn turns, some chained (some of those with a call
    the plan lacks: the last, or the first), and the one expected: the chained turns
    compressed, the short ones stubbed result by result."""
    turns = _turns(drawn, last_open)
    closed = [t.number for t in turns if t.closed and t.rounds]
    chained = set(data.draw(st.lists(st.sampled_from(closed), unique=True))) if closed else set()
    short = (
        set(data.draw(st.lists(st.sampled_from(sorted(chained)), unique=True)))
        if chained
        else set()
    )
    plan = _plan(turns, chained, short, data.draw(st.booleans()))
    sent = _rewrite(api, build(turns, set()), plan)
    shorts = {str(n) for n in short}
    stubs = {c: t for c, t in plan["results"].items() if c.split("r")[0][1:] in shorts}
    return sent, _stubbed(build(turns, chained - short), stubs, api)


@settings(max_examples=150, deadline=None)
@given(drawn=TURNS, last_open=st.booleans(), data=st.data())
def test_a_chain_leaves_the_anthropic_request_whole(
    drawn: Drawn, last_open: bool, data: st.DataObject
) -> None:
    sent, expected = _sent_and_expected(ANTHROPIC, _anthropic, drawn, last_open, data)
    assert sent == expected
    assert _paired_anthropic(sent["messages"])
    assert ANTHROPIC.problem(sent) is None


@settings(max_examples=150, deadline=None)
@given(drawn=TURNS, last_open=st.booleans(), data=st.data())
def test_a_chain_leaves_the_responses_request_whole(
    drawn: Drawn, last_open: bool, data: st.DataObject
) -> None:
    sent, expected = _sent_and_expected(OPENAI, _responses, drawn, last_open, data)
    assert sent == expected
    calls = [i["call_id"] for i in sent["input"] if i["type"] == "function_call"]
    outputs = [i["call_id"] for i in sent["input"] if i["type"] == "function_call_output"]
    assert sorted(calls) == sorted(outputs) and len(set(calls)) == len(calls)
    assert OPENAI.problem(sent) is None


def test_a_chain_with_a_call_the_plan_does_not_name_is_stubbed_instead() -> None:
    """The request's range holds a call the fold has not seen (a round the tailer has not
    read): the chain is not dropped, its known results are stubbed."""
    turns = _turns([([2], False, True, False), ([1], False, True, False)], last_open=True)
    plan = _plan(turns, {0}, set())
    request = _anthropic(turns, set())
    extra = {"type": "tool_use", "id": "unseen", "name": "Bash", "input": {}}
    request["messages"][1]["content"].append(extra)
    request["messages"][2]["content"].append({"type": "tool_result", "tool_use_id": "unseen"})
    sent = _rewrite(ANTHROPIC, request, plan)
    assert sent == _stubbed(request, plan["results"], ANTHROPIC)


def test_a_dropped_blocks_cache_marker_moves_to_the_chains_text() -> None:
    turns = _turns([([1], False, False, True), ([1], False, True, False)], last_open=True)
    request = _anthropic(turns, set())
    request["messages"][3]["content"][0]["cache_control"] = {"type": "ephemeral"}
    sent = _rewrite(ANTHROPIC, request, _plan(turns, {0}, set()))
    prompt = sent["messages"][0]["content"]
    assert prompt[-1] == {
        "type": "text",
        "text": _chain_text(turns[0]),
        "cache_control": {"type": "ephemeral"},
    }
    marked = orjson.dumps(sent).count(b"cache_control")
    assert marked == orjson.dumps(request).count(b"cache_control")


def test_the_cache_policy_holds_a_chain_until_it_pays() -> None:
    """A small chain waits for `min_freed_tokens` as a small stub does (while what follows it
    in the request is long: a last message of 20,000 chars here); once applied, later calls
    drop it the same way (the prefix holds)."""
    turns = _turns([([1], False, True, False)] * 3, True)
    built = _anthropic(turns, set())
    built["messages"].append({"role": "user", "content": "w" * 20_000})
    request = orjson.dumps(built)
    plans = [_plan(turns, set(), set()), _plan(turns, {0}, set())]

    async def source(_session: str) -> Any:
        return plans[-1]

    policy = CachePolicy(min_freed_tokens=10_000)
    gateway = Gateway({}, policy=policy, plans=source)
    held = asyncio.run(gateway._rewritten(ANTHROPIC, "s", request, "/v1/x"))
    assert held.count(b"<compressed-chain id=") == 1  # the first call takes the plan as it is
    plans.append(_plan(turns, {0, 1}, set()))
    again = asyncio.run(gateway._rewritten(ANTHROPIC, "s", request, "/v1/x"))
    assert again == held  # chain 1 frees ~60 tokens: not worth the prefix
    policy.min_freed_tokens = 0
    moved = orjson.loads(asyncio.run(gateway._rewritten(ANTHROPIC, "s", request, "/v1/x")))
    assert orjson.dumps(moved).count(b"<compressed-chain id=") == 2
    # without the long last message, from chain 1's prompt to the end is under three times
    # what dropping it frees: the change is made at once, whatever `min_freed_tokens` says
    short = orjson.dumps(_anthropic(turns, set()))
    eager = Gateway({}, policy=CachePolicy(min_freed_tokens=10**9), plans=source)

    def chains_sent() -> int:
        return asyncio.run(eager._rewritten(ANTHROPIC, "s", short, "/v1/x")).count(b"<compressed")

    plans[:] = [_plan(turns, {0}, set())]
    assert chains_sent() == 1
    plans.append(_plan(turns, {0, 1}, set()))
    assert chains_sent() == 2
