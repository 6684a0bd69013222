"""The steps both runtimes run: fold, answer, the session document, topic routing.

The embedded runtime (runtime/embedded.py, tools/replay.py, the ledger loop) and the Kafka
runtime (worker/agents.py, web/state_api.py) call these, so the two reach the same state:
- `fold_step`: one input envelope (a session event or a compaction) folded into a Store: the
  pruning folds, then the rule ledger (projections/folds.py); the envelopes it produces.
- `Answerer.answer`: one request in, its answer out: a pruning flush through the model port, a
  ledger pass through the diff model.
- `session_document`: one session as `sessionfold fold --json` prints it and the state API
  serves it.
- `topic_of`: the topic an envelope travels on, under a runtime's topic names.

Failure policy, the same in both runtimes: a request is always answered, because the session's
flush barrier stays up until its answer is folded.
- A model port that raises on a pruning flush gets an error compaction (`error:
  "port-error:<exception class>"`, no results): the fold records a failed attempt and captures
  the batches again at the next flush.
- A ledger pass that raises gets a fallback result (`fallback: "pass-error:<exception class>"`):
  it closes nothing, pi's own compaction stands.
Either answer's outcome is "error" (else "answered"). Only `Exception` is caught: an interrupt
(Ctrl-C) stops the run. The log names the session and the exception class, never its message
(it may quote model output or message text).

An answer is also bounded in size (`max_answer_bytes`, 1 MiB by default, its encoded envelope):
a compaction over it keeps the summaries of its first batches that fit, and every later
summarized batch becomes `failed` with `oversized-answer` (the fold stops at the first failed
batch anyway, and captures it again at the next flush); when not even that fits, an error
compaction. A ledger pass result over it becomes a fallback (`oversized-answer`). Both runtimes
bound alike, so a runaway model leaves the same state in each, and a Kafka record stays far
below what the topics take. `error_answer` is the small answer a runtime sends when it cannot
send the one it has (the Kafka summarizer, on a record the producer refuses).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import orjson

from sessionfold.events.envelope import (
    CompactionEnvelope,
    Envelope,
    FlushMetricsEnvelope,
    FlushRequestEnvelope,
    LedgerRequestEnvelope,
    OpaquePayload,
    PruningCompactionEnvelope,
    PruningRequestEnvelope,
    encode,
)
from sessionfold.events.flush import (
    BatchResult,
    CompactionPayload,
    FlushRequestPayload,
    read_request,
    wrap,
    wrap_sized,
)
from sessionfold.events.ledger import answer_envelope, read_ledger_request
from sessionfold.ports.ledger.model import DiffModel
from sessionfold.ports.ledger.pass_ import fallback_payload, run_pass
from sessionfold.ports.summarizer import ModelPort, OfflineSummarizer
from sessionfold.projections.folds import apply_folds
from sessionfold.projections.ledger.config import DEFAULT_LEDGER, LedgerConfig
from sessionfold.projections.ledger.fold import PassRequest
from sessionfold.projections.ledger.view import ledger_view
from sessionfold.projections.pruning import context_metrics, digest, windows
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.config import PruneConfig
from sessionfold.projections.store import Store
from sessionfold.streams.publishing.session_file import DeadLetter

if TYPE_CHECKING:
    # A type only: the embedded runtimes and the hook run without the Kafka client.
    from sessionfold.streams.kafka.topics import Topics

log = logging.getLogger(__name__)

Outcome = Literal["answered", "error"]

#: The largest answer (encoded envelope) either runtime folds or sends: 256 summaries of a
#: 4,096-token budget each, and far below the 17 MiB a topic takes.
MAX_ANSWER_BYTES = 1024 * 1024
#: The error code of a batch, compaction or pass whose answer was over `MAX_ANSWER_BYTES`.
OVERSIZED_ANSWER = "oversized-answer"


def fold_step(
    store: Store,
    envelope: Envelope,
    config: PruneConfig,
    ledger: LedgerConfig | None = DEFAULT_LEDGER,
) -> list[Envelope]:
    """Fold one session-event or compaction envelope; the envelopes it produces."""
    return apply_folds(store, envelope, config, ledger)


# --- answers ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    """A request's answer and whether the model answered or failed."""

    envelope: CompactionEnvelope
    outcome: Outcome


