"""The pre-flush pipeline and the walk over answers (reference §5.3-5.5)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sessionfold.events.flush import BatchResult, ModelUsage
from sessionfold.projections.pruning.capture import Batch, Call
from sessionfold.projections.pruning.flush_pipeline import (
    FlushPlan,
    answered_usage,
    plan_flush,
    walk_answers,
)


def _call(call_id: str, raw: int = 600, digest: str | None = None) -> Call:
    return Call(
        key=f"{call_id}@1",
        tool_call_id=call_id,
        tool_name="read",
        raw_chars=raw,
        content_hash=digest or f"h-{call_id}",
        head="",
        seq=1,
    )


def _plan(
    batches: list[Batch], canon: dict[str, str] | None = None, next_ref: int = 1
) -> FlushPlan:
    table = canon or {}
    return plan_flush(batches, table.get, dedup=True, min_batch_chars=1000, next_ref=next_ref)


def _ok(index: int, text: str = "s", cost: float = 0.0) -> BatchResult:
    return BatchResult(
        batch=index, outcome="summarized", text=text, usage=ModelUsage(calls=1, cost=cost)
    )


def test_refs_are_allocated_in_batch_order_for_summarized_batches_only() -> None:
    """Refs tN go to the kept calls of model-bound batches, in order, from the counter."""
    plan = _plan(
        [
            Batch(0, 0, (_call("a"), _call("b"))),
            Batch(1, 0, (_call("c", raw=10),)),
            Batch(2, 0, (_call("d", raw=2000),)),
        ],
        next_ref=4,
    )
    assert [b.disposition for b in plan.batches] == ["summarize", "skipped-trivial", "summarize"]
    assert [b.refs for b in plan.batches] == [("t4", "t5"), (), ("t6",)]
    assert plan.next_ref == 7
    assert plan.needs_model


def test_dedup_against_an_earlier_canonical_and_fully_deduped_batch() -> None:
    """A call whose hash has a canonical with another key is aliased; all-aliased is deduped."""
    plan = _plan(
        [Batch(0, 0, (_call("a", digest="H"),)), Batch(1, 0, (_call("b", digest="H"),))],
        canon={"H": "orig@0"},
    )
    assert [b.disposition for b in plan.batches] == ["skipped-deduped", "skipped-deduped"]
    assert plan.batches[0].deduped[0][1] == "orig@0"
    assert not plan.needs_model


def test_same_key_canonical_is_not_a_duplicate() -> None:
    """A canonical that is the call itself is not a duplicate."""
    plan = _plan([Batch(0, 0, (_call("a", raw=2000, digest="H"),))], canon={"H": "a@1"})
    assert plan.batches[0].disposition == "summarize"


def test_duplicates_within_one_flush_both_go_to_the_summarizer() -> None:
    """Dedup is cross-flush only: two equal outputs in one flush are both kept."""
    plan = _plan([Batch(0, 0, (_call("a", 2000, "H"),)), Batch(1, 0, (_call("b", 2000, "H"),))])
    assert [b.disposition for b in plan.batches] == ["summarize", "summarize"]


def test_trivial_counts_only_the_calls_left_after_dedup() -> None:
    """A batch whose kept calls are under minBatchChars is trivial even if dedup took more."""
    plan = _plan([Batch(0, 0, (_call("a", 5000, "H"), _call("b", 100)))], canon={"H": "orig@0"})
    assert plan.batches[0].disposition == "skipped-trivial"
    assert len(plan.batches[0].deduped) == 1


def test_zero_min_batch_chars_disables_the_trivial_skip() -> None:
    """minBatchChars 0 sends even tiny batches to the summarizer."""
    plan = plan_flush(
        [Batch(0, 0, (_call("a", 1),))], {}.get, dedup=False, min_batch_chars=0, next_ref=1
    )
    assert plan.batches[0].disposition == "summarize"


def test_walk_stops_at_the_first_failure() -> None:
    """Batches from the first failed one on stay unprocessed; earlier ones are processed."""
    plan = _plan(
        [
            Batch(0, 0, (_call("a", 1500),)),
            Batch(1, 0, (_call("b", 10),)),
            Batch(2, 0, (_call("c", 1500),)),
            Batch(3, 0, (_call("d", 10),)),
        ]
    )
    failed = BatchResult(batch=2, outcome="failed", error="transient")
    walk = walk_answers(plan, {0: _ok(0, cost=0.5), 2: failed})
    assert [p.kind for p in walk.processed] == ["summarized", "skipped-trivial"]
    assert walk.unprocessed == 2
    assert walk.outcome == "summarized"
    assert walk.frontier is not None and walk.frontier.last_attempted_tool_call_id == "b"
    assert walk.usage.cost == 0.5


def test_walk_with_nothing_processed_is_an_error_without_frontier() -> None:
    """A first batch that fails leaves nothing processed: outcome error, frontier unchanged."""
    plan = _plan([Batch(0, 0, (_call("a", 1500),))])
    walk = walk_answers(plan, {})
    assert walk.outcome == "error"
    assert walk.frontier is None
    assert walk.unprocessed == 1


def test_oversized_summary_is_discarded_but_processed() -> None:
    """A summary longer than its raw output is skipped-oversized, not kept, frontier advanced."""
    plan = _plan([Batch(0, 0, (_call("a", 1500),))])
    walk = walk_answers(plan, {0: _ok(0, text="x" * 1501)})
    assert walk.outcome == "skipped-oversized"
    assert walk.summaries == ()
    assert walk.frontier is not None and walk.frontier.summary_char_count == 1501


def test_blank_summary_is_a_failure() -> None:
    """A blank text is not a usable summary."""
    plan = _plan([Batch(0, 0, (_call("a", 1500),))])
    assert walk_answers(plan, {0: _ok(0, text="  \n")}).outcome == "error"


_HASHES = st.sampled_from(["H", "I", "J"])
_BATCHES = st.lists(
    st.builds(
        lambda turn, calls: Batch(turn, 0, tuple(calls)),
        st.integers(0, 5),
        st.lists(
            st.builds(_call, st.sampled_from("abcd"), st.integers(0, 1500), _HASHES),
            min_size=1,
            max_size=4,
        ),
    ),
    max_size=4,
)


@given(_BATCHES, st.dictionaries(_HASHES, st.sampled_from(["a@1", "z@0"])), st.booleans())
def test_each_planned_batch_holds_exactly_the_calls_dedup_kept(
    batches: list[Batch], canon: dict[str, str], dedup: bool
) -> None:
    """Property: a planned batch is its captured batch with the deduped calls left out (the
    captured batch itself when dedup took none), nothing else changed."""
    plan = plan_flush(batches, canon.get, dedup=dedup, min_batch_chars=1000, next_ref=1)
    for batch, planned in zip(batches, plan.batches, strict=True):
        aliased = [id(call) for call, _ in planned.deduped]
        kept = tuple(call for call in batch.calls if id(call) not in aliased)
        assert planned.batch == Batch(
            batch.turn_index, batch.timestamp, kept, batch.assistant_text, batch.group
        )


_COUNT = st.integers(min_value=0, max_value=10**9)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["summarized", "failed", "skipped-trivial"]),
            st.builds(
                ModelUsage,
                input_tokens=_COUNT,
                output_tokens=_COUNT,
                cost=st.integers(min_value=0, max_value=10**6).map(float),
                calls=st.integers(min_value=0, max_value=4),
                cache_read_tokens=_COUNT,
                cache_write_tokens=_COUNT,
            ),
        ),
        max_size=8,
    )
)
def test_answered_usage_sums_the_summarized_answers(answers: list[tuple[str, ModelUsage]]) -> None:
    """Every count of the summarized answers' usage (cache reads and writes too) is summed;
    the others' are not."""
    results = [
        BatchResult(batch=n, outcome=outcome, usage=usage)  # type: ignore[arg-type]
        for n, (outcome, usage) in enumerate(answers)
    ]
    expected = ModelUsage()
    for outcome, usage in answers:
        if outcome == "summarized":
            expected = expected.plus(usage)
    assert answered_usage(results) == expected
