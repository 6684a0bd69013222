"""The state API's documents (web/state_api.py) over a store the worker's steps folded."""

from __future__ import annotations

from pathlib import Path

import faust
import orjson
import pytest
from kafka_steps import SESSION_EVENTS, StepCluster, fold_file

from sessionfold.events.envelope import encode
from sessionfold.projections.pruning import index
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.store import DictStore
from sessionfold.streams.kafka.table_store import offset_key
from sessionfold.streams.runtime.embedded import fold_files
from sessionfold.streams.tools.synthetic import generate_session, write_session
from sessionfold.streams.web import state_api
from sessionfold.streams.web.state_api import (
    MAX_ID_CHARS,
    RefLocation,
    dead_letter_count,
    flushes_document,
    known,
    locate_ref,
    ref_document,
    session_document,
    too_long,
)
from sessionfold.streams.worker.agents import SourceRecord, count_dead_letter


@pytest.fixture(scope="module")
def session_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic session whose flushes summarize tool output (so refs exist)."""
    return write_session(tmp_path_factory.mktemp("state"), generate_session(3, 40)).path


@pytest.fixture(scope="module")
def cluster(session_path: Path) -> StepCluster:
    """The session folded by the worker's steps."""
    return fold_file(session_path)


@pytest.fixture(scope="module")
def session_id(cluster: StepCluster) -> str:
    """The session's id."""
    return str(cluster.logs[SESSION_EVENTS][0].session_id)


def _located(cluster: StepCluster, session_id: str) -> RefLocation:
    location = locate_ref(cluster.store, session_id, "t1")
    assert isinstance(location, RefLocation)
    return location


def test_an_unknown_session_has_no_documents() -> None:
    """Nothing folded: no session document, no flushes, no ref."""
    store = DictStore()
    assert not known(store, "s")
    assert session_document(store, "s", DEFAULT_CONFIG) is None
    assert flushes_document(store, "s") is None
    assert locate_ref(store, "s", "t1") == "unknown session"


def test_the_session_document_is_the_fold_command_s(
    session_path: Path, cluster: StepCluster, session_id: str
) -> None:
    """The API's document is one session of `sessionfold fold --json`, byte for byte."""
    expected = fold_files([session_path])["sessions"][session_id]
    document = session_document(cluster.store, session_id, DEFAULT_CONFIG)
    assert orjson.dumps(document) == orjson.dumps(expected)


def test_the_document_counts_the_session_s_dead_letters(
    cluster: StepCluster, session_id: str
) -> None:
    """Each dead-letter record counted for the session shows in its document."""
    store = DictStore(dict(cluster.store))
    key = session_id.encode()
    for offset in range(3):
        count_dead_letter(store, SourceRecord("dl", 0, offset, key, b'{"line": 1}'))
    assert dead_letter_count(store, session_id) == 3
    document = session_document(store, session_id, DEFAULT_CONFIG)
    assert document is not None and document["dead_letters"] == 3
    assert dead_letter_count(cluster.store, session_id) == 0


def test_the_flushes_document_has_the_attempts_and_no_barrier(
    cluster: StepCluster, session_id: str
) -> None:
    """Every flush attempt, and (all answered) nothing outstanding or held."""
    document = flushes_document(cluster.store, session_id)
    assert document == {
        "session_id": session_id,
        "flush_attempts": pruning.flush_records(cluster.store, session_id),
        "outstanding": None,
        "held_events": 0,
    }
    assert document["flush_attempts"]


def test_a_ref_is_located_at_its_original_s_offset(cluster: StepCluster, session_id: str) -> None:
    """`t1` points at the session-events offset of the toolResult entry it summarized."""
    location = _located(cluster, session_id)
    original = cluster.logs[SESSION_EVENTS][location.offset]
    assert (location.partition, original.seq) == (0, location.seq)
    assert location.key == index.resolve_ref(cluster.store, session_id, "t1")


def test_a_ref_without_a_summary_or_a_position_is_not_located(
    cluster: StepCluster, session_id: str
) -> None:
    """An unknown ref, and a known one whose log position was never recorded."""
    assert locate_ref(cluster.store, session_id, "t999999") == "unknown ref"
    store = DictStore(dict(cluster.store))
    store.delete(offset_key(session_id, _located(cluster, session_id).seq))
    assert locate_ref(store, session_id, "t1") == "original not located"


def test_the_ref_document_is_the_original_tool_output(
    cluster: StepCluster, session_id: str
) -> None:
    """The document carries the toolResult's call id, name and content, and where it sits."""
    location = _located(cluster, session_id)
    original = cluster.logs[SESSION_EVENTS][location.offset]
    document = ref_document(location, encode(original), "se")
    message = original.payload.entry["message"]
    assert document is not None
    assert (document["tool_call_id"], document["content"]) == (
        message["toolCallId"],
        message["content"],
    )
    assert document["location"] == {"topic": "se", "partition": 0, "offset": location.offset}


def test_the_ref_document_refuses_a_record_that_is_not_the_original(
    cluster: StepCluster, session_id: str
) -> None:
    """No record, bytes that are no envelope, and another entry at that offset give None."""
    location = _located(cluster, session_id)
    other = cluster.logs[SESSION_EVENTS][location.offset - 1]
    assert ref_document(location, None, "se") is None
    assert ref_document(location, b"{not json", "se") is None
    assert ref_document(location, encode(other), "se") is None


def test_ids_longer_than_the_limit_are_too_long() -> None:
    """The limit holds for each id given."""
    assert not too_long("s" * MAX_ID_CHARS)
    assert too_long("s" * (MAX_ID_CHARS + 1))
    assert too_long("s", "t" * (MAX_ID_CHARS + 1))
    assert not too_long("s", "t1")


def test_reads_wait_while_the_table_is_recovered() -> None:
    """While the worker rebuilds its table (a half-applied group may be in it) every read is a
    503 naming the session; none once the recovery is done."""
    app = faust.App("state-api-recovering", broker="kafka://127.0.0.1:1", autodiscover=False)
    app.in_recovery = True
    assert state_api.recovering(app, "s1") == {"error": "recovering", "session_id": "s1"}
    app.in_recovery = False
    assert state_api.recovering(app, "s1") is None
