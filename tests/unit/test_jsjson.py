"""js_json_length against JavaScript's JSON.stringify(value).length."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionfold.projections.jsjson import js_json_length, js_number_text

# Expected lengths and texts printed by Node 20's JSON.stringify for the same values.
HAND_CHECKED: list[tuple[str, Any, int]] = [
    (
        "plain message",
        {"role": "user", "content": [{"type": "text", "text": "hi"}], "timestamp": 1763681581544},
        81,
    ),
    ("integral floats and -0", [1.0, 2.50, -0.0, 0.0], len("[1,2.5,0,0]")),
    (
        "small numbers",
        [1e-7, 1.5e-7, 1e-6, 0.000001, 0.00001, 0.000123],
        len("[1e-7,1.5e-7,0.000001,0.000001,0.00001,0.000123]"),
    ),
    (
        "large numbers",
        [1e21, 1.2e21, 1e20, 123456789012345680000.0, 1e16, 2.0**60],
        len(
            "[1e+21,1.2e+21,100000000000000000000,123456789012345680000,"
            "10000000000000000,1152921504606847000]"
        ),
    ),
    (
        "integers beyond 2**53 and 2**64",
        [9007199254740993, 12345678901234567890, 10**300],
        len("[9007199254740992,12345678901234567000,1e+300]"),
    ),
    ("control characters", ["\b\f\n\r\t", "\u0000\u001f\u007f", '"\\/'], 38),
    ("astral and non-ASCII", ["😀", "é", "\u2028\u2029", "中文"], 20),
    ("lone surrogates", ["\ud800", "a\udc00b", "😀"], 26),
    ("index-like keys", {"b": 1, "2": 2, "a": 3, "10": 4, "01": 5}, 33),
    (
        "nested usage",
        {
            "usage": {"cost": {"input": 0.0123, "output": 1.5e-8, "total": 3}},
            "x": [[], {}, None, True, False],
        },
        89,
    ),
]


@pytest.mark.parametrize(
    ("value", "expected"), [c[1:] for c in HAND_CHECKED], ids=[c[0] for c in HAND_CHECKED]
)
def test_hand_checked_lengths(value: Any, expected: int) -> None:
    """Lengths match what Node printed for the same values."""
    assert js_json_length(value) == expected


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (1.0, "1"),
        (1e21, "1e+21"),
        (1e-7, "1e-7"),
        (1e-6, "0.000001"),
        (1.5e300, "1.5e+300"),
        (-2.5e-10, "-2.5e-10"),
        (123456789012345680000.0, "123456789012345680000"),
        (1763681581544, "1763681581544"),
        (float("nan"), "NaN"),
    ],
)
def test_number_text_as_javascript_prints(number: float, text: str) -> None:
    """js_number_text prints numbers as JavaScript's String(number)."""
    assert js_number_text(number) == text


def test_lone_surrogate_takes_slow_path() -> None:
    """A lone surrogate (orjson refuses it) counts as a 6-character escape."""
    assert js_json_length({"t": "x\udbff"}) == len('{"t":"x\\udbff"}')


# --- property test against node --------------------------------------------------------------

_chars = st.one_of(
    st.characters(),
    st.characters(categories=["Cs"]),
    st.characters(max_codepoint=0x20),
    st.sampled_from(["\u007f", "\u2028", "😀", '"', "\\", "/"]),
)
_numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e21, 1e-7, 1e-6, 1e-5, 1e16, 0.1, -0.0, 5e-324, 1.7976931348623157e308]),
)
_keys = st.one_of(st.text(_chars, max_size=4), st.integers(0, 30).map(str))
_json = st.recursive(
    st.one_of(st.none(), st.booleans(), _numbers, st.text(_chars, max_size=12)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=12,
)


def _node_lengths(values: list[Any]) -> list[int]:
    """JSON.stringify(v).length for each value, computed by one node process."""
    script = (
        "let s='';process.stdin.on('data',d=>s+=d).on('end',()=>{"
        "console.log(JSON.stringify(JSON.parse(s).map(v=>JSON.stringify(v).length)))})"
    )
    # ensure_ascii carries lone surrogates across as \\udxxx escapes, which JSON.parse keeps.
    text = json.dumps(values, ensure_ascii=True)
    done = subprocess.run(
        ["node", "-e", script], input=text, capture_output=True, text=True, check=True, timeout=30
    )
    return json.loads(done.stdout)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_json, min_size=150, max_size=150))
def test_matches_node_on_random_values(values: list[Any]) -> None:
    """Random JSON values measure exactly as node's JSON.stringify(...).length."""
    assert [js_json_length(v) for v in values] == _node_lengths(values)
