"""The steps both runtimes call: fold, answer (and its failure policy), document, routing."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import pytest

from sessionfold.events.envelope import (
    CompactionEnvelope,
    CompactRequestEnvelope,
    EntryEnvelope,
    FlushMetricsEnvelope,
    FlushRequestEnvelope,
    LedgerPassEnvelope,
    LedgerRequestEnvelope,
    OpaquePayload,
    PruningCompactionEnvelope,
    PruningRequestEnvelope,
    decode,
    encode,
)
from sessionfold.events.flush import read_compaction, read_request
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.ports.summarizer import OfflineSummarizer
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.store import DictStore
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.runtime.embedded import (
    COMPACTION_EVENTS,
    FLUSH_METRICS,
    FLUSH_REQUESTS,
    EmbeddedRuntime,
    fold_files,
)
from sessionfold.streams.runtime.step import (
    Answerer,
    answer_ledger,
    answer_pruning,
    fold_step,
    pruning_request,
    session_document,
    topic_of,
)
from sessionfold.streams.tools.synthetic import generate_session, write_session

SECRET = "SECRET-WORDS-FROM-THE-MODEL"


class RaisingPort:
    """A model port whose every call raises, with text in the message that must not be logged."""

    def summarize(self, request: Any) -> Any:
        raise ConnectionError(SECRET)


class ThrowingDiffModel(OfflineModel):
    """A diff model whose name cannot be read: the pass throws when it closes the span.

    (A diff call that raises does not throw the pass: the span closes narrative-less.)
    """

    @property
    def name(self) -> str:
        raise LookupError(SECRET)


@pytest.fixture(scope="module")
def session_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic session long enough to flush and to compact."""
    root = tmp_path_factory.mktemp("step")
    return write_session(root, generate_session(7, 40)).path


@pytest.fixture(scope="module")
def runtime(session_path: Path) -> EmbeddedRuntime:
    """The session folded by the embedded runtime, its logs kept, then a compaction asked for."""
    runtime = _folded(session_path)
    last = max(e.seq for e in runtime.log["session-events"] if not isinstance(e, DeadLetter))
    runtime.publish(CompactRequestEnvelope(session_id=runtime.sessions()[0], seq=last + 1))
    return runtime


def _folded(path: Path) -> EmbeddedRuntime:
    runtime = EmbeddedRuntime()
    for record in read_session_file(path):
        runtime.publish(record)
    return runtime


def _requests(runtime: EmbeddedRuntime, kind: type[FlushRequestEnvelope]) -> list[Any]:
    return [e for e in runtime.log[FLUSH_REQUESTS] if isinstance(e, kind)]


# --- the fold step ------------------------------------------------------------------------------


def test_the_fold_step_folds_a_session_as_the_embedded_runtime_does(
    runtime: EmbeddedRuntime,
) -> None:
    """Folding the runtime's fold order through fold_step alone gives the same store."""
    store = DictStore()
    for envelope in runtime.folded:
        fold_step(store, envelope, DEFAULT_CONFIG)
    assert orjson.dumps(dict(store), option=orjson.OPT_SORT_KEYS) == orjson.dumps(
        dict(runtime.store), option=orjson.OPT_SORT_KEYS
    )


def test_the_fold_step_ignores_a_redelivered_event(runtime: EmbeddedRuntime) -> None:
    """A session event folded a second time produces nothing and writes nothing."""
    store = DictStore()
    first = next(e for e in runtime.folded if isinstance(e, EntryEnvelope))
    fold_step(store, first, DEFAULT_CONFIG)
    before = dict(store)
    assert fold_step(store, first, DEFAULT_CONFIG) == []
    assert dict(store) == before


def test_a_ledger_pass_result_does_not_reach_the_pruning_fold(runtime: EmbeddedRuntime) -> None:
    """A ledger pass result with the pruning fold's request id leaves the pruning head alone."""
    store = DictStore()
    for envelope in runtime.folded:
        if isinstance(envelope, CompactionEnvelope):
            break
        fold_step(store, envelope, DEFAULT_CONFIG)
    session_id = runtime.sessions()[0]
    head = pruning.load_head(store, session_id)
    assert head["out"] is not None  # the barrier is up: a flush request is outstanding
    stray = LedgerPassEnvelope(
        session_id=session_id,
        seq=1,
        payload=OpaquePayload(producer="sessionfold-ledger", request_id=head["out"]),
    )
    fold_step(store, stray, DEFAULT_CONFIG, ledger=None)
    assert pruning.load_head(store, session_id) == head


# --- the answer step and its failure policy -----------------------------------------------------


def test_a_pruning_request_is_answered_by_the_port(runtime: EmbeddedRuntime) -> None:
    """The offline port answers; the answer names the request and carries its seq."""
    request = _requests(runtime, PruningRequestEnvelope)[0]
    answer = Answerer(OfflineSummarizer(), OfflineModel()).answer(request)
    assert answer.outcome == "answered"
    assert isinstance(answer.envelope, PruningCompactionEnvelope)
    assert answer.envelope.seq == request.seq
    assert read_compaction(answer.envelope).request_id == read_request(request).request_id


