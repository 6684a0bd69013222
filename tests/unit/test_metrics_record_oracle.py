"""An attempt's flush-metrics record (flushing.metrics_record, a dict built from the attempt)
against the typed path it replaces, kept as the oracle: `FlushMetricsPayload` validated and
dumped as JSON. Fields the model would coerce or refuse take the model's path."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sessionfold.events.flush import FlushMetricsPayload, MetricsSnapshot
from sessionfold.projections.pruning.flushing import metrics_record
from sessionfold.projections.pruning.records import AttemptInfo

_ODD = st.sampled_from((None, True, 1.0, "3", b"x", -1, 2**70))
_FIELDS = ("id", "seq", "captured", "trigger", "time", "metrics", "processed", "outcome")


@st.composite
def _attempt(draw: st.DrawFn) -> tuple[dict[str, Any], Any, Any]:
    """(info, processed, outcome) as the fold writes them, or with one field damaged."""
    count = st.integers(0, 2**40)
    info: dict[str, Any] = {
        "id": draw(st.text(max_size=5)),
        "seq": draw(count),
        "captured": draw(count),
        "trigger": draw(st.sampled_from(("budget", "delta", "message-end", "manual", "rearmed"))),
        "time": draw(st.none() | st.text(max_size=5)),
        "metrics": {name: draw(count) for name in MetricsSnapshot.model_fields},
    }
    processed = draw(count)
    outcome = draw(st.sampled_from(_OUTCOMES))
    damaged = draw(st.none() | st.sampled_from(_FIELDS))
    odd = draw(_ODD)
    if damaged == "processed":
        processed = odd
    elif damaged == "outcome":
        outcome = draw(st.sampled_from(("?", odd)))
    elif damaged == "trigger":
        info["trigger"] = draw(st.sampled_from(("?", odd)))
    elif damaged == "metrics":
        name = draw(st.sampled_from((*MetricsSnapshot.model_fields, "other")))
        if draw(st.booleans()):
            info["metrics"].pop(name, None)
        else:
            info["metrics"][name] = odd
    elif damaged is not None:
        info[damaged] = odd
    return info, processed, outcome


_OUTCOMES = (
    "summarized",
    "skipped-oversized",
    "skipped-deduped",
    "skipped-trivial",
    "empty",
    "error",
)


def _oracle(session_id: Any, info: dict[str, Any], processed: Any, outcome: Any) -> dict[str, Any]:
    payload = FlushMetricsPayload(
        request_id=info["id"],
        session_id=session_id,
        seq=info["seq"],
        trigger=info["trigger"],
        captured_batches=info["captured"],
        processed_batches=processed,
        outcome=outcome,
        metrics=MetricsSnapshot(**info["metrics"]),
        time=info["time"],
    )
    return payload.model_dump(mode="json")


@settings(max_examples=600)
@given(st.sampled_from(("s1", "s1", "", 5)), _attempt())
def test_the_record_is_the_dumped_payload(
    session_id: Any, attempt: tuple[dict[str, Any], Any, Any]
) -> None:
    """Same dict, key order included, as the model's dump; refused where the model refuses."""
    info, processed, outcome = attempt
    try:
        expected = _oracle(session_id, info, processed, outcome)
    except (ValidationError, TypeError):
        with pytest.raises((ValidationError, TypeError)):
            metrics_record(session_id, cast(AttemptInfo, info), processed, outcome)
        return
    record = metrics_record(session_id, cast(AttemptInfo, info), processed, outcome)
    assert record == expected
    assert list(record) == list(expected)
    assert list(record["metrics"]) == list(expected["metrics"])
