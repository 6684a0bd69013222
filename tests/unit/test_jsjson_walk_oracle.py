"""js_json_length against the way it was written before, kept here as the oracle: the number
walk pushed every value (strings too) onto its stack and popped it, each float went through
`_float_delta`, and the UTF-8 output was decoded and its astral lead bytes counted one byte value
at a time. The walk now iterates containers and skips strings where it meets them, handles
positive plain-decimal floats inline, and the UTF-16 length is one encode."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.projections import jsjson
from sessionfold.projections.jsjson import js_json_length


def _old_utf16_units(utf8: bytes) -> int:
    text = utf8.decode("utf-8")
    return len(text) + sum(
        utf8.count(lead) for lead in (b"\xf0", b"\xf1", b"\xf2", b"\xf3", b"\xf4")
    )


def _old_number_delta(value: Any) -> int:
    delta = 0
    stack = [value]
    pop, extend = stack.pop, stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind is str:
            continue
        if kind is dict:
            extend(item.values())
        elif kind is list:
            extend(item)
        elif kind is float:
            delta += jsjson._float_delta(item)
        elif kind is int and not -jsjson._SAFE_INT <= item <= jsjson._SAFE_INT:
            delta += jsjson.js_number_length(item) - len(str(item))
    return delta


def _old_js_json_length(value: Any) -> int:
    """js_json_length as it was."""
    try:
        out = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return jsjson._slow_length(value)
    length = len(out) if out.isascii() else _old_utf16_units(out)
    return length + _old_number_delta(value)


_chars = st.one_of(
    st.characters(),
    st.characters(min_codepoint=0x10000),  # astral: two UTF-16 units, a 4-byte UTF-8 lead
    st.characters(categories=["Cs"]),  # lone surrogates: orjson refuses them (slow path)
    st.sampled_from(["é", "中", "\u2028", "😀", "\U000f0000", "\U0010ffff", '"', "\\", "."]),
)
_floats = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=1e-6, max_value=1e17),  # around the inline range's edges
    st.integers(-(2**60), 2**60).map(float),  # integral floats: "1.0" against "1"
    st.sampled_from([1e-5, 9.999999e-6, 1e16, 9999999999999998.0, -1e-5, -0.0, 0.0, 5e-324]),
)
_numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**53, 2**53 + 1, -(2**53), -(2**53) - 1, 2**64, 10**300]),
    _floats,
)
_scalars = st.one_of(st.none(), st.booleans(), _numbers, st.text(_chars, max_size=8))
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=1500, deadline=None)
@given(_json)
def test_length_as_before(value: Any) -> None:
    """Any JSON value (scalars, nested containers, astral text, lone surrogates, floats around
    the inline range, integers past 2**53) measures as the old code measured it."""
    assert js_json_length(value) == _old_js_json_length(value)


@settings(max_examples=300, deadline=None)
@given(st.lists(_numbers, max_size=6), st.integers(0, 40))
def test_deep_numbers_as_before(numbers: list[Any], depth: int) -> None:
    """Numbers deep in alternating dicts and lists are all counted, as before."""
    value: Any = numbers
    for level in range(depth):
        value = {"k": value, "n": numbers[:1]} if level % 2 else [value, *numbers[:1]]
    assert js_json_length(value) == _old_js_json_length(value)
