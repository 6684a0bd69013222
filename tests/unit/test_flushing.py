"""Flush attempts, compactions, eager spill and turn-end gates (projections/pruning/flushing.py)."""

from __future__ import annotations

from typing import Any

from pruning_session import SESSION_ID, Driver, assistant, driver, result, user

from sessionfold.events.envelope import FlushMetricsEnvelope, FlushRequestEnvelope
from sessionfold.events.flush import (
    BatchResult,
    CompactionPayload,
    FlushMetricsPayload,
    FlushRequestPayload,
    read_flush_metrics,
    read_request,
)
from sessionfold.projections.pruning import flushing, index, windows
from sessionfold.projections.pruning.session import Session, flush_records

BIG = "x" * 1500  # over the default minBatchChars (1,000): the summarizer's work


def _one_turn(d: Driver, session: Session, *texts: str) -> bool:
    """A user turn with one call per text; True when the turn ended."""
    d.add(session, user())
    ids = [f"c{d.seq}-{i}" for i in range(len(texts))]
    d.add(session, assistant(*ids))
    return [d.add(session, result(c, t)) for c, t in zip(ids, texts, strict=True)][-1]


def _metrics(outputs: list[Any]) -> FlushMetricsPayload:
    [envelope] = outputs
    assert isinstance(envelope, FlushMetricsEnvelope)
    return read_flush_metrics(envelope)


def _request(outputs: list[Any]) -> FlushRequestPayload:
    [envelope] = outputs
    assert isinstance(envelope, FlushRequestEnvelope)
    return read_request(envelope)


def _answer(request: FlushRequestPayload, text: str = "short summary") -> CompactionPayload:
    results = tuple(
        BatchResult(
            batch=i,
            outcome="summarized",
            text=text,
            refs=tuple(c.ref for c in b.calls if c.ref is not None),
        )
        for i, b in enumerate(request.batches)
    )
    return CompactionPayload(
        request_id=request.request_id, session_id=SESSION_ID, model="offline", results=results
    )


def test_a_flush_with_nothing_captured_records_an_empty_attempt() -> None:
    """No batch: one flush-metrics record, outcome empty, no request and no barrier."""
    session = driver().session
    metrics = _metrics(flushing.start_flush(session, "manual", 4, None))
    assert (metrics.outcome, metrics.captured_batches, metrics.trigger) == ("empty", 0, "manual")
    assert not session.busy
    session.save()
    assert [r["outcome"] for r in flush_records(session.store, SESSION_ID)] == ["empty"]


def test_attempts_at_one_seq_get_numbered_ids() -> None:
    """A second attempt at the same seq has `:2` after the first attempt's id."""
    session = driver().session
    first = _metrics(flushing.start_flush(session, "manual", 7, None))
    second = _metrics(flushing.start_flush(session, "manual", 7, None))
    third = _metrics(flushing.start_flush(session, "manual", 8, None))
    assert [m.request_id for m in (first, second, third)] == [
        f"{SESSION_ID}:7",
        f"{SESSION_ID}:7:2",
        f"{SESSION_ID}:8",
    ]


def test_a_batch_for_the_model_raises_the_barrier_until_its_answer() -> None:
    """The request carries the batch with its refs; while it is out, no second attempt starts."""
    d = driver()
    session = d.session
    _one_turn(d, session, BIG)
    request = _request(flushing.start_flush(session, "manual", d.seq, "t0"))
    assert session.busy
    assert [[c.ref for c in b.calls] for b in request.batches] == [["t1"]]
    assert request.batches[0].disposition == "summarize"
    assert flushing.start_flush(session, "manual", d.seq + 1, None) == []


def test_the_answer_indexes_the_summary_and_advances_the_frontier() -> None:
    """A summarized answer: summary 1 under its ref, frontier at the call, one metrics record."""
    d = driver()
    session = d.session
    _one_turn(d, session, BIG)
    request = _request(flushing.start_flush(session, "manual", d.seq, None))
    call = request.batches[0].calls[0]
    metrics = _metrics(flushing.apply_compaction(session, _answer(request)) or [])
    assert (metrics.outcome, metrics.processed_batches) == ("summarized", 1)
    assert not session.busy
    assert index.resolve_ref(session.store, SESSION_ID, "t1") == call.key
    assert (index.summary(session.store, SESSION_ID, 1) or {})["text"] == "short summary"
    frontier = windows.frontier_of(session)
    assert frontier is not None and frontier.last_attempted_tool_call_id == call.tool_call_id
    assert session.head["stats"]["reclaimed_chars"] == 1500 - len("short summary")
    assert windows.capture(session) == []


