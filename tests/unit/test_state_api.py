"""The state API's documents (web/state_api.py) over a store the worker's steps folded, its
503 while a session's partition is recovered (on Faust's real recovery, faust_fakes), and its
503 while a request cannot be routed yet (on Faust's real router), logged a line a minute."""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from itertools import count
from pathlib import Path
from typing import Any

import aiokafka
import faust
import orjson
import pytest
from aiokafka.structs import PartitionMetadata
from faust.types import TP
from faust_fakes import RecoveryDriver, unstarted_app
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka_steps import SESSION_EVENTS, StepCluster, fold_file
from yarl import URL

from sessionfold.events.envelope import encode
from sessionfold.projections.pruning import index
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.store import DictStore
from sessionfold.streams.kafka import faust_compat
from sessionfold.streams.kafka.security import PLAINTEXT
from sessionfold.streams.kafka.table_store import offset_key
from sessionfold.streams.kafka.topics import Topics, partition_of
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


def _session_on(partition: int, partitions: int = 2) -> str:
    """A session id whose records go to `partition`."""
    return next(s for s in (f"s{n}" for n in count()) if partition_of(s, partitions) == partition)


def _waiting(session_id: str) -> dict[str, str]:
    return {"error": "recovering", "session_id": session_id}


def test_a_session_is_in_its_session_events_partition_of_the_changelog(tmp_path: Path) -> None:
    """The changelog partition read for a session has its session-events partition's number."""
    app = unstarted_app(tmp_path)
    table = app.Table("state", key_type=str, value_type=bytes, partitions=4)
    for session_id in ("s1", "s2", "a-36-character-session-id-0000000000"):
        tp = state_api.changelog_partition(app, table, session_id)
        assert tp == TP("unstarted-state-changelog", partition_of(session_id, 4))


def test_reads_are_served_when_no_recovery_runs(tmp_path: Path) -> None:
    """No recovery running: every session is served, whatever is known of the last one; while
    one runs, a partition nothing is known of waits (503 naming the session)."""
    app = unstarted_app(tmp_path)
    progress = faust_compat.watch_recovery(app)
    tp = TP("unstarted-state-changelog", 0)
    assert state_api.recovering(app, "s1", progress, tp) is None
    app.in_recovery = True
    assert state_api.recovering(app, "s1", progress, tp) == _waiting("s1")


def test_a_session_waits_only_while_its_partition_is_recovered(tmp_path: Path) -> None:
    """A session of a partition recovered up to its highwater is served while another partition
    still recovers, whose sessions get the 503 (a half-applied group may be in it); after a new
    rebalance the first waits again until its partition is recovered anew."""
    on_0, on_1 = _session_on(0), _session_on(1)

    async def run() -> None:
        driver = RecoveryDriver(tmp_path, chunk=1, tracked=faust_compat.watch_recovery)
        app, progress = driver.app, driver.progress

        def answer(session_id: str) -> dict[str, Any] | None:
            tp = state_api.changelog_partition(app, driver.table, session_id)
            return state_api.recovering(app, session_id, progress, tp)

        driver.ends.update({driver.tp(0): 1, driver.tp(1): 2})
        await driver.rebalance(0, 1)
        assert (answer(on_0), answer(on_1)) == (_waiting(on_0), _waiting(on_1))
        await driver.read(0, 0)
        assert app.in_recovery
        assert answer(on_0) is None
        assert answer(on_1) == _waiting(on_1)
        await driver.read(1, 0)
        await driver.read(1, 1)
        assert not app.in_recovery
        assert (answer(on_0), answer(on_1)) == (None, None)

        driver.ends.update({driver.tp(0): 2, driver.tp(1): 3})
        await driver.rebalance(0, 1)
        assert app.in_recovery
        assert answer(on_0) == _waiting(on_0)
        await driver.read(0, 1)
        assert answer(on_0) is None
        assert answer(on_1) == _waiting(on_1)
        driver.stop()

    asyncio.run(run())


def test_a_view_answers_503_for_a_partition_still_recovering(tmp_path: Path) -> None:
    """The guard around each view: a session whose partition is recovered reaches the view,
    another gets a 503 with the `recovering` body."""

    class FakeView:
        def bytes(
            self, body: bytes, content_type: str, status: int, headers: dict[str, str] | None
        ) -> Any:
            return status, orjson.loads(body)

    async def view(_view: Any, _request: Any, session_id: str) -> Any:
        return 200, {"session_id": session_id}

    on_0, on_1 = _session_on(0), _session_on(1)

    async def run() -> None:
        driver = RecoveryDriver(tmp_path, chunk=1, tracked=faust_compat.watch_recovery)
        driver.ends.update({driver.tp(0): 1, driver.tp(1): 2})
        await driver.rebalance(0, 1)
        await driver.read(0, 0)
        guarded = state_api._unless_recovering(driver.app, driver.table, driver.progress)(view)
        assert await guarded(FakeView(), None, on_0) == (200, {"session_id": on_0})
        assert await guarded(FakeView(), None, on_1) == (503, _waiting(on_1))
        driver.stop()

    asyncio.run(run())


