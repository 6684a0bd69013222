"""The context request's two forms of pi's array (whole `messages`, or their `shape`) and the
check against the log's context, as properties over arbitrary bodies."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionfold.projections.views.context import message_identities
from sessionfold.streams.web import live_contract as contract

_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
_ids = st.none() | st.sampled_from(["call_1", "call_2", "toolu_x"])
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "toolResult", "custom"])},
    optional={"toolCallId": st.sampled_from(["call_1", "call_2", "toolu_x"]), "content": _json},
)


def _shape(messages: list[dict[str, Any]]) -> list[list[Any]]:
    """What the pi extension sends: each message's [role, toolCallId or null]."""
    return [[m["role"], m.get("toolCallId")] for m in messages]


@given(st.lists(_message, max_size=12), st.lists(_message, max_size=12))
def test_the_shape_checks_exactly_as_the_whole_array_does(
    pi_array: list[dict[str, Any]], logged: list[dict[str, Any]]
) -> None:
    """Sent whole or as its shape, pi's array matches the log's context in the same cases: same
    length, roles and tool call ids in order."""
    _, whole, _ = contract.context_request({"leaf": None, "messages": pi_array}, 1.0)
    _, slim, _ = contract.context_request({"leaf": None, "shape": _shape(pi_array)}, 1.0)
    assert whole == slim
    expected = len(pi_array) == len(logged) and all(
        a["role"] == b["role"] and a.get("toolCallId") == b.get("toolCallId")
        for a, b in zip(pi_array, logged, strict=False)
    )
    ours = message_identities(logged)
    assert contract.same_messages(whole, ours) is expected
    assert contract.same_messages(slim, ours) is expected


@given(st.dictionaries(st.sampled_from(["leaf", "shape", "messages", "wait_ms"]), _json))
def test_any_body_is_a_request_or_a_bad_request(body: dict[str, Any]) -> None:
    """Whatever a client sends, the check answers a request or BadRequest (a 400), never
    another exception; an item of an array that is not a message matches no logged one."""
    try:
        leaf, shape, wait = contract.context_request(body, 2.0)
    except contract.BadRequest:
        return
    assert leaf is None or isinstance(leaf, str)
    assert wait >= 0
    logged = [{"role": "user"}] * len(shape)
    if any(not isinstance(m, dict) for m in body.get("messages") or []) and "shape" not in body:
        assert not contract.same_messages(shape, message_identities(logged))


@pytest.mark.parametrize(
    "shape",
    [
        "user",
        [["user"]],
        [["user", "a", "b"]],
        [[1, None]],
        [["toolResult", 7]],
        [{"role": "user"}],
    ],
)
def test_a_malformed_shape_is_refused(shape: Any) -> None:
    """A shape is an array of [string, string or null]; anything else is a 400, not a guess."""
    with pytest.raises(contract.BadRequest):
        contract.context_request({"leaf": "a", "shape": shape}, 1.0)