def test_an_answer_to_nothing_outstanding_is_ignored() -> None:
    """A wrong request id changes nothing; a second answer to a finished request neither."""
    d = driver()
    session = d.session
    _one_turn(d, session, BIG)
    request = _request(flushing.start_flush(session, "manual", d.seq, None))
    wrong = _answer(request).model_copy(update={"request_id": "other"})
    assert flushing.apply_compaction(session, wrong) is None
    assert session.busy
    assert flushing.apply_compaction(session, _answer(request)) is not None
    assert flushing.apply_compaction(session, _answer(request)) is None


def test_a_failed_answer_keeps_the_frontier_and_the_queue() -> None:
    """An answer with an error processes nothing: outcome error, no frontier, batch still queued."""
    d = driver()
    session = d.session
    _one_turn(d, session, BIG)
    request = _request(flushing.start_flush(session, "manual", d.seq, None))
    failed = CompactionPayload(
        request_id=request.request_id, session_id=SESSION_ID, model="offline", error="timeout"
    )
    metrics = _metrics(flushing.apply_compaction(session, failed) or [])
    assert (metrics.outcome, metrics.processed_batches) == ("error", 0)
    assert windows.frontier_of(session) is None
    assert session.head["queued"] == 1
    assert len(windows.capture(session)) == 1


def test_a_trivial_batch_finishes_without_the_model() -> None:
    """A batch under minBatchChars is skipped at once: no request, the frontier moves past it."""
    d = driver()
    session = d.session
    _one_turn(d, session, "tiny")
    metrics = _metrics(flushing.start_flush(session, "manual", d.seq, None))
    assert metrics.outcome == "skipped-trivial"
    assert not session.busy
    frontier = windows.frontier_of(session)
    assert frontier is not None and frontier.outcome == "skipped-trivial"


def test_the_same_output_in_a_later_flush_is_aliased() -> None:
    """A result whose content an earlier flush indexed is deduped, never summarized again."""
    d = driver()
    session = d.session
    _one_turn(d, session, BIG)
    request = _request(flushing.start_flush(session, "manual", d.seq, None))
    flushing.apply_compaction(session, _answer(request))
    _one_turn(d, session, BIG)
    metrics = _metrics(flushing.start_flush(session, "manual", d.seq, None))
    assert metrics.outcome == "skipped-deduped"
    assert session.head["stats"]["deduped_calls"] == 1


def test_a_turn_end_spills_an_oversized_result_without_the_model() -> None:
    """A result at spillThreshold is indexed by pointer with a preview at its turn end."""
    d = driver(spillThreshold=500, spillPreviewBytes=10)
    session = d.session
    assert _one_turn(d, session, "y" * 600)
    assert flushing.turn_end(session, d.seq, None) == []
    [key] = [k for k in session.store if "/pr/i/" in k]
    record = index.record(session.store, SESSION_ID, key.rpartition("/pr/i/")[2]) or {}
    assert record["spill"]["bytes"] == 600
    assert session.head["stats"]["spilled_calls"] == 1
    assert session.head["queued"] == 0
    assert windows.capture(session) == []


def test_a_turn_end_over_the_budget_starts_a_budget_flush() -> None:
    """Usage at the threshold of the window triggers a flush of the queued batch."""
    d = driver(autoBudgetThreshold=0.5, contextWindow=1000)
    session = d.session
    d.add(session, user())
    d.add(session, assistant("c1", usage={"totalTokens": 800}))
    assert d.add(session, result("c1", BIG))
    request = _request(flushing.turn_end(session, d.seq, None))
    assert request.trigger == "budget"
    assert not windows.gate_open(session)


def test_a_turn_end_under_the_budget_only_queues() -> None:
    """Below the threshold the batch is queued and nothing is flushed."""
    d = driver(autoBudgetThreshold=0.9, contextWindow=1000)
    session = d.session
    d.add(session, user())
    d.add(session, assistant("c1", usage={"totalTokens": 100}))
    d.add(session, result("c1", BIG))
    assert flushing.turn_end(session, d.seq, None) == []
    assert (session.head["queued"], session.head["prev"]) == (1, 0.1)


def test_a_turn_end_does_nothing_when_pruning_is_off() -> None:
    """With pruning disabled the gate closes and nothing is queued."""
    d = driver(enabled=False, autoBudgetThreshold=0.1, contextWindow=1000)
    session = d.session
    _one_turn(d, session, BIG)
    assert flushing.turn_end(session, d.seq, None) == []
    assert session.head["queued"] == 0
    assert not windows.gate_open(session)
