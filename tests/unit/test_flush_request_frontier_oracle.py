"""The frontier a flush request carries (flush_request.frontier_document, a copy of the row a
flush stored) against the typed path it replaces, kept as the oracle: the row validated as a
`Frontier` and dumped; and the usage of a flush's answers (flush_pipeline.answered_usage)
against `ModelUsage.plus` over them in order."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sessionfold.events.flush import BatchResult, Frontier, ModelUsage
from sessionfold.projections.pruning.flush_pipeline import answered_usage
from sessionfold.projections.pruning.flush_request import frontier_document

_OUTCOMES = ("summarized", "skipped-oversized", "skipped-deduped", "skipped-trivial")
_ODD = st.sampled_from((None, True, 1.5, "7", b"x", -3, 2**70, "", [], {}))
_FIELDS = tuple(Frontier.model_fields)


@st.composite
def _rows(draw: st.DrawFn) -> Any:
    """A frontier as a flush stores it, or damaged: a field dropped, reordered, retyped or
    added, or not a dict at all."""
    row: dict[str, Any] = {
        "last_attempted_tool_call_id": draw(st.text(max_size=8)),
        "last_attempted_tool_name": draw(st.sampled_from(("read", "bash", "unknown"))),
        "last_attempted_turn_index": draw(st.integers(-5, 10**6)),
        "last_attempted_timestamp": draw(st.integers(0, 2**53)),
        "attempted_batch_count": draw(st.integers(0, 50)),
        "attempted_tool_call_count": draw(st.integers(0, 500)),
        "raw_char_count": draw(st.integers(0, 10**9)),
        "summary_char_count": draw(st.integers(0, 10**6)),
        "outcome": draw(st.sampled_from(_OUTCOMES)),
    }
    damage = draw(st.sampled_from(("none", "none", "drop", "swap", "retype", "extra", "list")))
    field = draw(st.sampled_from(_FIELDS))
    if damage == "drop":
        del row[field]
    elif damage == "swap":
        row = {field: row.pop(field), **row}
    elif damage == "retype":
        row[field] = draw(_ODD)
    elif damage == "extra":
        row["other"] = 1
    elif damage == "list":
        return list(row.items())
    return row


@settings(max_examples=500)  # each damage of each field drawn several times
@given(_rows())
def test_the_request_frontier_is_the_validated_and_dumped_model(raw: Any) -> None:
    """Same dict, key order included, or the same refusal, as the model; never the row itself."""
    try:
        expected = Frontier.model_validate(raw).model_dump(mode="json")
    except ValidationError:
        with pytest.raises(ValidationError):
            frontier_document(raw)
        return
    document = frontier_document(raw)
    assert document == expected
    assert list(document) == list(expected)
    assert [type(v) for v in document.values()] == [type(v) for v in expected.values()]
    assert document is not raw  # the request's copy: the head's row stays apart


_USAGE = st.builds(
    ModelUsage,
    input_tokens=st.integers(0, 2**40),
    output_tokens=st.integers(0, 2**40),
    cost=st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(0, 10**6)),
    calls=st.integers(0, 9),
)
_RESULT = st.builds(
    BatchResult,
    batch=st.integers(0, 9),
    outcome=st.sampled_from(("summarized", "skipped-trivial", "failed")),
    text=st.none() | st.text(max_size=4),
    usage=_USAGE,
)


@given(st.lists(_RESULT, max_size=6))
def test_answered_usage_is_plus_over_the_summarized_answers(results: list[BatchResult]) -> None:
    expected = ModelUsage()
    for result in results:
        if result.outcome == "summarized":
            expected = expected.plus(result.usage)
    usage = answered_usage(results)
    assert usage.model_dump() == expected.model_dump()
    assert repr(usage.cost) == repr(expected.cost)  # the same float, sign of zero included
