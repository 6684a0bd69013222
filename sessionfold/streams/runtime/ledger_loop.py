"""The embedded ledger loop: fold envelopes, answer each pass request at once, fold the answer.

This is the flush barrier's synchronous form (the original runs its pass at the compaction
point): a pass request is answered before the next envelope is folded, so the embedded and
Kafka runtimes reach the same state. A pass is run by the runtimes' own step (step.py's
`pass_payload`, its failure policy included). No file I/O here: callers hand in envelopes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sessionfold.events.envelope import LEDGER_PRODUCER, EntryEnvelope, Envelope
from sessionfold.events.ledger import SPAN_RECORD_TYPE, STATE_FORMAT
from sessionfold.ports.ledger.model import DiffModel
from sessionfold.projections.ledger.config import LedgerConfig
from sessionfold.projections.ledger.fold import LedgerFold, PassRequest
from sessionfold.projections.ledger.state import load_head
from sessionfold.projections.store import DictStore, Store
from sessionfold.streams.runtime.step import pass_payload


class PassObserver(Protocol):
    """Told about each pass the embedded loop runs (the log, progress): ids and payloads only.

    The projection does no I/O itself; an observer in streams/ may, and what it does never
    changes a pass (its exceptions are swallowed and counted).
    """

    def started(self, request: PassRequest) -> None:
        """A pass is about to run."""
        ...

    def finished(self, request: PassRequest, payload: dict[str, Any]) -> None:
        """A pass produced a payload (a fallback payload included)."""
        ...

    def failed(self, request: PassRequest, error: BaseException) -> None:
        """A pass threw; a fallback payload follows."""
        ...


@dataclass(slots=True)
class LedgerRun:
    """What folding one session produced: the store, the payloads of its passes, counts."""

    store: Store
    session_id: str | None = None
    payloads: list[dict[str, Any]] = field(default_factory=list)
    envelopes: int = 0
    skipped: int = 0  # records that were not envelopes (dead letters)
    last_seq: int = 0


class EmbeddedLedger:
    """Feeds envelopes through the fold and answers its pass requests with a model."""

    def __init__(
        self,
        model: DiffModel,
        store: Store | None = None,
        config: LedgerConfig | None = None,
        observer: PassObserver | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.model = model
        self.clock = clock  # turns mode's time budget; handed in, never read here
        self.config = config or LedgerConfig()
        self.fold = LedgerFold(store if store is not None else DictStore(), self.config)
        self.payloads: list[dict[str, Any]] = []
        self.observer = observer
        self.observer_errors = 0

    def feed(self, envelope: Envelope) -> None:
        """Fold one envelope and every pass it raises."""
        self._answer(self.fold.apply(envelope))

    def finish(self, session_id: str, seq: int, trigger: str = "end") -> None:
        """Run a last pass over what the open span holds, as of `seq`."""
        self._answer(self.fold.request_pass(session_id, seq, trigger))

    def _tell(self, method: str, *args: Any) -> None:
        if self.observer is None:
            return
        try:
            getattr(self.observer, method)(*args)
        except Exception:  # an observer (the log) never affects a pass
            self.observer_errors += 1

    def _answer(self, requests: list[PassRequest]) -> None:
        pending = list(requests)
        while pending:
            request = pending.pop(0)
            self._tell("started", request)
            payload, error = pass_payload(request, self.model, self.config, self.clock)
            if error is not None:  # a failed pass answers nothing: pi's compaction stands
                self._tell("failed", request, error)
            self._tell("finished", request, payload)
            self.payloads.append(payload)
            pending += self.fold.apply_pass(payload)


def fold_records(
    records: Iterable[Any],
    model: DiffModel,
    *,
    config: LedgerConfig | None = None,
    store: Store | None = None,
    final_pass: bool = True,
    compact: bool = False,
    observer: PassObserver | None = None,
    clock: Callable[[], float] | None = None,
) -> LedgerRun:
    """Fold one session's records (envelopes; anything else is skipped) with passes.

    With `final_pass`, a session with no compaction of ours gets one more pass at its end,
    so the state covers the whole session. With `compact`, the end is a compact request
    whatever compacted before (`sessionfold ledger compact`): a pass over whatever the open
    span holds.
    """
    ledger = EmbeddedLedger(model, store, config, observer, clock)
    run = LedgerRun(ledger.fold.store)
    for record in records:
        if not isinstance(record, EntryEnvelope) and not hasattr(record, "kind"):
            run.skipped += 1
            continue
        run.envelopes += 1
        run.session_id = run.session_id or record.session_id
        run.last_seq = max(run.last_seq, record.seq)
        ledger.feed(record)
    if (final_pass or compact) and run.session_id is not None:
        head = load_head(ledger.fold.store, run.session_id)
        if compact:
            ledger.finish(run.session_id, run.last_seq + 1, "compact-request")
        elif head is not None and head.get("ours") is None:
            ledger.finish(run.session_id, run.last_seq + 1)
    run.payloads = ledger.payloads
    return run


def compaction_entries(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The two pi entry bodies a pass result becomes: the compaction, then the span record.

    pi (or whoever appends them) adds `id`, `parentId`, `timestamp`, and the compaction's
    `firstKeptEntryId` and `tokensBefore`, which only it knows.
    """
    details = {"producer": LEDGER_PRODUCER, "stateFormat": STATE_FORMAT}
    details["request"] = payload["request"]
    return [
        {"type": "compaction", "summary": payload["summary"], "details": details},
        {
            "type": "custom",
            "customType": SPAN_RECORD_TYPE,
            "data": {"v": 1, "stateFormat": STATE_FORMAT, "payload": payload},
        },
    ]
