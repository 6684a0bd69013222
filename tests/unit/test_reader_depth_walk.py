"""The depth bound of a long common line, walked over its parsed containers (`nests_within`),
against the exact walk (`too_deep`) and the reader's general path: a line nested past
`MAX_DEPTH` is still refused (a DepthError dead letter and its placeholder), whichever way."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_reader_fast_path import comparable

from sessionfold.events.lines import DEPTH_ERROR, MAX_DEPTH, nests_within, too_deep
from sessionfold.streams.publishing import session_file
from sessionfold.streams.publishing.session_file import DeadLetter, SessionFileReader

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3)
    ),
    max_leaves=40,
)


def nested(levels: int, inner: Any) -> Any:
    """`inner` inside `levels` arrays and objects, alternating."""
    for level in range(levels):
        inner = [inner] if level % 2 else {"k": inner}
    return inner


@settings(max_examples=1500)
@given(_JSON, st.integers(0, 8), st.integers(0, 6))
def test_the_level_walk_is_the_exact_walk(value: Any, wrap: int, limit: int) -> None:
    """Property: `nests_within` is `not too_deep` for any JSON value and limit."""
    value = nested(wrap, value)
    assert nests_within(value, limit) == (not too_deep(value, limit))


def _entry(index: int, depth: int, pad: int) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "type": "message",
        "id": f"e{index}",
        "parentId": f"e{index - 1}" if index > 1 else None,
        "timestamp": "2025-01-01T00:00:00Z",
        "message": {"role": "user", "content": "x" * pad},
    }
    if depth:
        # The entry is one level; what it holds nests `depth - 1` more.
        entry["extra"] = nested(depth - 1, 1)
    return entry


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, MAX_DEPTH + 2]),
            st.sampled_from([10, session_file._WALK_FROM, 3 * session_file._WALK_FROM]),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_long_deep_lines_read_as_the_general_path(shapes: list[tuple[int, int]]) -> None:
    """Property: a file of short and long lines nested up to and past the limit reads through
    the fast path as through the general path, and every line nested past it is a DepthError
    dead letter."""
    header = json.dumps({"type": "session", "id": "s1", "version": 3})
    body = [json.dumps(_entry(i + 1, depth, pad)) for i, (depth, pad) in enumerate(shapes)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.jsonl"
        path.write_text("\n".join([header, *body]) + "\n")
        seen = {}
        for fast in (True, False):
            reader = SessionFileReader(path)
            reader._fast = fast
            seen[fast] = [comparable(r) for r in reader.records()]
    assert seen[True] == seen[False]
    deep = [r for r in seen[True] if isinstance(r, DeadLetter) and r.error == DEPTH_ERROR]
    assert len(deep) == sum(depth > MAX_DEPTH for depth, _pad in shapes)