def answer_pruning(
    port: ModelPort, request: PruningRequestEnvelope, max_bytes: int = MAX_ANSWER_BYTES
) -> Answer:
    """The compaction answering a pruning flush request, within `max_bytes`; an error
    compaction if the port raises."""
    payload = pruning_request(request)
    try:
        if type(port) is OfflineSummarizer:
            # The offline answer built as its JSON: no models to validate and dump again.
            fast = offline_envelope(port, payload, request.seq, max_bytes)
            if fast is not None:
                return Answer(fast, "answered")
        compaction = port.summarize(payload)
    except Exception as exc:
        log.warning(
            "model port raised",
            extra={"session": payload.session_id, "error": type(exc).__name__},
        )
        return error_answer(request, f"port-error:{type(exc).__name__}")
    envelope = fitted_envelope(compaction, request.seq, max_bytes)
    if envelope is None:
        return error_answer(request, OVERSIZED_ANSWER)
    return Answer(envelope, "answered")


def offline_envelope(
    port: OfflineSummarizer, payload: FlushRequestPayload, seq: int, max_bytes: int
) -> PruningCompactionEnvelope | None:
    """`fitted_envelope(port.summarize(payload), seq, max_bytes)` when it fits as it is
    (nearly always): the envelope of the offline answer's JSON (`summarize_document`), sized
    as `wrap_sized` sizes it; None when it is over `max_bytes` (the typed path then fits it)."""
    body = port.summarize_document(payload)
    envelope = PruningCompactionEnvelope(
        session_id=payload.session_id, seq=seq, payload=OpaquePayload(**body)
    )
    document = envelope.model_dump(mode="json", exclude={"payload"})
    document["payload"] = body
    return envelope if len(orjson.dumps(document)) <= max_bytes else None


def pruning_request(request: PruningRequestEnvelope) -> FlushRequestPayload:
    """The typed payload of a flush request: what `flush.read_request` returns, validated
    from the opaque payload's fields as they are (a request's payload has no declared field)
    instead of from a copy of them: the copy cost as much as the validation."""
    return FlushRequestPayload.model_validate(request.payload.model_extra or {})


def fitted_envelope(
    compaction: CompactionPayload, seq: int, max_bytes: int
) -> PruningCompactionEnvelope | None:
    """The envelope of `compaction` fitted within `max_bytes` (`fit_compaction`); None if
    nothing fits. Wrapped once when it fits as it is (nearly always), and sized without
    encoding it (`wrap_sized`)."""
    envelope, size = wrap_sized(compaction, seq)
    if size <= max_bytes:
        return envelope  # type: ignore[return-value]
    fitted = fit_compaction(compaction, seq, max_bytes, size)
    return None if fitted is None else wrap(fitted, seq)  # type: ignore[return-value]


def fit_compaction(
    compaction: CompactionPayload, seq: int, max_bytes: int, size: int | None = None
) -> CompactionPayload | None:
    """`compaction` within `max_bytes` encoded: as it is, or with the summaries after the
    longest prefix that fits turned into `oversized-answer` failures; None if nothing fits.
    `size`: its encoded envelope's length, when the caller has it already.

    The sizes are exact: a result's share of the encoded list is its own encoding, so the
    record with the first k summaries kept is the all-failed record plus their extra bytes.
    """
    if size is None:
        size = len(encode(wrap(compaction, seq)))
    if size <= max_bytes:
        return compaction
    failed = tuple(_as_oversized(r) for r in compaction.results)
    base = len(encode(wrap(compaction.model_copy(update={"results": failed}), seq)))
    kept, total = 0, base
    for result, stand_in in zip(compaction.results, failed, strict=True):
        extra = _encoded_size(result) - _encoded_size(stand_in)
        if total + extra > max_bytes:
            break
        kept, total = kept + 1, total + extra
    log.warning(
        "answer over its size limit",
        extra={
            "session": compaction.session_id,
            "bytes": size,
            "limit": max_bytes,
            "batches_kept": kept,
            "batches": len(compaction.results),
        },
    )
    if total > max_bytes:
        return None
    results = compaction.results[:kept] + failed[kept:]
    return compaction.model_copy(update={"results": results})


def _as_oversized(result: BatchResult) -> BatchResult:
    """A summarized result as an `oversized-answer` failure (text dropped); others unchanged."""
    if result.outcome != "summarized":
        return result
    return BatchResult(
        batch=result.batch, outcome="failed", usage=result.usage, error=OVERSIZED_ANSWER
    )


def _encoded_size(result: BatchResult) -> int:
    return len(orjson.dumps(result.model_dump(mode="json")))


