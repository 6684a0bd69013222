"""The embedded runtime: the folds and the summarizer over an in-process log, no broker.

The steps are the Kafka runtime's (runtime/step.py): the fold step turns one input envelope into
outputs, the answerer turns a request into its answer (a pruning flush through the model port, a
ledger pass through the diff model). `EmbeddedRuntime` keeps one list of envelopes per topic and
routes outputs in a loop: requests to their model, compactions back into the fold,
flush-metrics records to their topic. `fold_files` folds pi session files and reports every
session's state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sessionfold.events.envelope import Envelope, FlushRequestEnvelope
from sessionfold.ports.ledger.model import DiffModel, OfflineModel
from sessionfold.ports.summarizer import ModelPort, OfflineSummarizer
from sessionfold.projections.ledger.config import DEFAULT_LEDGER, LedgerConfig
from sessionfold.projections.pruning.config import DEFAULT_CONFIG, PruneConfig
from sessionfold.projections.store import DictStore
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.runtime.answer_journal import journals_beside, with_journals
from sessionfold.streams.runtime.step import Answerer, fold_step, session_document, topic_of

#: The embedded log's topic names: the Kafka ones without a prefix.
EMBEDDED_TOPICS = Topics(prefix="")
SESSION_EVENTS = EMBEDDED_TOPICS.session_events
FLUSH_REQUESTS = EMBEDDED_TOPICS.flush_requests
COMPACTION_EVENTS = EMBEDDED_TOPICS.compaction_events
FLUSH_METRICS = EMBEDDED_TOPICS.flush_metrics
DEAD_LETTERS = EMBEDDED_TOPICS.dead_letters
TOPICS = tuple(EMBEDDED_TOPICS.all())

#: The embedded topic of each envelope class seen: `topic_of` decides by class alone, and its
#: pattern match tries every case for each session event.
_TOPIC_OF_CLASS: dict[type, str] = {}


def _topic(record: Envelope | DeadLetter) -> str:
    """`topic_of(record, EMBEDDED_TOPICS)`, looked up by the record's class."""
    topic = _TOPIC_OF_CLASS.get(type(record))
    if topic is None:
        topic = _TOPIC_OF_CLASS[type(record)] = topic_of(record, EMBEDDED_TOPICS)
    return topic


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
        self.answerer = Answerer(self.summarizer, self.diff_model, ledger or DEFAULT_LEDGER)
        self.store = store if store is not None else DictStore()
        self.log: dict[str, list[Envelope | DeadLetter]] = {topic: [] for topic in TOPICS}
        #: Every envelope folded, in fold order (session events and compactions interleaved).
        self.folded: list[Envelope] = []

    def fold(self, envelope: Envelope) -> list[Envelope]:
        """Fold one envelope into the store, remembering the fold order."""
        self.folded.append(envelope)
        return fold_step(self.store, envelope, self.config, self.ledger)

    def publish(self, record: Envelope | DeadLetter) -> None:
        """Append one input record to its topic and fold everything that follows from it."""
        self.log[_topic(record)].append(record)
        if not isinstance(record, DeadLetter):
            outputs = self.fold(record)
            if outputs:  # most events produce nothing to route
                self.route(outputs)

    def route(self, outputs: Iterable[Envelope]) -> None:
        """Deliver outputs until none is left: requests are answered and their answers folded."""
        queue = deque(outputs)
        while queue:
            envelope = queue.popleft()
            self.log[_topic(envelope)].append(envelope)
            if isinstance(envelope, FlushRequestEnvelope):
                compaction = self.answerer.answer(envelope).envelope
                self.log[COMPACTION_EVENTS].append(compaction)
                queue.extend(self.fold(compaction))

    def sessions(self) -> list[str]:
        """Ids of the sessions the log has events of, in first-seen order."""
        events = self.log[SESSION_EVENTS]
        seen = dict.fromkeys(e.session_id for e in events if not isinstance(e, DeadLetter))
        return list(seen)

    def session_state(self, session_id: str, dead_letters: int | None = None) -> dict[str, Any]:
        """The projections of one session, JSON-ready (step.session_document)."""
        return session_document(self.store, session_id, self.config, self.ledger, dead_letters)


class _Tally(list):  # type: ignore[type-arg]
    """Stands in for one of the runtime's per-topic logs: counts appends, keeps nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.appended = 0

    def append(self, item: object) -> None:
        """Count the envelope instead of keeping it."""
        self.appended += 1


class CountedEmbeddedRuntime(EmbeddedRuntime):
    """The embedded runtime with its logs replaced by counters: memory is the state alone."""

    def __init__(
        self,
        config: PruneConfig = DEFAULT_CONFIG,
        summarizer: ModelPort | None = None,
        ledger: LedgerConfig | None = DEFAULT_LEDGER,
        diff_model: DiffModel | None = None,
    ) -> None:
        super().__init__(config, summarizer, ledger=ledger, diff_model=diff_model)
        self.log = {topic: _Tally() for topic in TOPICS}
        self.folded = _Tally()


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
    file. A file's flush answers recorded beside it by `serve` (answer_journal.py) are folded
    instead of the model's.
    """
    paths = list(paths)
    runtime = EmbeddedRuntime(config, ledger=ledger)
    runtime.answerer = with_journals(runtime.answerer, journals_beside(paths))
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
    sessions = {sid: runtime.session_state(sid, dead.get(sid, 0)) for sid in runtime.sessions()}
    result: dict[str, Any] = {"sessions": sessions}
    if dead.get(None):
        result["dead_letters"] = dead[None]  # lines before any session header
    return result
