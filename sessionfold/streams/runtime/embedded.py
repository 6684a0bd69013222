"""The embedded runtime: the folds and the summarizer over an in-process log, no broker.

The same steps a Kafka runtime runs: `fold_step` turns one input envelope into outputs (the
pruning folds and the rule ledger over the store: projections/folds.py), `answer` turns a flush
request into a compaction through the model port and `answer_ledger` a ledger pass request into
its result through the diff model. `EmbeddedRuntime` keeps one list of envelopes per topic and
routes outputs in a loop: requests to their model, compactions back into the fold,
flush-metrics records to their topic. `fold_files` folds pi session files and reports every
session's state.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sessionfold.events.envelope import (
    CompactionEnvelope,
    FlushMetricsEnvelope,
    FlushRequestEnvelope,
)
from sessionfold.events.flush import read_request, wrap
from sessionfold.events.ledger import answer_envelope, is_ledger_request, read_ledger_request
from sessionfold.ports.ledger.model import DiffModel, OfflineModel
from sessionfold.ports.ledger.pass_ import fallback_payload, run_pass
from sessionfold.ports.summarizer import ModelPort, OfflineSummarizer
from sessionfold.projections.folds import apply_folds
from sessionfold.projections.ledger.config import DEFAULT_LEDGER, LedgerConfig
from sessionfold.projections.ledger.view import ledger_view
from sessionfold.projections.pruning import context_metrics as metrics
from sessionfold.projections.pruning import digest, windows
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.config import DEFAULT_CONFIG, PruneConfig
from sessionfold.projections.store import DictStore, Store
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file

log = logging.getLogger(__name__)

#: The embedded log's topics: the Kafka topic names without a prefix.
NAMES = Topics("")
SESSION_EVENTS = NAMES.session_events
FLUSH_REQUESTS = NAMES.flush_requests
COMPACTION_EVENTS = NAMES.compaction_events
FLUSH_METRICS = NAMES.flush_metrics
DEAD_LETTERS = NAMES.dead_letters
TOPICS = tuple(NAMES.all())


def fold_step(
    store: Store, envelope: Any, config: PruneConfig, ledger: LedgerConfig | None = DEFAULT_LEDGER
) -> list[Any]:
    """Fold one session-event or compaction envelope; the envelopes it produces."""
    return apply_folds(store, envelope, config, ledger)


def answer(summarizer: ModelPort, request: FlushRequestEnvelope) -> CompactionEnvelope:
    """The compaction envelope answering one (pruning) flush request."""
    compaction = summarizer.summarize(read_request(request))
    return wrap(compaction, request.seq)  # type: ignore[return-value]


def answer_ledger(
    model: DiffModel, request: FlushRequestEnvelope, config: LedgerConfig = DEFAULT_LEDGER
) -> CompactionEnvelope:
    """The compaction envelope answering one ledger pass request.

    A pass that throws answers with a fallback: it closes nothing and releases the barrier
    (pi's own compaction stands), so a model outage never wedges the session.
    """
    pass_request = read_ledger_request(request)
    try:
        payload = run_pass(pass_request, model, config, time.monotonic)
    except Exception as exc:
        log.warning(
            "ledger pass failed",
            extra={"session": request.session_id, "error": type(exc).__name__},
        )
        payload = fallback_payload(pass_request, f"pass-error:{type(exc).__name__}")
    return answer_envelope(payload)


def topic_of(envelope: Any) -> str:
    """The topic an envelope travels on."""
    if isinstance(envelope, FlushRequestEnvelope):
        return FLUSH_REQUESTS
    if isinstance(envelope, CompactionEnvelope):
        return COMPACTION_EVENTS
    if isinstance(envelope, FlushMetricsEnvelope):
        return FLUSH_METRICS
    if isinstance(envelope, DeadLetter):
        return DEAD_LETTERS
    return SESSION_EVENTS


class EmbeddedRuntime:
    """An in-process log per topic, a DictStore, the fold and a summarizer, in one loop."""

    def __init__(
        self,
        config: PruneConfig = DEFAULT_CONFIG,
        summarizer: ModelPort | None = None,
        store: DictStore | None = None,
        ledger: LedgerConfig | None = DEFAULT_LEDGER,
        diff_model: DiffModel | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger  # None: the rule ledger is not folded
        self.summarizer: ModelPort = summarizer or OfflineSummarizer()
        self.diff_model: DiffModel = diff_model or OfflineModel()
        self.store = store if store is not None else DictStore()
        self.log: dict[str, list[Any]] = {topic: [] for topic in TOPICS}
        #: Every envelope folded, in fold order (session events and compactions interleaved).
        self.folded: list[Any] = []

    def fold(self, envelope: Any) -> list[Any]:
        """Fold one envelope into the store, remembering the fold order."""
        self.folded.append(envelope)
        return fold_step(self.store, envelope, self.config, self.ledger)

    def publish(self, record: Any) -> None:
        """Append one input record to its topic and fold everything that follows from it."""
        self.log[topic_of(record)].append(record)
        if not isinstance(record, DeadLetter):
            self.route(self.fold(record))

    def route(self, outputs: Iterable[Any]) -> None:
        """Deliver outputs until none is left: requests are answered and their answers folded."""
        queue = deque(outputs)
        while queue:
            envelope = queue.popleft()
            self.log[topic_of(envelope)].append(envelope)
            if isinstance(envelope, FlushRequestEnvelope):
                if is_ledger_request(envelope):
                    compaction = answer_ledger(
                        self.diff_model, envelope, self.ledger or DEFAULT_LEDGER
                    )
                else:
                    compaction = answer(self.summarizer, envelope)
                self.log[COMPACTION_EVENTS].append(compaction)
                queue.extend(self.fold(compaction))

    def sessions(self) -> list[str]:
        """Ids of the sessions the log has events of, in first-seen order."""
        seen = dict.fromkeys(e.session_id for e in self.log[SESSION_EVENTS])
        return list(seen)

    def session_state(self, session_id: str) -> dict[str, Any]:
        """The projections of one session, JSON-ready."""
        return session_state(self.store, session_id, self.config, self.ledger)


def session_state(
    store: Store,
    session_id: str,
    config: PruneConfig,
    ledger: LedgerConfig | None = DEFAULT_LEDGER,
) -> dict[str, Any]:
    """Metrics, frontier, pending batches, flush attempts, stats, counts and (when folded) the
    rule ledger of one session."""
    session = pruning.open_session(store, session_id, config)
    roles: dict[str, int] = {}
    for row in digest.branch_rows(store, session_id):
        roles[row["role"]] = roles.get(row["role"], 0) + 1
    state: dict[str, Any] = {
        "metrics": metrics.snapshot(store, session_id),
        "frontier": session.head["frontier"],
        "pending_batches": len(windows.capture(session)),
        "flush_attempts": pruning.flush_records(store, session_id),
        "stats": session.head["stats"],
        "counts": {"messages": roles},
    }
    if ledger is not None:
        state["ledger"] = ledger_view(store, session_id, ledger)
    return state


def fold_files(
    paths: Iterable[Path | str],
    config: PruneConfig = DEFAULT_CONFIG,
    progress: Callable[[Path, int], None] | None = None,
    ledger: LedgerConfig | None = DEFAULT_LEDGER,
) -> dict[str, Any]:
    """Fold pi session files in the embedded runtime: {"sessions": {id: state}}.

    Each state has `metrics`, `frontier`, `pending_batches`, `flush_attempts` (the flush-metrics
    records), `stats`, `counts`, `ledger` (unless `ledger` is None: the rule ledger as folded,
    passes run at pi's compactions) and `dead_letters`; `progress(path, records)` is called per
    file.
    """
    runtime = EmbeddedRuntime(config, ledger=ledger)
    dead: dict[str | None, int] = {}
    for path in paths:
        records = 0
        for record in read_session_file(path):
            records += 1
            if isinstance(record, DeadLetter):
                dead[record.session_id] = dead.get(record.session_id, 0) + 1
            runtime.publish(record)
        if progress is not None:
            progress(Path(path), records)
    sessions = {}
    for session_id in runtime.sessions():
        state = runtime.session_state(session_id)
        state["dead_letters"] = dead.get(session_id, 0)
        sessions[session_id] = state
    result: dict[str, Any] = {"sessions": sessions}
    if dead.get(None):
        result["dead_letters"] = dead[None]  # lines before any session header
    return result