class RouteView:
    """What the state views use of Faust's View: `web` (Faust's proxy) and `bytes`."""

    web: Any = None

    def bytes(
        self, body: bytes, content_type: str, status: int, headers: dict[str, str] | None
    ) -> tuple[int, dict[str, str], Any]:
        return status, dict(headers or {}), orjson.loads(body)


class RouteRequest:
    """What Faust's proxy reads of a request."""

    method = "GET"
    headers: dict[str, str] = {}  # noqa: RUF012 (read only)
    url = URL("http://127.0.0.1:1/sessions/s1")
    match_info = {"session_id": "s1"}  # noqa: RUF012 (read only)


def _closed_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on (right now)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _routing_app(tmp_path: Path) -> tuple[faust.App, Any]:
    """A real Faust app (never started) with the worker's table, as its router sees it."""
    app = unstarted_app(tmp_path)
    table = app.Table("state", key_type=str, value_type=bytes, partitions=2)
    return app, table


def _know_changelog(table: Any, producer: aiokafka.AIOKafkaProducer) -> list[TP]:
    """Give the producer metadata of the changelog topic (what its first metadata fetch
    brings); the topic's partitions."""
    topic = table.changelog_topic.get_topic_name()
    producer._metadata._partitions[topic] = {
        p: PartitionMetadata(topic, p, 0, [0], [0], None) for p in range(2)
    }
    return [TP(topic, p) for p in range(2)]


def test_a_view_the_worker_cannot_route_yet_answers_503_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """At each stage of a worker's start, on Faust's real router and aiokafka's real producer
    metadata: a 503 with Retry-After naming why, one log line per reason however many
    requests, no traceback; the view runs once this worker owns the partition. Before the
    producer has the changelog topic's metadata, Faust's router raises the worker's bug:
    `TypeError: 'NoneType' object is not iterable` in key_partition."""

    async def view(_view: Any, _request: Any, session_id: str) -> Any:
        return 200, {}, {"session_id": session_id}

    async def run() -> list[Any]:
        app, table = _routing_app(tmp_path)
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers="127.0.0.1:1")  # never started
        app.producer._producer = producer
        with pytest.raises(TypeError, match="'NoneType' object is not iterable"):
            app.router.key_store(table.name, "s1")
        app.producer._producer = None
        not_ready = state_api.NotReadyLog()
        routed = state_api._routed(app, table, not_ready)(view)
        answers = []

        async def ask(times: int = 3) -> None:
            for _ in range(times):
                answers.append(await routed(RouteView(), RouteRequest(), "s1"))

        await ask()  # the producer is not started
        app.producer._producer = producer
        await ask()  # started, no metadata of the changelog topic yet
        changelog = _know_changelog(table, producer)
        await ask()  # metadata, no assignment yet
        elsewhere = f"http://127.0.0.1:{_closed_port()}"
        app.assignor._tps_url.update({tp: elsewhere for tp in changelog})
        await ask()  # assigned to a worker whose web server is not up
        app.assignor._tps_url.update({tp: str(app.conf.canonical_url) for tp in changelog})
        await ask(1)  # this worker owns it
        await app.http_client.close()
        await producer.stop()
        return answers

    caplog.set_level(logging.DEBUG)
    answers = asyncio.run(run())
    retry = {"Retry-After": str(state_api.RETRY_AFTER_S)}
    expected = [
        (503, retry, {"error": "not ready", "reason": reason, "session_id": "s1"})
        for reason in ("producer", "metadata", "assignment", "owner")
        for _ in range(3)
    ]
    assert answers == [*expected, (200, {}, {"session_id": "s1"})]
    lines = [r.getMessage() for r in caplog.records if r.name == state_api.log.name]
    assert lines == [
        f"state API answers 503 (retry after 1s): reason={reason} requests=1"
        for reason in ("producer", "metadata", "assignment", "owner")
    ]
    assert not [r for r in caplog.records if r.exc_info] and "Traceback" not in caplog.text


