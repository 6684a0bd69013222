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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from sessionfold.events.envelope import (
    CompactionEnvelope,
    Envelope,
    FlushMetricsEnvelope,
    FlushRequestEnvelope,
    LedgerRequestEnvelope,
    PruningRequestEnvelope,
)
from sessionfold.events.flush import CompactionPayload, read_request, wrap
from sessionfold.events.ledger import answer_envelope, read_ledger_request
from sessionfold.ports.ledger.model import DiffModel
from sessionfold.ports.ledger.pass_ import fallback_payload, run_pass
from sessionfold.ports.summarizer import ModelPort
from sessionfold.projections.folds import apply_folds
from sessionfold.projections.ledger.config import DEFAULT_LEDGER, LedgerConfig
from sessionfold.projections.ledger.fold import PassRequest
from sessionfold.projections.ledger.view import ledger_view
from sessionfold.projections.pruning import context_metrics, digest, windows
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.config import PruneConfig
from sessionfold.projections.store import Store
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.session_file import DeadLetter

log = logging.getLogger(__name__)

Outcome = Literal["answered", "error"]


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


def answer_pruning(port: ModelPort, request: PruningRequestEnvelope) -> Answer:
    """The compaction answering a pruning flush request; an error compaction if the port raises."""
    payload = read_request(request)
    try:
        compaction = port.summarize(payload)
        outcome: Outcome = "answered"
    except Exception as exc:
        log.warning(
            "model port raised",
            extra={"session": payload.session_id, "error": type(exc).__name__},
        )
        compaction = CompactionPayload(
            request_id=payload.request_id,
            session_id=payload.session_id,
            model=payload.model,
            error=f"port-error:{type(exc).__name__}",
        )
        outcome = "error"
    return Answer(wrap(compaction, request.seq), outcome)  # type: ignore[arg-type]


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
) -> Answer:
    """The compaction-events record answering a ledger pass request; a fallback if it throws."""
    payload, _error = pass_payload(read_ledger_request(request), model, config, clock)
    return Answer(
        answer_envelope(payload), "answered" if payload.get("fallback") is None else "error"
    )


@dataclass(frozen=True, slots=True)
class Answerer:
    """Answers both kinds of request: a pruning flush with `port`, a pass with `diff_model`."""

    port: ModelPort
    diff_model: DiffModel
    ledger: LedgerConfig = DEFAULT_LEDGER

    def answer(self, request: FlushRequestEnvelope) -> Answer:
        """The answer to one request, by its type."""
        match request:
            case LedgerRequestEnvelope():
                return answer_ledger(self.diff_model, request, self.ledger)
            case PruningRequestEnvelope():
                return answer_pruning(self.port, request)
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
