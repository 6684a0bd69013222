"""The worker's per-record functions (worker/agents.py), run without a broker or Faust."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka_steps import COMPACTION_EVENTS, SESSION_EVENTS, StepCluster, fold_file
from prometheus_client import CollectorRegistry

from sessionfold.events.envelope import (
    CompactRequestEnvelope,
    FlushRequestEnvelope,
    LedgerRequestEnvelope,
    OpaquePayload,
    PruningCompactionEnvelope,
    PruningRequestEnvelope,
    encode,
)
from sessionfold.events.flush import read_request
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.store import DictStore
from sessionfold.streams.kafka.table_store import MemoryBackend, request_key
from sessionfold.streams.publishing.session_file import read_session_file
from sessionfold.streams.runtime.embedded import fold_files
from sessionfold.streams.runtime.step import session_document
from sessionfold.streams.tools.synthetic import generate_session, write_session
from sessionfold.streams.worker.agents import (
    LEDGER_FOLD,
    PRUNING_FOLD,
    Fault,
    SourceRecord,
    count_dead_letter,
    dead_letter_value,
    fold_record,
    observe_answer,
    observe_fold,
    outstanding_requests,
    read_request_record,
    request_fold,
    request_id_of,
    session_summary,
)
from sessionfold.streams.worker.prometheus import create


@pytest.fixture(scope="module")
def session_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic session that flushes."""
    return write_session(tmp_path_factory.mktemp("agents"), generate_session(11, 40)).path


@pytest.fixture(scope="module")
def cluster(session_path: Path) -> StepCluster:
    """The session through the worker's steps, then a compaction asked for (a ledger pass)."""
    cluster = fold_file(session_path)
    last = cluster.logs[SESSION_EVENTS][-1]
    cluster.publish(CompactRequestEnvelope(session_id=last.session_id, seq=last.seq + 1))
    return cluster


def _request(cluster: StepCluster, kind: type[FlushRequestEnvelope]) -> Any:
    return next(e for e in cluster.logs["requests"] if isinstance(e, kind))


def test_the_steps_fold_a_session_to_the_embedded_state(session_path: Path) -> None:
    """fold_record and the answerer give the store the embedded runtime's fold gives."""
    cluster = fold_file(session_path)
    [(session_id, expected)] = fold_files([session_path])["sessions"].items()
    document = session_document(cluster.store, session_id, DEFAULT_CONFIG, dead_letters=0)
    assert orjson.dumps(document) == orjson.dumps(expected)


def test_requests_are_told_apart_by_type(cluster: StepCluster) -> None:
    """A pruning request is the pruning fold's, named by request_id; a pass the ledger's."""
    pruning = _request(cluster, PruningRequestEnvelope)
    ledger = _request(cluster, LedgerRequestEnvelope)
    assert (request_fold(pruning), request_fold(ledger)) == (PRUNING_FOLD, LEDGER_FOLD)
    assert request_id_of(pruning) == read_request(pruning).request_id
    assert request_id_of(ledger) == ledger.payload.request


def test_an_outstanding_request_is_kept_until_answered(session_path: Path) -> None:
    """While a request waits, the store keeps it as sent; a recovery finds it; the answer drops
    it."""
    seen: list[tuple[FlushRequestEnvelope, list[Any]]] = []
    cluster = StepCluster()

    def check(request: FlushRequestEnvelope) -> None:
        backend = MemoryBackend({k: orjson.dumps(v) for k, v in cluster.store.items()})
        seen.append((request, outstanding_requests(backend, 1, {0})))
        assert outstanding_requests(backend, 1, set()) == []  # not this worker's partition

    for record in read_session_file(session_path):
        cluster.publish(record, before_answer=check)
    assert seen
    for request, found in seen:
        assert [encode(e) for e in found] == [encode(request)]
    session_id = seen[0][0].session_id
    for fold in (PRUNING_FOLD, LEDGER_FOLD):
        assert cluster.store.get(request_key(session_id, fold)) is None


def test_a_second_answer_is_counted_as_ignored(cluster: StepCluster) -> None:
    """The compaction outcome of an answer to nothing outstanding is `ignored`."""
    answer = cluster.logs[COMPACTION_EVENTS][0]
    store = DictStore(dict(cluster.store))
    record = SourceRecord(COMPACTION_EVENTS, 0, 99, answer.session_id.encode(), encode(answer))
    assert fold_record(store, record, DEFAULT_CONFIG).compaction == "ignored"


