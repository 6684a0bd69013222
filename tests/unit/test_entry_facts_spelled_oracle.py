"""Entry-fact helpers against the way they were written before, kept here as oracles: a call's
arguments looked up by a loop over the three names (now spelled out), and a number told by
`isinstance(value, int | float)` (the union built at each call; now a tuple built once). The
usage tokens' parts, now spelled out too, have their oracle in test_entry_facts_oracle."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.projections.jsjson import js_number_text
from sessionfold.projections.pruning import entry_facts as ef


def _old_call_arguments(block: dict[str, Any]) -> dict[str, Any]:
    """call_arguments as it was."""
    for name in ("input", "args", "arguments"):
        value = block.get(name)
        if value is not None:
            return value if isinstance(value, dict) else {}
    return {}


def _old_number_or_none(value: Any) -> int | float | None:
    """_number_or_none as it was."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _old_occurrence_key(call_id: Any, timestamp: Any) -> str:
    """occurrence_key as it was."""
    bare = ef._js_string(call_id)
    if isinstance(timestamp, int | float) and not isinstance(timestamp, bool):
        return f"{bare}@{js_number_text(timestamp)}"
    return bare


_VALUE = (
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=3)
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(st.text(max_size=2), st.integers(), max_size=2)
)
_BLOCK = st.dictionaries(
    st.sampled_from(("input", "args", "arguments", "type", "id", "name")), _VALUE, max_size=6
)


@settings(deadline=None, max_examples=500)
@given(_BLOCK)
def test_call_arguments_as_before(block: dict[str, Any]) -> None:
    """The same arguments, and the very object when it is one of the block's."""
    new, old = ef.call_arguments(block), _old_call_arguments(block)
    assert new == old
    if any(old is v for v in block.values()):
        assert new is old


@settings(deadline=None, max_examples=500)
@given(_VALUE, _VALUE | st.text(max_size=4))
def test_numbers_and_occurrence_keys_as_before(value: Any, call_id: Any) -> None:
    """The same number (the very object) or None, and the same occurrence key."""
    assert ef._number_or_none(value) is _old_number_or_none(value)
    assert ef.occurrence_key(call_id, value) == _old_occurrence_key(call_id, value)
