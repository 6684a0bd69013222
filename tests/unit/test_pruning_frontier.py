"""The prune frontier: trim with the miss rule, advance and outcome precedence (reference §3.5)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sessionfold.events.flush import Frontier
from sessionfold.projections.pruning.capture import Batch, Call
from sessionfold.projections.pruning.frontier import (
    Processed,
    flush_outcome,
    frontier_after,
    mark_of,
    trim_batch,
    trim_batches,
)


def _call(call_id: str, ts: int = 1, raw: int = 10) -> Call:
    return Call(
        key=f"{call_id}@{ts}",
        tool_call_id=call_id,
        tool_name="read",
        raw_chars=raw,
        content_hash=call_id,
        head="",
        seq=ts,
    )


def _frontier(turn: int, call_id: str) -> Frontier:
    return Frontier(last_attempted_tool_call_id=call_id, last_attempted_turn_index=turn)


def _ids(batch: Batch | None) -> list[str] | None:
    return None if batch is None else [c.tool_call_id for c in batch.calls]


def _never(_: str) -> bool:
    return False


def test_without_frontier_everything_unsummarized_is_kept() -> None:
    """No frontier keeps the batch minus its summarized calls."""
    batch = Batch(3, 0, (_call("a"), _call("b")))
    assert _ids(trim_batch(batch, None, lambda key: key == "a@1")) == ["b"]
    assert trim_batch(batch, None, lambda key: True) is None


def test_batches_before_the_frontier_turn_are_dropped_whole() -> None:
    """A batch of an earlier turn is dropped even when unsummarized; a later one is kept."""
    frontier = _frontier(5, "x")
    assert trim_batch(Batch(4, 0, (_call("a"),)), frontier, _never) is None
    assert _ids(trim_batch(Batch(6, 0, (_call("a"),)), frontier, _never)) == ["a"]


def test_same_turn_keeps_only_calls_after_the_frontier_call() -> None:
    """In the frontier's turn, a hit keeps only later calls; nothing later drops the batch."""
    batch = Batch(5, 0, (_call("a"), _call("b"), _call("c")))
    assert _ids(trim_batch(batch, _frontier(5, "b"), _never)) == ["c"]
    assert trim_batch(batch, _frontier(5, "c"), _never) is None


def test_same_turn_miss_keeps_everything() -> None:
    """When the frontier call is gone (summarized or another branch), every call stays."""
    batch = Batch(5, 0, (_call("a"), _call("b")))
    assert _ids(trim_batch(batch, _frontier(5, "zz"), _never)) == ["a", "b"]
    summarized_b = trim_batch(batch, _frontier(5, "b"), lambda key: key == "b@1")
    assert _ids(summarized_b) == ["a"]


def test_frontier_advances_to_the_last_call_of_the_last_processed_batch() -> None:
    """The frontier names the last processed batch's last call and totals every processed one."""
    first = Processed(Batch(1, 100, (_call("a"),)), "skipped-trivial", (_call("a", raw=5),))
    last_batch = Batch(2, 200, (_call("b"), _call("c")))
    last = Processed(
        last_batch, "summarized", (_call("b", raw=7), _call("c", raw=8)), (), summary_chars=4
    )
    frontier = frontier_after([first, last])
    assert frontier is not None
    assert frontier.last_attempted_tool_call_id == "c"
    assert frontier.last_attempted_turn_index == 2
    assert frontier.last_attempted_timestamp == 200
    assert frontier.attempted_batch_count == 2
    assert frontier.attempted_tool_call_count == 3
    assert frontier.raw_char_count == 20
    assert frontier.summary_char_count == 4
    assert frontier.outcome == "summarized"


def test_fully_deduped_batch_frontier_uses_its_deduped_calls() -> None:
    """A batch that kept no call puts the frontier on its last deduped call."""
    processed = Processed(Batch(1, 0, ()), "skipped-deduped", (), (_call("d"), _call("e")))
    frontier = frontier_after([processed])
    assert frontier is not None and frontier.last_attempted_tool_call_id == "e"
    assert frontier_after([]) is None


def test_outcome_precedence() -> None:
    """summarized > skipped-oversized > skipped-deduped > skipped-trivial."""
    batch = Batch(0, 0, (_call("a"),))

    def of(*kinds: str) -> str:
        return flush_outcome([Processed(batch, kind, ()) for kind in kinds])  # type: ignore[arg-type]

    assert of("skipped-trivial", "summarized") == "summarized"
    assert of("skipped-trivial", "skipped-oversized", "skipped-deduped") == "skipped-oversized"
    assert of("skipped-trivial", "skipped-deduped") == "skipped-deduped"
    assert of("skipped-trivial") == "skipped-trivial"


_CALL_IDS = st.sampled_from(["a", "b", "c", "d"])
_BATCH = st.builds(
    lambda turn, ids: Batch(turn, 0, tuple(_call(i, ts=n) for n, i in enumerate(ids))),
    st.integers(0, 4),
    st.lists(_CALL_IDS, min_size=1, max_size=4),
)
_FRONTIER = st.builds(
    Frontier,
    last_attempted_tool_call_id=_CALL_IDS,
    last_attempted_turn_index=st.integers(0, 4),
    attempted_batch_count=st.integers(0, 3),
    outcome=st.sampled_from(["summarized", "skipped-trivial"]),
)


@given(st.lists(_BATCH, max_size=5), st.none() | _FRONTIER, st.sets(_CALL_IDS))
def test_the_stored_frontiers_mark_trims_as_the_frontier_does(
    batches: list[Batch], frontier: Frontier | None, summarized: set[str]
) -> None:
    """Property: trimming by the mark read off the head's stored frontier (no validation)
    keeps exactly what trimming by the validated `Frontier` keeps."""
    stored = None if frontier is None else frontier.model_dump()

    def is_summarized(key: str) -> bool:
        return key.split("@")[0] in summarized

    assert trim_batches(batches, mark_of(stored), is_summarized) == trim_batches(
        batches, frontier, is_summarized
    )
