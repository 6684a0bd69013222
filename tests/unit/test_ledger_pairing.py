"""Calls and results a provider would refuse unpaired are anomalies of the ledger (codes, ids and
counts, never text), agreeing with the render's own check (views/validity.py) on any message
sequence: the render leaves a result without its call out and answers a call closed unanswered
with a placeholder; `ledger --anomalies` says both happened."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_ledger_fold import SID, entry, fold_all

from sessionfold.projections.ledger.fold import LedgerFold
from sessionfold.projections.ledger.state import snapshot
from sessionfold.projections.store import DictStore
from sessionfold.projections.views.validity import problems

IDS = ("a", "b", "c", "d")


def assistant(calls: list[str], stop: str) -> dict[str, Any]:
    blocks = [{"type": "toolCall", "id": c, "name": "read", "arguments": {}} for c in calls]
    return {
        "role": "assistant",
        "content": [{"type": "text", "text": "x"}, *blocks],
        "stopReason": stop,
    }


def tool_result(call: str) -> dict[str, Any]:
    content = [{"type": "text", "text": "out"}]
    return {"role": "toolResult", "toolCallId": call, "toolName": "read", "content": content}


MESSAGES = st.one_of(
    st.builds(
        assistant,
        st.lists(st.sampled_from(IDS), max_size=3, unique=True),
        st.sampled_from(["toolUse", "toolUse", "aborted"]),
    ),
    st.builds(tool_result, st.sampled_from(IDS)),
    st.just({"role": "user", "content": "go"}),
)


def anomalies(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    store = DictStore()
    fold = LedgerFold(store)
    envelopes = [entry(seq, {"type": "message", "message": m}) for seq, m in enumerate(messages, 1)]
    fold_all(fold, envelopes)
    return snapshot(store, SID)["anomalies"]


@settings(max_examples=150, deadline=None)
@given(st.lists(MESSAGES, max_size=14))
def test_the_ledgers_pairing_anomalies_are_the_renders_problems(
    messages: list[dict[str, Any]],
) -> None:
    found = anomalies(messages)
    expected = problems(messages)
    results = [a["seq"] for a in found if a["code"] == "result-without-call"]
    assert results == [
        p.position + 1 for p in expected if p.code in ("result-without-call", "result-twice")
    ]
    closed = sum(a["calls"] for a in found if a["code"] == "call-without-result")
    assert closed == sum(1 for p in expected if p.code == "call-without-result")


def test_an_interrupted_call_and_a_stray_result_are_anomalies_without_text() -> None:
    found = anomalies(
        [
            {"role": "user", "content": "secret words"},
            assistant(["a", "b"], "toolUse"),
            tool_result("a"),
            {"role": "user", "content": "stop, secret words"},
            tool_result("b"),
        ]
    )
    assert [(a["code"], a["seq"], a.get("calls")) for a in found] == [
        ("call-without-result", 4, 1),
        ("result-without-call", 5, None),
    ]
    assert "secret" not in repr(found)
