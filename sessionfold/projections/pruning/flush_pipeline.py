"""The pre-flush pipeline and the walk over a flush's answers (reference §5.3-5.5), pure.

`plan_flush` decides, per captured batch, what dedup takes, whether the batch is trivial or
fully deduped, and which refs its summary will cite. `walk_answers` then goes through the
batches in order with the summarizer's answers, stops at the first failure, discards summaries
longer than their raw output, and says what was processed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec
from msgspec.structs import replace

from sessionfold.events.flush import (
    AttemptOutcome,
    BatchResult,
    Disposition,
    Frontier,
    FrontierOutcome,
    ModelUsage,
)
from sessionfold.projections.pruning.capture import Batch, Call, js_length, raw_chars
from sessionfold.projections.pruning.frontier import Processed, flush_outcome, frontier_after


class PlannedBatch(msgspec.Struct, frozen=True, gc=False):
    """A captured batch after dedup: its kept calls, its aliased ones, its fate and its refs."""

    batch: Batch  # with only the kept calls
    disposition: Disposition
    deduped: tuple[tuple[Call, str], ...] = ()  # (call, key of the original it aliases)
    refs: tuple[str, ...] = ()  # one per kept call when the batch goes to the summarizer


@dataclass(frozen=True, slots=True)
class FlushPlan:
    """Every captured batch in flush order, and the ref counter after allocation."""

    batches: tuple[PlannedBatch, ...]
    next_ref: int

    @property
    def needs_model(self) -> bool:
        """Whether any batch goes to the summarizer."""
        return any(b.disposition == "summarize" for b in self.batches)


def plan_flush(
    batches: Sequence[Batch],
    canonical_of: Callable[[str], str | None],
    *,
    dedup: bool,
    min_batch_chars: int,
    next_ref: int,
) -> FlushPlan:
    """Dedup (cross-flush only), classify trivial and fully-deduped batches, allocate refs."""
    planned = []
    for batch in batches:
        kept, deduped = _split_deduped(batch.calls, canonical_of) if dedup else (batch.calls, ())
        disposition = _disposition(kept, deduped, min_batch_chars)
        refs: tuple[str, ...] = ()
        if disposition == "summarize":
            refs = tuple(f"t{next_ref + i}" for i in range(len(kept)))
            next_ref += len(kept)
        # A batch is frozen: when dedup took none of its calls, it is its own kept copy.
        kept_batch = batch if len(kept) == len(batch.calls) else replace(batch, calls=kept)
        planned.append(PlannedBatch(kept_batch, disposition, deduped, refs))
    return FlushPlan(tuple(planned), next_ref)


def _split_deduped(
    calls: Sequence[Call], canonical_of: Callable[[str], str | None]
) -> tuple[tuple[Call, ...], tuple[tuple[Call, str], ...]]:
    kept: list[Call] = []
    deduped: list[tuple[Call, str]] = []
    for call in calls:
        original = canonical_of(call.content_hash)
        if original is not None and original != call.key:
            deduped.append((call, original))
        else:
            kept.append(call)
    return tuple(kept), tuple(deduped)


def _disposition(
    kept: Sequence[Call], deduped: Sequence[tuple[Call, str]], min_batch_chars: int
) -> Disposition:
    if deduped and not kept:
        return "skipped-deduped"
    if min_batch_chars > 0 and raw_chars(kept) < min_batch_chars:
        return "skipped-trivial"
    return "summarize"


class Summary(msgspec.Struct, frozen=True, gc=False):
    """A summary that survived the oversize check: it is indexed under its refs."""

    index: int
    text: str
    refs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Walk:
    """What the walk over a flush's answers decided."""

    processed: tuple[Processed, ...]
    summaries: tuple[Summary, ...]
    unprocessed: int
    usage: ModelUsage = field(default_factory=ModelUsage)

    @property
    def frontier(self) -> Frontier | None:
        """Where the flush leaves the frontier; None when nothing was processed."""
        return frontier_after(self.processed)

    @property
    def outcome(self) -> AttemptOutcome:
        """The attempt's outcome: the frontier's, or `error` when nothing was processed."""
        return flush_outcome(self.processed) if self.processed else "error"


def walk_answers(plan: FlushPlan, answers: Mapping[int, BatchResult]) -> Walk:
    """Walk the planned batches in order with the summarizer's answers (§5.5 steps 10-12).

    Skipped batches count as processed; a summary longer than its batch's raw output (deduped
    chars excluded) is processed as `skipped-oversized` and not kept; the first batch without a
    usable summary stops the walk, and it and every later batch stay unprocessed.
    """
    processed: list[Processed] = []
    summaries: list[Summary] = []
    usage = answered_usage(answers.values())
    for index, planned in enumerate(plan.batches):
        deduped = tuple(call for call, _ in planned.deduped)
        kept = planned.batch.calls
        if planned.disposition != "summarize":
            processed.append(Processed(planned.batch, planned.disposition, kept, deduped))
            continue
        text = _usable_text(answers.get(index))
        if text is None:
            break
        oversized = js_length(text) > raw_chars(kept)
        kind: FrontierOutcome = "skipped-oversized" if oversized else "summarized"
        processed.append(Processed(planned.batch, kind, kept, deduped, js_length(text)))
        if not oversized:
            summaries.append(Summary(index, text, planned.refs))
    return Walk(tuple(processed), tuple(summaries), len(plan.batches) - len(processed), usage)


_NO_USAGE = ModelUsage()  # frozen: one shared zero usage


def answered_usage(answers: Iterable[BatchResult]) -> ModelUsage:
    """What the summarized answers cost together: every call that answered cost something,
    whether or not its summary is kept. `ModelUsage.plus` over them in order, summed as plain
    numbers (the same sums, in the same order) and validated once instead of per answer."""
    input_tokens = output_tokens = calls = cache_read = cache_write = 0
    cost = 0.0
    summed = False
    for answer in answers:
        if answer.outcome == "summarized":
            usage = answer.usage
            input_tokens += usage.input_tokens
            output_tokens += usage.output_tokens
            cost += usage.cost
            calls += usage.calls
            cache_read += usage.cache_read_tokens
            cache_write += usage.cache_write_tokens
            summed = True
    if not summed:
        return _NO_USAGE
    return ModelUsage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost=cost,
        calls=calls,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
    )


def _usable_text(answer: BatchResult | None) -> str | None:
    """The answer's text when it is a usable summary (§6.3: non-blank), else None."""
    if answer is None or answer.outcome != "summarized" or answer.text is None:
        return None
    return answer.text if answer.text.strip() else None
