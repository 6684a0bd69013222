"""The Kafka runtime's steps in one process: records folded by `fold_record`, requests answered by
the answerer, answers folded back, all over one DictStore (no broker, no Faust)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessionfold.events.envelope import FlushRequestEnvelope, encode
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.ports.summarizer import OfflineSummarizer
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.store import DictStore
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.runtime.step import Answerer
from sessionfold.streams.worker.agents import SourceRecord, fold_record

SESSION_EVENTS = "session-events"
COMPACTION_EVENTS = "compaction-events"


@dataclass
class StepCluster:
    """One partition's topics as lists of envelopes, and the state the fold steps left."""

    store: DictStore = field(default_factory=DictStore)
    logs: dict[str, list[Any]] = field(
        default_factory=lambda: {SESSION_EVENTS: [], COMPACTION_EVENTS: [], "requests": []}
    )
    answerer: Answerer = field(
        default_factory=lambda: Answerer(OfflineSummarizer(), OfflineModel())
    )

    def fold(self, topic: str, envelope: Any) -> list[Any]:
        """Append one envelope to `topic` and fold it as a fold worker would; its outputs."""
        offset = len(self.logs[topic])
        self.logs[topic].append(envelope)
        key = envelope.session_id.encode()
        record = SourceRecord(topic, 0, offset, key, encode(envelope))
        return fold_record(self.store, record, DEFAULT_CONFIG).outputs

    def publish(
        self, envelope: Any, before_answer: Callable[[FlushRequestEnvelope], None] | None = None
    ) -> None:
        """Fold a session event and every request and answer that follows from it."""
        queue = deque(self.fold(SESSION_EVENTS, envelope))
        while queue:
            output = queue.popleft()
            if isinstance(output, FlushRequestEnvelope):
                self.logs["requests"].append(output)
                if before_answer is not None:
                    before_answer(output)
                queue.extend(self.fold(COMPACTION_EVENTS, self.answerer.answer(output).envelope))


def fold_file(path: Path, **kwargs: Any) -> StepCluster:
    """A session file's envelopes through the steps (its dead letters left out)."""
    cluster = StepCluster()
    for record in read_session_file(path):
        if not isinstance(record, DeadLetter):
            cluster.publish(record, **kwargs)
    return cluster