def error_answer(request: FlushRequestEnvelope, code: str) -> Answer:
    """The small answer that still releases the request's barrier: an error compaction for a
    pruning flush, a fallback for a ledger pass; `code` is a short reason, never text."""
    match request:
        case LedgerRequestEnvelope():
            fallback = fallback_payload(read_ledger_request(request), code)
            return Answer(answer_envelope(fallback), "error")
        case PruningRequestEnvelope():
            payload = read_request(request)
            compaction = CompactionPayload(
                request_id=payload.request_id,
                session_id=payload.session_id,
                model=payload.model,
                error=code,
            )
            return Answer(wrap(compaction, request.seq), "error")  # type: ignore[arg-type]
    msg = f"no answer for {type(request).__name__}"
    raise TypeError(msg)


def pass_payload(
    request: PassRequest,
    model: DiffModel,
    config: LedgerConfig,
    clock: Callable[[], float] | None,
) -> tuple[dict[str, Any], Exception | None]:
    """The result of one ledger pass, and the exception it threw (the result is then a fallback)."""
    try:
        return run_pass(request, model, config, clock), None
    except Exception as exc:
        log.warning(
            "ledger pass failed",
            extra={
                "session": request.get("session"),
                "span": request.get("span"),
                "error": type(exc).__name__,
            },
        )
        return fallback_payload(request, f"pass-error:{type(exc).__name__}"), exc


def answer_ledger(
    model: DiffModel,
    request: LedgerRequestEnvelope,
    config: LedgerConfig = DEFAULT_LEDGER,
    clock: Callable[[], float] | None = time.monotonic,
    max_bytes: int = MAX_ANSWER_BYTES,
) -> Answer:
    """The compaction-events record answering a ledger pass request; a fallback if it throws
    or its result is over `max_bytes` encoded."""
    payload, _error = pass_payload(read_ledger_request(request), model, config, clock)
    envelope = answer_envelope(payload)
    size = len(encode(envelope))
    if size > max_bytes:
        log.warning(
            "answer over its size limit",
            extra={"session": request.session_id, "bytes": size, "limit": max_bytes},
        )
        return error_answer(request, OVERSIZED_ANSWER)
    return Answer(envelope, "answered" if payload.get("fallback") is None else "error")


@dataclass(frozen=True, slots=True)
class Answerer:
    """Answers both kinds of request: a pruning flush with `port`, a pass with `diff_model`."""

    port: ModelPort
    diff_model: DiffModel
    ledger: LedgerConfig = DEFAULT_LEDGER
    max_answer_bytes: int = MAX_ANSWER_BYTES

    def answer(self, request: FlushRequestEnvelope) -> Answer:
        """The answer to one request, by its type, within `max_answer_bytes`."""
        match request:
            case LedgerRequestEnvelope():
                return answer_ledger(
                    self.diff_model, request, self.ledger, max_bytes=self.max_answer_bytes
                )
            case PruningRequestEnvelope():
                return answer_pruning(self.port, request, self.max_answer_bytes)
        msg = f"no answer for {type(request).__name__}"
        raise TypeError(msg)


# --- the session document -----------------------------------------------------------------------


def session_document(
    store: Store,
    session_id: str,
    config: PruneConfig,
    ledger: LedgerConfig | None = DEFAULT_LEDGER,
    dead_letters: int | None = None,
) -> dict[str, Any]:
    """One session's projections, JSON-ready: metrics, frontier, pending batches, flush
    attempts, stats, counts, the rule ledger (unless `ledger` is None) and `dead_letters`
    (when counted)."""
    session = pruning.open_session(store, session_id, config)
    roles: dict[str, int] = {}
    for row in digest.branch_rows(store, session_id):
        roles[row["role"]] = roles.get(row["role"], 0) + 1
    document: dict[str, Any] = {
        "metrics": context_metrics.snapshot(store, session_id),
        "frontier": session.head["frontier"],
        "pending_batches": len(windows.capture(session)),
        "flush_attempts": pruning.flush_records(store, session_id),
        "stats": session.head["stats"],
        "counts": {"messages": roles},
    }
    if ledger is not None:
        document["ledger"] = ledger_view(store, session_id, ledger)
    if dead_letters is not None:
        document["dead_letters"] = dead_letters
    return document


# --- routing ------------------------------------------------------------------------------------


def topic_of(envelope: Envelope | DeadLetter, topics: Topics) -> str:
    """The topic an envelope (or a dead letter) travels on, under `topics`' names."""
    match envelope:
        case FlushRequestEnvelope():
            return topics.flush_requests
        case CompactionEnvelope():
            return topics.compaction_events
        case FlushMetricsEnvelope():
            return topics.flush_metrics
        case DeadLetter():
            return topics.dead_letters
    return topics.session_events