def test_a_router_raising_the_start_up_type_error_is_a_503(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A router whose key_partition raises the start-up TypeError: every state view (session,
    flushes, ref, through their registered pages) answers 503 with Retry-After, logged as one
    line, no traceback; so do Faust's /router views through the middleware."""

    class Router:
        def key_partition(self, topic: str, key: bytes) -> Any:
            return list(None)  # type: ignore[call-overload]

        async def route_req(self, table: str, key: str, web: Any, request: Any) -> Any:
            return self.key_partition(table, key.encode())

        def key_store(self, table: str, key: str) -> Any:
            return self.key_partition(table, key.encode())

    app, table = _routing_app(tmp_path)
    app.router = Router()
    pages: dict[str, Any] = {}
    app.page = lambda path, name: lambda view: pages.setdefault(name, view)  # type: ignore[method-assign]
    not_ready = state_api.NotReadyLog()
    backend: Any = {}  # never read: no request gets past routing
    topics = Topics("t.")
    state_api.register(
        app, table, backend, DEFAULT_CONFIG, topics, "127.0.0.1:1", None, PLAINTEXT, not_ready
    )

    async def run() -> list[Any]:
        answers = []
        for name, args in (
            ("session", ("s1",)),
            ("session-flushes", ("s1",)),
            ("session-ref", ("s1", "t1")),
        ):
            view = pages[name](app, None)
            view.bytes = RouteView().bytes
            answers.append(await view.get(RouteRequest(), *args))

        async def faust_router_view(request: Any) -> Any:
            return app.router.key_store("state", "s1")

        middleware = state_api.not_ready_middleware(not_ready)
        response = await middleware(None, faust_router_view)
        answers.append((response.status, {"Retry-After": response.headers["Retry-After"]}))
        return answers

    caplog.set_level(logging.DEBUG)
    answers = asyncio.run(run())
    retry = {"Retry-After": str(state_api.RETRY_AFTER_S)}
    body = {"error": "not ready", "reason": "metadata", "session_id": "s1"}
    assert answers == [(503, retry, body)] * 3 + [(503, retry)]
    lines = [r.getMessage() for r in caplog.records if r.name == state_api.log.name]
    assert lines == ["state API answers 503 (retry after 1s): reason=metadata requests=1"]
    assert not [r for r in caplog.records if r.exc_info] and "Traceback" not in caplog.text


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([*faust_compat.ROUTING_REASONS, "recovering"]),
            st.floats(min_value=0, max_value=90, allow_nan=False),
        ),
        max_size=60,
    )
)
def test_each_kind_of_503_logs_one_line_an_interval_counting_every_request(
    requests: list[tuple[str, float]],
) -> None:
    """Whatever the requests and their spacing: a kind's first 503 is logged; its lines are an
    interval apart at least; no request of a kind comes an interval or more after the kind's
    last line without being logged; each line counts the requests since the previous one."""
    clock = [0.0]
    current = [0]
    lines: list[tuple[int, str, int]] = []  # (request index, reason, requests counted)

    class Lines(logging.Logger):
        def info(self, msg: object, *args: Any, **kwargs: Any) -> None:
            _retry, reason, counted = args
            lines.append((current[0], reason, counted))

    not_ready = state_api.NotReadyLog(interval_s=60.0, clock=lambda: clock[0], logger=Lines("t"))
    times = []
    for n, (reason, wait) in enumerate(requests):
        clock[0] += wait
        current[0] = n
        times.append(clock[0])
        not_ready.note(reason)
    for reason in {r for r, _ in requests}:
        asked = [i for i, (r, _) in enumerate(requests) if r == reason]
        logged = [i for i, r, _ in lines if r == reason]
        assert logged[0] == asked[0]
        assert all(times[b] - times[a] >= 60.0 for a, b in itertools.pairwise(logged))
        for i in asked:
            last = max(j for j in logged if j <= i)
            assert i == last or times[i] - times[last] < 60.0
        counts = [n for _, r, n in lines if r == reason]
        since = [sum(1 for i in asked if a < i <= b) for a, b in itertools.pairwise([-1, *logged])]
        assert counts == since


def test_a_worker_plans_in_process_only_the_sessions_it_owns(tmp_path: Path) -> None:
    """`LocalPlans` (the gateway's first ask): the plan of a session this worker owns, as
    Faust's router decides it; None for another owner's, for no owner yet and for an id too
    long (the route answers those); a 503 while the session's partition recovers or its log
    cannot be read."""
    app = unstarted_app(tmp_path, canonical_url="http://127.0.0.1:6066")
    table = app.Table("state", key_type=str, value_type=bytes, partitions=2)
    here, there = URL("http://127.0.0.1:6066"), URL("http://127.0.0.1:6067")
    owners = {"mine": here, "theirs": there, "m" * 300: here}

    def key_store(_table: str, key: str) -> URL:
        return owners[key]  # KeyError: nobody owns it yet

    app.router.key_store = key_store  # type: ignore[method-assign]

    class Live:
        broken = False

        async def plan(self, session_id: str) -> bytes:
            if self.broken:
                raise state_api.LogUnavailable("KafkaError")
            return b'{"session": "%s"}' % session_id.encode()

    live = Live()
    local = state_api.LocalPlans(app, table, live, faust_compat.watch_recovery(app))
    assert asyncio.run(local("mine")) == (200, b'{"session": "mine"}')
    assert asyncio.run(local("theirs")) is None
    assert asyncio.run(local("nobody")) is None
    assert asyncio.run(local("m" * 300)) is None
    live.broken = True
    assert asyncio.run(local("mine")) == (503, b"")
    live.broken = False
    app.in_recovery = True  # nothing of the partition recovered yet
    assert asyncio.run(local("mine")) == (503, b"")
