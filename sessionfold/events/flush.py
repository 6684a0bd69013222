"""Payloads of the pruning kinds: flush-request, compaction and flush-metrics.

The fold writes a flush request when a flush needs the model, the summarizer answers it with one
compaction, and every flush attempt ends in exactly one flush-metrics record. On the wire these
travel as the envelope's opaque payload, in their own envelope classes (a pruning request and a
pruning compaction, told apart from the ledger's at decode time); `wrap` and the `read_*`
functions convert between the two. Field names are snake_case like the envelope's.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import Field

from sessionfold.events.envelope import (
    PRUNING_PRODUCER,
    FlushMetricsEnvelope,
    Payload,
    PruningCompactionEnvelope,
    PruningRequestEnvelope,
    opaque_envelope,
)

Trigger = Literal["budget", "delta", "message-end", "manual", "rearmed"]
FrontierOutcome = Literal["summarized", "skipped-oversized", "skipped-deduped", "skipped-trivial"]
AttemptOutcome = Literal[
    "summarized", "skipped-oversized", "skipped-deduped", "skipped-trivial", "empty", "error"
]
Disposition = Literal["summarize", "skipped-trivial", "skipped-deduped"]
ResultOutcome = Literal["summarized", "skipped-trivial", "skipped-deduped", "failed"]


class MetricsSnapshot(Payload):
    """The three context metrics (reference §9.2) at one point of the fold."""

    open_cycle_thinking_tokens: int = 0
    largest_chain_share_pct: int = 0
    frontier_gap_tokens: int = 0


class Frontier(Payload):
    """The prune frontier (reference §3.5): the last tool call a flush attempted."""

    last_attempted_tool_call_id: str
    last_attempted_tool_name: str = "unknown"
    last_attempted_turn_index: int = 0
    last_attempted_timestamp: int = 0
    attempted_batch_count: int = 0
    attempted_tool_call_count: int = 0
    raw_char_count: int = 0
    summary_char_count: int = 0
    outcome: FrontierOutcome = "summarized"


class FlushCall(Payload):
    """One captured tool call as the summarizer sees it; `head` is the first 2,000 chars."""

    key: str
    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    is_error: bool = False
    raw_chars: int
    content_hash: str
    head: str
    truncated_chars: int = 0
    seq: int
    ref: str | None = None


class DedupedCall(Payload):
    """A call whose output an earlier flush already indexed: aliased, never summarized."""

    key: str
    tool_call_id: str
    tool_name: str
    original_key: str
    raw_chars: int
    seq: int


class FlushBatch(Payload):
    """One batch in flush order, and what the pre-flush pipeline decided for it."""

    turn_index: int
    timestamp: int
    assistant_text: str = ""
    disposition: Disposition
    calls: tuple[FlushCall, ...] = ()
    deduped: tuple[DedupedCall, ...] = ()


class FlushRequestPayload(Payload):
    """A flush that needs the model: the batches in order, with the refs each summary cites."""

    request_id: str
    session_id: str
    seq: int
    trigger: Trigger
    model: str
    thinking: str = "default"
    batches: tuple[FlushBatch, ...]
    frontier_before: Frontier | None = None
    metrics: MetricsSnapshot = MetricsSnapshot()
    time: str | None = None


class ModelUsage(Payload):
    """What model calls cost: tokens, money and how many calls."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    calls: int = 0
    #: Of `input_tokens`, those read from and written to the provider's prompt cache (an
    #: Anthropic model reports them; other servers leave them 0).
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def plus(self, other: ModelUsage) -> ModelUsage:
        """The sum of two usages."""
        return ModelUsage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost=self.cost + other.cost,
            calls=self.calls + other.calls,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )


class BatchResult(Payload):
    """The answer for one request batch: a final summary text with its refs, a skip, or a failure.

    `error` is a short code (never model output or message text).
    """

    batch: int
    outcome: ResultOutcome
    text: str | None = None
    refs: tuple[str, ...] = ()
    usage: ModelUsage = ModelUsage()
    error: str | None = None


class CompactionPayload(Payload):
    """The summarizer's answer to one flush request."""

    producer: Literal["sessionfold-pruning"] = PRUNING_PRODUCER
    request_id: str
    session_id: str
    model: str
    results: tuple[BatchResult, ...] = ()
    usage: ModelUsage = ModelUsage()
    error: str | None = None


class FlushMetricsPayload(Payload):
    """One record per flush attempt, whatever its outcome (reference §9.4)."""

    request_id: str
    session_id: str
    seq: int
    trigger: Trigger
    captured_batches: int
    processed_batches: int
    outcome: AttemptOutcome
    metrics: MetricsSnapshot
    time: str | None = None


def wrap(
    payload: FlushRequestPayload | CompactionPayload | FlushMetricsPayload, seq: int
) -> PruningRequestEnvelope | PruningCompactionEnvelope | FlushMetricsEnvelope:
    """The envelope that carries `payload` on its topic, with sequence number `seq`."""
    return _wrapped(payload, payload.model_dump(mode="json"), seq)


def wrap_sized(
    payload: FlushRequestPayload | CompactionPayload | FlushMetricsPayload, seq: int
) -> tuple[PruningRequestEnvelope | PruningCompactionEnvelope | FlushMetricsEnvelope, int]:
    """`wrap(payload, seq)` and the length of its encoding (`envelope.encode`), found without
    encoding the envelope: pydantic's dump of the opaque payload costs more than the rest of
    the answer step, while the payload's own dump is at hand as plain JSON values."""
    body = payload.model_dump(mode="json")
    envelope = _wrapped(payload, body, seq)
    # The envelope's encoding is orjson over its dump, whose payload field (the last) dumps
    # as `body`: the same mapping built from the header's dump alone gives the same bytes.
    document = envelope.model_dump(mode="json", exclude={"payload"})
    document["payload"] = body
    return envelope, len(orjson.dumps(document))


def _wrapped(
    payload: FlushRequestPayload | CompactionPayload | FlushMetricsPayload,
    body: dict[str, Any],
    seq: int,
) -> PruningRequestEnvelope | PruningCompactionEnvelope | FlushMetricsEnvelope:
    # `body` is the payload's own dump: built without validating it again (opaque_envelope).
    session_id = payload.session_id
    if isinstance(payload, FlushRequestPayload):
        return opaque_envelope(PruningRequestEnvelope, session_id, seq, body, payload.time)
    if isinstance(payload, CompactionPayload):
        return opaque_envelope(PruningCompactionEnvelope, session_id, seq, body)
    return opaque_envelope(FlushMetricsEnvelope, session_id, seq, body, payload.time)


def read_request(envelope: PruningRequestEnvelope) -> FlushRequestPayload:
    """The typed payload of a flush-request envelope."""
    return FlushRequestPayload.model_validate(envelope.payload.model_dump())


def read_compaction(envelope: PruningCompactionEnvelope) -> CompactionPayload:
    """The typed payload of a pruning compaction envelope, validated from the opaque
    payload's fields as they are: a dump of them first is a copy the fold does not need."""
    return CompactionPayload.model_validate(envelope.payload.model_extra or {})


def read_flush_metrics(envelope: FlushMetricsEnvelope) -> FlushMetricsPayload:
    """The typed payload of a flush-metrics envelope."""
    return FlushMetricsPayload.model_validate(envelope.payload.model_dump())
