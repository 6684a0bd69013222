"""The frontier a flush stores (frontier.frontier_row, a dict built from the processed
batches) against the typed path it replaces, kept as the oracle: `frontier_after(processed)`
validated as a `Frontier` and dumped."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from sessionfold.projections.pruning.capture import Batch, Call
from sessionfold.projections.pruning.frontier import Processed, frontier_after, frontier_row

_KINDS = ("summarized", "skipped-oversized", "skipped-deduped", "skipped-trivial")


def _call(call_id: Any, tool: Any, raw: int) -> Call:
    return Call(
        key=f"{call_id}@1",
        tool_call_id=call_id,
        tool_name=tool,
        raw_chars=raw,
        content_hash="h",
        head="",
        seq=1,
    )


_CALL = st.builds(
    _call,
    st.sampled_from(("a", "b", "tool_1")),
    st.sampled_from(("read", "bash")),
    st.integers(0, 10_000),
)
_CALLS = st.lists(_CALL, max_size=3).map(tuple)
_PROCESSED = st.builds(
    Processed,
    st.builds(Batch, st.integers(0, 50), st.integers(0, 2**41), _CALLS),
    st.sampled_from(_KINDS),
    _CALLS,
    _CALLS,
    st.integers(0, 5_000),
)


def _oracle(processed: list[Processed]) -> dict[str, Any] | None:
    frontier = frontier_after(processed)
    return None if frontier is None else frontier.model_dump()


@given(st.lists(_PROCESSED, max_size=4))
def test_the_stored_frontier_is_the_dumped_model(processed: list[Processed]) -> None:
    """Same dict, key order included, as validating and dumping the Frontier model."""
    if processed and not (processed[-1].kept or processed[-1].deduped or processed[-1].batch.calls):
        return  # no call to put the frontier on: the flush never processes such a batch
    row = frontier_row(processed)
    expected = _oracle(processed)
    assert row == expected
    assert row is None or list(row) == list(expected or {})


@given(st.sampled_from((None, 7, b"x", "a")), st.sampled_from(("read", None, b"bash")))
def test_a_call_the_model_coerces_or_refuses_is_read_by_the_model(call_id: Any, tool: Any) -> None:
    """A call id or tool name that is not a string (a damaged row) goes through the model:
    coerced (bytes) or refused as the typed path does."""
    processed = [Processed(Batch(1, 2, (_call(call_id, tool, 3),)), "summarized", (), ())]
    try:
        expected = _oracle(processed)
    except ValidationError:
        with pytest.raises(ValidationError):
            frontier_row(processed)
        return
    assert frontier_row(processed) == expected
