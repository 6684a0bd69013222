"""The prune frontier (reference §3.5): trimming captured batches, and where a flush leaves it.

Pure functions over `capture.Batch` and the `Frontier` payload model. A batch before the
frontier's turn is dropped whole; in the frontier's own turn only calls after the frontier's call
survive, unless that call is no longer among them (the miss rule keeps them all).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import msgspec
from msgspec.structs import replace

from sessionfold.events.flush import Frontier, FrontierOutcome
from sessionfold.projections.pruning.capture import Batch, Call


class FrontierMark(NamedTuple):
    """The two fields of a frontier that trimming reads, named as `Frontier`'s."""

    last_attempted_turn_index: int
    last_attempted_tool_call_id: str


def mark_of(stored: Mapping[str, Any] | None) -> FrontierMark | None:
    """The mark of a frontier as the session's head stores it (`Frontier.model_dump()`), read
    off the dict: validating the whole `Frontier` at every turn end and capture cost more
    than the trimming it serves."""
    if stored is None:
        return None
    return FrontierMark(
        stored.get("last_attempted_turn_index", 0), stored["last_attempted_tool_call_id"]
    )


def trim_batch(
    batch: Batch,
    frontier: Frontier | FrontierMark | None,
    is_summarized: Callable[[str], bool],
) -> Batch | None:
    """The part of `batch` a flush still has to attempt, or None (reference §3.5 steps 1-5)."""
    calls = tuple(call for call in batch.calls if not is_summarized(call.key))
    if not calls:
        return None
    if frontier is None or batch.turn_index > frontier.last_attempted_turn_index:
        # A batch is frozen: when no call went, the batch itself is the copy `replace` made.
        return batch if len(calls) == len(batch.calls) else replace(batch, calls=calls)
    if batch.turn_index < frontier.last_attempted_turn_index:
        return None
    ids = [call.tool_call_id for call in calls]
    if frontier.last_attempted_tool_call_id not in ids:
        return replace(batch, calls=calls)  # miss: the frontier call is gone, keep everything
    rest = calls[ids.index(frontier.last_attempted_tool_call_id) + 1 :]
    return replace(batch, calls=rest) if rest else None


def trim_batches(
    batches: Sequence[Batch],
    frontier: Frontier | FrontierMark | None,
    is_summarized: Callable[[str], bool],
) -> list[Batch]:
    """Every batch trimmed, the dropped ones left out, order kept."""
    kept = (trim_batch(batch, frontier, is_summarized) for batch in batches)
    return [batch for batch in kept if batch is not None]


class Processed(msgspec.Struct, frozen=True, gc=False):
    """One batch a flush processed: what it kept, what dedup took, and how it ended."""

    batch: Batch
    kind: FrontierOutcome
    kept: tuple[Call, ...]
    deduped: tuple[Call, ...] = ()
    summary_chars: int = 0

    @property
    def raw_chars(self) -> int:
        """Result chars of the kept and the deduped calls together."""
        return sum(c.raw_chars for c in self.kept) + sum(c.raw_chars for c in self.deduped)


_PRECEDENCE: tuple[FrontierOutcome, ...] = (
    "summarized",
    "skipped-oversized",
    "skipped-deduped",
    "skipped-trivial",
)


def flush_outcome(processed: Sequence[Processed]) -> FrontierOutcome:
    """Any real summary wins, then oversized, then fully deduped, else trivial (§5.5 step 12)."""
    kinds = {p.kind for p in processed}
    return next((kind for kind in _PRECEDENCE if kind in kinds), "skipped-trivial")


def frontier_row(processed: Sequence[Processed]) -> dict[str, Any] | None:
    """`frontier_after(processed).model_dump()`, built without the model: a flush stores its
    frontier in the head as this dict, and validating fields it made itself was pure cost."""
    if not processed:
        return None
    last = processed[-1]
    tail = last.kept or last.deduped or last.batch.calls
    call = tail[-1]
    turn, timestamp = last.batch.turn_index, last.batch.timestamp
    if not (
        type(call.tool_call_id) is str
        and type(call.tool_name) is str
        and type(turn) is int
        and type(timestamp) is int
    ):
        # Not what capture builds (a damaged row): the model validates, or refuses, as ever.
        frontier = frontier_after(processed)
        return None if frontier is None else frontier.model_dump()
    return {
        "last_attempted_tool_call_id": call.tool_call_id,
        "last_attempted_tool_name": call.tool_name,
        "last_attempted_turn_index": turn,
        "last_attempted_timestamp": timestamp,
        "attempted_batch_count": len(processed),
        "attempted_tool_call_count": sum(len(p.kept) + len(p.deduped) for p in processed),
        "raw_char_count": sum(p.raw_chars for p in processed),
        "summary_char_count": sum(p.summary_chars for p in processed),
        "outcome": flush_outcome(processed),
    }


def frontier_after(processed: Sequence[Processed]) -> Frontier | None:
    """The frontier a flush leaves: the last call of its last processed batch; None if none."""
    if not processed:
        return None
    last = processed[-1]
    tail = last.kept or last.deduped or last.batch.calls
    call = tail[-1]
    return Frontier(
        last_attempted_tool_call_id=call.tool_call_id,
        last_attempted_tool_name=call.tool_name,
        last_attempted_turn_index=last.batch.turn_index,
        last_attempted_timestamp=last.batch.timestamp,
        attempted_batch_count=len(processed),
        attempted_tool_call_count=sum(len(p.kept) + len(p.deduped) for p in processed),
        raw_char_count=sum(p.raw_chars for p in processed),
        summary_char_count=sum(p.summary_chars for p in processed),
        outcome=flush_outcome(processed),
    )
