"""Codex rollouts in the orders the CLIs write them: usage before its response (0.40), after its
outputs (later CLIs), in a `token_usage_record` right after the response's items (0.169); and
outputs written before their call. Whatever the order, each response gets its own usage and each
call its result right after the response (views/validity.py's rule)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_codex_format import META, T0, call, event, message, output, translate

from sessionfold.events.formats.codex import CodexTranslator
from sessionfold.projections.views.validity import problems

ORDERS = ("usage-first", "usage-after-outputs", "usage-record")


def usage_of(n: int) -> dict[str, int]:
    """The n-th response's counts, distinct per response."""
    return {"input_tokens": 1000 + 10 * n, "cached_input_tokens": 100 + n, "output_tokens": 7 + n}


def token_count(counts: dict[str, int]) -> dict[str, Any]:
    return event({"type": "token_count", "info": {"last_token_usage": counts}})


def usage_record(counts: dict[str, int]) -> dict[str, Any]:
    return {"timestamp": T0, "type": "token_usage_record", "payload": {"usage": counts}}


def rollout(calls_per_response: list[int], order: str) -> list[dict[str, Any]]:
    """One user turn of responses with the given numbers of calls, the last one text only."""
    lines = [META, message("user", "go")]
    for n, calls in enumerate([*calls_per_response, 0]):
        counts = usage_of(n)
        ids = [f"c{n}_{k}" for k in range(calls)]
        items = [call(i, "exec_command", '{"cmd": "ls"}') for i in ids] or [
            message("assistant", "done")
        ]
        outputs = [output(i, f"Process exited with code 0\nOutput:\n{i}") for i in ids]
        if order == "usage-first":
            lines += [token_count(counts), *items, *outputs]
        elif order == "usage-after-outputs":
            lines += [*items, *outputs, token_count(counts)]
        else:
            lines += [*items, usage_record(counts), *outputs, token_count(counts)]
    return lines


def chain_messages(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["message"] for e in entries if e["type"] == "message"]


@settings(max_examples=40, deadline=None)
@given(
    calls=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=5),
    order=st.sampled_from(ORDERS),
)
def test_each_response_gets_its_own_usage_in_every_order(calls: list[int], order: str) -> None:
    entries = translate(rollout(calls, order))
    assistants = [m for m in chain_messages(entries) if m["role"] == "assistant"]
    assert len(assistants) == len(calls) + 1
    for n, assistant in enumerate(assistants):
        counts = usage_of(n)
        assert assistant["usage"]["cacheRead"] == counts["cached_input_tokens"]
        assert assistant["usage"]["input"] == counts["input_tokens"] - counts["cached_input_tokens"]
        assert assistant["usage"]["output"] == counts["output_tokens"]
    assert problems(chain_messages(entries)) == []


@pytest.mark.parametrize("order", ORDERS)
def test_a_response_with_calls_gets_usage_in_every_order(order: str) -> None:
    """The case the issue counted (0 of 217 responses got usage in 0.40 rollouts)."""
    entries = translate(rollout([2, 1], order))
    usages = [m.get("usage") for m in chain_messages(entries) if m["role"] == "assistant"]
    assert all(u is not None for u in usages) and len(usages) == 3


def test_an_output_written_before_its_call_follows_the_call() -> None:
    lines = [
        META,
        message("user", "go"),
        output("late", "Process exited with code 0\nOutput:\nok"),
        call("late", "exec_command", '{"cmd": "ls"}'),
        token_count(usage_of(0)),
        message("assistant", "done"),
    ]
    chain = chain_messages(translate(lines))
    assert [(m["role"], m.get("toolCallId")) for m in chain] == [
        ("user", None),
        ("assistant", None),
        ("toolResult", "late"),
        ("assistant", None),
    ]
    assert chain[2]["toolName"] == "exec_command"
    assert problems(chain) == []


def test_an_output_whose_call_never_comes_is_kept_as_a_result_without_call() -> None:
    """Held for the response after it, then emitted: the render's sweep leaves it out, the
    ledger says so (test_ledger_pairing.py)."""
    lines = [
        META,
        message("user", "go"),
        output("ghost", "text"),
        call("real", "exec_command", '{"cmd": "ls"}'),
        output("real", "Process exited with code 0\nOutput:\nok"),
        token_count(usage_of(0)),
        message("user", "next"),
    ]
    translator = CodexTranslator()
    out: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        out += translator.feed(line, number)
    chain = chain_messages(out)  # a tail's read: nothing held for good
    assert [(m["role"], m.get("toolCallId")) for m in chain] == [
        ("user", None),
        ("assistant", None),
        ("toolResult", "real"),
        ("toolResult", "ghost"),
        ("user", None),
    ]
    assert [p.code for p in problems(chain)] == ["result-without-call"]
    assert translator.close() == []


def test_a_sandbox_failure_is_an_error_with_its_exit_code() -> None:
    text = (
        "execution error: command failed in sandbox LinuxSeccomp with execution error: exit code: 2"
    )
    lines = [
        META,
        message("user", "go"),
        call("s", "shell", '{"command": ["ls"]}'),
        output("s", text),
    ]
    (result,) = [m for m in chain_messages(translate(lines)) if m["role"] == "toolResult"]
    assert result["isError"] is True and result["details"] == {"exitCode": 2}


def test_an_output_with_no_exit_code_states_none() -> None:
    lines = [
        META,
        message("user", "go"),
        call("s", "shell", '{"command": ["ls"]}'),
        output("s", "a"),
    ]
    (result,) = [m for m in chain_messages(translate(lines)) if m["role"] == "toolResult"]
    assert result["isError"] is False and "details" not in result
