"""The rule ledger on the real broker: passes asked by compact requests, World snapshots and pi
compactions give the same ledger state on Kafka workers as in the embedded runtime.

The fleet: before-compaction.jsonl (two pi compactions: two passes) and generated sessions
published with `sessionfold publish`, then, for some generated sessions, a World snapshot (it
carries the seq of the last entry) and a compact request, produced straight to session-events
the way a fleet SDK would. The embedded runtime folds the same envelopes in the same order.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import unique_topic_prefix
from kafka import KafkaProducer
from kafka_workers import WorkerProcess, fetch_state, generate_fleet, publish_tree, wait_converged

from sessionfold.events.envelope import (
    CompactRequestEnvelope,
    WorldEnvelope,
    WorldPayload,
    encode,
)
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file, session_files
from sessionfold.streams.runtime.embedded import EmbeddedRuntime

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

REAL = "ffae836b-9420-4060-ac13-7745215f90ff"  # before-compaction.jsonl


def _fleet(root: Path, shared_sessions: Path) -> list[Path]:
    (root / "real").mkdir(parents=True)
    shutil.copy(shared_sessions / "before-compaction.jsonl", root / "real")
    generate_fleet(root / "gen", 6, 30, seed=5)
    return list(session_files([root]))


def _extra_events(runtime: EmbeddedRuntime, sessions: list[str]) -> list[Any]:
    """A World snapshot and a compact request after each session's last entry."""
    extra: list[Any] = []
    for number, session_id in enumerate(sessions):
        last = max(e.seq for e in runtime.log["session-events"] if e.session_id == session_id)
        facts = {"branch": f"feature-{number}", "head": f"{number:07x}", "staged_count": number}
        extra.append(
            WorldEnvelope(session_id=session_id, seq=last, payload=WorldPayload(facts=facts))
        )
        extra.append(CompactRequestEnvelope(session_id=session_id, seq=last + 1))
    return extra


def test_ledger_on_kafka_equals_embedded(
    kafka_bootstrap: str, shared_sessions: Path, tmp_path: Path
) -> None:
    """Every session's state, ledger included, is the embedded runtime's; compact requests were
    answered by passes that closed a span seeing the World published before them."""
    paths = _fleet(tmp_path / "fleet", shared_sessions)
    runtime = EmbeddedRuntime()
    for path in paths:
        for record in read_session_file(path):
            assert not isinstance(record, DeadLetter)
            runtime.publish(record)
    generated = [sid for sid in runtime.sessions() if sid != REAL][:4]
    extra = _extra_events(runtime, generated)
    for envelope in extra:
        runtime.publish(envelope)
    expected = {
        sid: {**runtime.session_state(sid), "dead_letters": 0} for sid in runtime.sessions()
    }

    prefix = unique_topic_prefix()
    publish_tree(kafka_bootstrap, prefix, 2, [tmp_path / "fleet"], tmp_path / "publish.json")
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    for envelope in extra:
        key = envelope.session_id.encode()
        producer.send(Topics(prefix).session_events, key=key, value=encode(envelope))
    producer.flush()
    producer.close()

    worker = WorkerProcess(kafka_bootstrap, prefix, "all", 2, tmp_path).start()
    try:
        worker.wait_web()
        wait_converged([worker], worker.url, expected, timeout=240)
        for number, session_id in enumerate(generated):
            status, body = fetch_state(worker.url, session_id)
            assert status == 200
            ledger = body["ledger"]
            assert ledger["span"] == 1 and ledger["spans"][0]["trigger"] == "compact-request"
            assert ledger["world"]["branch"] == f"feature-{number}"
            assert ledger["spans"][0]["world"]["branch"] == f"feature-{number}"
        real = expected[REAL]["ledger"]
        assert real["span"] == 2 and len(real["rules"]) >= 1
    finally:
        worker.stop()
