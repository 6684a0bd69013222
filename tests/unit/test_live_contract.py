"""The context request's two forms of pi's array (whole `messages`, or their `shape`) and the
check against the log's context, as properties over arbitrary bodies."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionfold.projections.views.context import apply_patch, message_identities, patch_of
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
    whole = contract.context_request({"leaf": None, "messages": pi_array}, 1.0).shape
    slim = contract.context_request({"leaf": None, "shape": _shape(pi_array)}, 1.0).shape
    assert whole == slim
    expected = len(pi_array) == len(logged) and all(
        a["role"] == b["role"] and a.get("toolCallId") == b.get("toolCallId")
        for a, b in zip(pi_array, logged, strict=False)
    )
    ours = message_identities(logged)
    assert contract.same_messages(whole, ours) is expected
    assert contract.same_messages(slim, ours) is expected


@given(
    st.dictionaries(
        st.sampled_from(["leaf", "shape", "messages", "wait_ms", "answer"]),
        _json | st.sampled_from(["messages", "patch"]),
    )
)
def test_any_body_is_a_request_or_a_bad_request(body: dict[str, Any]) -> None:
    """Whatever a client sends, the check answers a request or BadRequest (a 400), never
    another exception; an item of an array that is not a message matches no logged one."""
    try:
        request = contract.context_request(body, 2.0)
    except contract.BadRequest:
        return
    leaf, shape, wait = request.leaf, request.shape, request.wait_s
    assert leaf is None or isinstance(leaf, str)
    assert wait >= 0
    assert request.patch is (body.get("answer") == "patch")
    logged = [{"role": "user"}] * len(shape)
    messages = body.get("messages")
    items = messages if isinstance(messages, list) else []  # else ignored: a shape was sent
    if any(not isinstance(m, dict) for m in items) and "shape" not in body:
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


_made = st.fixed_dictionaries({"role": st.sampled_from(["user", "toolResult", "custom"])})


@given(st.lists(_message, max_size=15), st.data())
def test_a_patch_yields_the_render_from_pi_s_array(
    unpruned: list[dict[str, Any]], data: st.DataObject
) -> None:
    """Any render (pi's messages kept, dropped, moved or repeated, new ones put anywhere) as a
    patch, applied to a copy of pi's array (equal messages, not the same objects), gives the
    render, equal item by item; runs of kept messages come as one [start, end) each."""
    picks = st.one_of(st.integers(0, max(0, len(unpruned) - 1)), _made)
    chosen = data.draw(st.lists(picks if unpruned else _made, max_size=20))
    messages = [unpruned[c] if isinstance(c, int) else c for c in chosen]
    patch = patch_of(messages, unpruned)
    assert apply_patch(patch, copy.deepcopy(unpruned)) == messages
    runs = [item for item in patch if isinstance(item, list)]
    assert all(0 <= start < end <= len(unpruned) for start, end in runs)
    for before, after in itertools.pairwise(patch):
        if isinstance(before, list) and isinstance(after, list):
            assert after[0] != before[1]  # adjacent runs are merged


_items = st.lists(
    st.sampled_from([["user", None], ["assistant", None], ["toolResult", "call_1"]])
    | st.lists(_scalars, max_size=3),
    max_size=6,
)


@given(_items, st.lists(_message, max_size=6))
def test_a_known_shape_reads_as_the_check_of_each_item_would(
    shape: list[Any], logged: list[dict[str, Any]]
) -> None:
    """A request read against a known shape (serve's API process: its render's) is the request
    read without it, or refused the same way, whatever shape pi sent."""
    identities = message_identities(logged)
    known = ([list(identity) for identity in identities], identities)
    body = {"leaf": "a", "shape": shape, "answer": "patch"}
    try:
        plain = contract.context_request(body, 1.0)
    except contract.BadRequest:
        with pytest.raises(contract.BadRequest):
            contract.context_request(body, 1.0, known)
        return
    read = contract.context_request(body, 1.0, known)
    assert read == plain
    assert contract.same_messages(read.shape, identities) == (shape == known[0])