def test_the_answer_step_reads_a_request_as_the_flush_events_do(runtime: EmbeddedRuntime) -> None:
    """Every pruning request, as folded and as read back from the wire, is the payload
    `read_request` gives: the answer step reads it without copying it first."""
    requests = _requests(runtime, PruningRequestEnvelope)
    assert requests
    for request in requests:
        wired = decode(encode(request))
        assert isinstance(wired, PruningRequestEnvelope)
        assert pruning_request(request) == read_request(request)
        assert pruning_request(wired) == read_request(wired) == read_request(request)


def test_a_port_that_raises_gets_an_error_compaction(
    runtime: EmbeddedRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    """A raising port still answers: an error compaction naming the class, no message text."""
    request = _requests(runtime, PruningRequestEnvelope)[0]
    with caplog.at_level(logging.WARNING):
        answer = answer_pruning(RaisingPort(), request)
    payload = read_compaction(answer.envelope)
    assert answer.outcome == "error"
    assert payload.error == "port-error:ConnectionError" and payload.results == ()
    assert payload.request_id == read_request(request).request_id
    assert SECRET not in caplog.text and SECRET not in str([r.__dict__ for r in caplog.records])


def test_a_pass_that_throws_gets_a_fallback(
    runtime: EmbeddedRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    """A ledger pass whose model raises answers with a fallback that closes nothing."""
    request = _requests(runtime, LedgerRequestEnvelope)[0]
    with caplog.at_level(logging.WARNING):
        answer = answer_ledger(ThrowingDiffModel(), request)
    assert answer.outcome == "error"
    assert isinstance(answer.envelope, LedgerPassEnvelope)
    assert answer.envelope.payload.fallback == "pass-error:LookupError"
    assert answer.envelope.payload.request == request.payload.request
    assert SECRET not in caplog.text


def test_an_embedded_runtime_with_a_raising_port_keeps_folding(session_path: Path) -> None:
    """The embedded runtime answers as Kafka does: every flush fails, none wedges the session."""
    runtime = EmbeddedRuntime(summarizer=RaisingPort())
    for record in read_session_file(session_path):
        runtime.publish(record)
    session_id = runtime.sessions()[0]
    attempts = pruning.flush_records(runtime.store, session_id)
    assert attempts and "summarized" not in {a["outcome"] for a in attempts}
    assert pruning.load_head(runtime.store, session_id)["out"] is None
    errors = [
        read_compaction(e).error
        for e in runtime.log[COMPACTION_EVENTS]
        if isinstance(e, PruningCompactionEnvelope)
    ]
    assert errors and set(errors) == {"port-error:ConnectionError"}


def test_a_request_of_no_known_fold_is_refused() -> None:
    """Only pruning and ledger requests have an answer."""
    request = FlushRequestEnvelope(session_id="s", seq=1, payload=OpaquePayload())
    with pytest.raises(TypeError, match="FlushRequestEnvelope"):
        Answerer(OfflineSummarizer(), OfflineModel()).answer(request)


# --- the session document -----------------------------------------------------------------------


def test_the_document_is_the_fold_command_s(session_path: Path) -> None:
    """session_document with a dead-letter count is one session of `fold --json`."""
    runtime = _folded(session_path)
    session_id = runtime.sessions()[0]
    expected = fold_files([session_path])["sessions"][session_id]
    document = session_document(runtime.store, session_id, DEFAULT_CONFIG, dead_letters=0)
    assert orjson.dumps(document) == orjson.dumps(expected)
    assert list(document)[-1] == "dead_letters"


def test_the_document_leaves_out_what_is_not_folded_or_counted(runtime: EmbeddedRuntime) -> None:
    """No `ledger` without a ledger config, no `dead_letters` without a count."""
    session_id = runtime.sessions()[0]
    document = session_document(runtime.store, session_id, DEFAULT_CONFIG, ledger=None)
    assert "ledger" not in document and "dead_letters" not in document
    assert set(document) == {
        "metrics",
        "frontier",
        "pending_batches",
        "flush_attempts",
        "stats",
        "counts",
    }


# --- routing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["", "team."])
def test_each_envelope_goes_to_its_topic(runtime: EmbeddedRuntime, prefix: str) -> None:
    """Requests, answers, metrics records, dead letters and session events, by type."""
    topics = Topics(prefix)
    dead = DeadLetter(source="f.jsonl", line=3, error="e", reason="r", size=1, session_id="s")
    samples = [
        (_requests(runtime, PruningRequestEnvelope)[0], topics.flush_requests),
        (_requests(runtime, LedgerRequestEnvelope)[0], topics.flush_requests),
        (runtime.log[COMPACTION_EVENTS][0], topics.compaction_events),
        (runtime.log[FLUSH_METRICS][0], topics.flush_metrics),
        (next(e for e in runtime.folded if isinstance(e, EntryEnvelope)), topics.session_events),
        (dead, topics.dead_letters),
    ]
    assert isinstance(samples[3][0], FlushMetricsEnvelope)
    for envelope, topic in samples:
        assert topic_of(envelope, topics) == topic