def test_a_record_keyed_by_another_session_is_a_fault() -> None:
    """A record keyed by another session than its envelope's is refused by reason."""
    pass_ = CompactRequestEnvelope(session_id="s", seq=1)
    record = SourceRecord(SESSION_EVENTS, 0, 0, b"t", encode(pass_))
    result = fold_record(DictStore(), record, DEFAULT_CONFIG)
    assert result.fault == Fault("key-mismatch", "record key is not the envelope's session id")


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"producer": "sessionfold-ledger", "session": "s"}, "invalid-request"),
        ({"request_id": "r"}, "invalid-request"),
    ],
)
def test_a_request_without_its_ids_is_dead_lettered(payload: dict[str, Any], reason: str) -> None:
    """A flush-requests record that no answer can name is refused, its fields not quoted."""
    envelope = FlushRequestEnvelope(session_id="s", seq=1, payload=OpaquePayload(**payload))
    fault = read_request_record(SourceRecord("fr", 0, 0, b"s", encode(envelope)))
    assert isinstance(fault, Fault) and fault.reason == reason
    assert "sessionfold-ledger" not in fault.error


def test_a_session_event_on_the_request_topic_is_dead_lettered() -> None:
    """Only flush requests are answered."""
    envelope = CompactRequestEnvelope(session_id="s", seq=1)
    fault = read_request_record(SourceRecord("fr", 0, 0, b"s", encode(envelope)))
    assert fault == Fault("unexpected-kind", "compact-request is not a flush request")


def test_a_dead_letter_keeps_the_bytes_and_names_the_source() -> None:
    """The dead-letter record carries position, reason, size and the raw bytes base64'd."""
    record = SourceRecord("se", 2, 41, b"s1", b"{broken")
    body = orjson.loads(dead_letter_value(record, Fault("undecodable", "not JSON (7 bytes)")))
    assert body == {
        "source": "se",
        "partition": 2,
        "offset": 41,
        "reason": "undecodable",
        "error": "not JSON (7 bytes)",
        "size": 7,
        "session_id": "s1",
        "raw_b64": base64.b64encode(b"{broken").decode(),
    }


def test_a_dead_letter_without_a_key_counts_for_no_session() -> None:
    """No key, no session to count it for."""
    store = DictStore()
    assert count_dead_letter(store, SourceRecord("dl", 0, 0, None, b"{}")) is False
    assert dict(store) == {}


def test_the_summary_of_a_settled_session_has_no_barrier(cluster: StepCluster) -> None:
    """After every answer, nothing is held and nothing outstanding."""
    session_id = cluster.logs[SESSION_EVENTS][0].session_id
    summary = session_summary(cluster.store, session_id, DEFAULT_CONFIG)
    assert (summary.held_events, summary.outstanding) == (0, False)


def test_answers_are_counted_by_outcome_and_batch(cluster: StepCluster) -> None:
    """A pruning answer counts its batches; a ledger answer only the request."""
    metrics = create(CollectorRegistry())
    answers = cluster.logs[COMPACTION_EVENTS]
    for answer in answers:
        observe_answer(metrics, answer, "answered", 0.1)
    registry = metrics.registry
    requests = registry.get_sample_value(
        "sessionfold_summarizer_requests_total", {"outcome": "answered"}
    )
    assert requests == len(answers)
    batches = sum(
        s.value
        for m in registry.collect()
        if m.name == "sessionfold_summarizer_batches"
        for s in m.samples
        if s.name.endswith("_total")
    )
    pruning = [a for a in answers if isinstance(a, PruningCompactionEnvelope)]
    assert batches == sum(len(a.payload.results) for a in pruning) > 0


def test_a_hole_in_a_sessions_sequence_numbers_is_counted_as_missing(session_path: Path) -> None:
    """Events a session's state never got (seq 5 to 7 here) are counted once, by how many; the
    events on either side of the hole and a redelivery count none."""
    envelopes = [e for e in read_session_file(session_path) if e.seq not in (5, 6, 7)]
    store = DictStore()
    registry = CollectorRegistry()
    metrics = create(registry)
    missing = []
    for offset, envelope in enumerate([*envelopes, envelopes[3]]):  # the last one redelivered
        key = envelope.session_id.encode()
        record = SourceRecord(SESSION_EVENTS, 0, offset, key, encode(envelope))
        result = fold_record(store, record, DEFAULT_CONFIG)
        observe_fold(metrics, result)
        missing.append(result.missing)
    assert missing[3:5] == [0, 3]  # seq 4 folded, then seq 8
    assert sum(missing) == 3
    assert registry.get_sample_value("sessionfold_events_missing_total") == 3
