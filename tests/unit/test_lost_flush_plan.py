"""A compaction whose flush plan row is gone (a damaged or partly restored state) still takes the
barrier down: the session folds on, and the batches it did not get back are captured again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from kafka_steps import StepCluster

from sessionfold.events.envelope import LedgerRequestEnvelope
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.session import row_key
from sessionfold.projections.store import DictStore, key
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.tools.synthetic import generate_session, write_session


class CopyingStore(DictStore):
    """A store that hands out copies, as the Kafka runtime's table does (values are decoded
    afresh on every read): a change a fold makes but does not `put` is lost, as there."""

    def get(self, key: str, default: Any = None) -> Any:
        value = super().get(key, default)
        return None if value is None else orjson.loads(orjson.dumps(value))


def test_an_answer_without_its_plan_releases_the_barrier(tmp_path: Path) -> None:
    path = write_session(tmp_path, generate_session(seed=3, turns=40)).path
    envelopes = [e for e in read_session_file(path) if not isinstance(e, DeadLetter)]
    cluster = StepCluster(store=CopyingStore())
    lost: list[str] = []

    def lose_the_first_plan(request: object) -> None:
        if lost or isinstance(request, LedgerRequestEnvelope):
            return
        request_id = request.payload.request_id  # type: ignore[attr-defined]
        plan = row_key(request.session_id, "q", request_id)  # type: ignore[attr-defined]
        assert cluster.store.get(plan) is not None
        cluster.store.delete(plan)
        lost.append(request_id)

    for envelope in envelopes:
        cluster.publish(envelope, before_answer=lose_the_first_plan)
    assert lost, "the session raised no pruning flush request"
    session_id = envelopes[0].session_id
    head = pruning.load_head(cluster.store, session_id)
    assert head["out"] is None, "the barrier stayed up for ever"
    assert not [k for k in cluster.store if k.startswith(key(session_id, "pr", "held"))]
    assert head["seq"] == envelopes[-1].seq
