"""The Kafka runtime's store, journal and fold steps, without a broker.

A dict stands in for the Faust table and lists for the topics. `Cluster` replays Kafka's
at-least-once delivery: every consumer re-reads from its last committed position after a crash,
and whatever the table and the topics got before the crash stays. Crashing at many points must
still end in the embedded runtime's state, with every flush answered and applied once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from backend_fakes import DictBackend, acknowledged
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from sessionfold.events.envelope import EntryEnvelope, EntryPayload, decode, encode
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.ports.summarizer import OfflineSummarizer
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.store import DictStore
from sessionfold.streams.kafka.table_store import (
    RECORD_OVERHEAD,
    Journal,
    MemoryBackend,
    Output,
    TableStore,
    Write,
    WriteSet,
    journal_key,
    key_writes,
    read_view,
    record_batches,
)
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.runtime.embedded import fold_files
from sessionfold.streams.runtime.step import Answerer
from sessionfold.streams.tools.synthetic import generate_session, write_session
from sessionfold.streams.web.state_api import session_document
from sessionfold.streams.worker.agents import (
    OFFLOAD_BYTES,
    Fault,
    FoldRuntime,
    SessionTracker,
    SourceRecord,
    SummarizeRuntime,
    awaited_request,
    count_dead_letter,
    fold_record,
    read_envelope,
)
from sessionfold.streams.worker.prometheus import create

TOPICS = Topics("u.")


class Crash(Exception):
    """The process died here."""


class CrashingTable(dict):
    """A dict table that dies at chosen write numbers (the writes before it stay).

    A group of writes (`MemoryBackend.write_groups`: one record batch) is one `update`, and
    one write: it lands whole or, when the table dies there, not at all, as in the changelog.
    """

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.crash_at: set[int] = set()

    def _tick(self) -> None:
        self.writes += 1
        if self.writes in self.crash_at:
            raise Crash

    def __setitem__(self, key: str, value: bytes) -> None:
        self._tick()
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self._tick()
        super().__delitem__(key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._tick()
        super().update(*args, **kwargs)


class Cluster:
    """Topics as lists, two consumers with committed positions, the runtimes over one table."""

    def __init__(self, table: CrashingTable) -> None:
        self.table = table
        self.backend = MemoryBackend(table)
        self.logs: dict[str, list[Output]] = {name: [] for name in TOPICS.all()}
        self.sends = 0
        self.crash_sends: set[int] = set()
        self.metrics = create(CollectorRegistry())
        self.tracker = SessionTracker(self.backend, DEFAULT_CONFIG, 1)
        self.fold = self.new_fold()
        answerer = Answerer(OfflineSummarizer(), OfflineModel())
        self.summarize = SummarizeRuntime(answerer, self.send, TOPICS, self.metrics)
        self.crashes = 0

    def new_fold(self) -> FoldRuntime:
        """A fold runtime over the table, as a (re)started worker has."""
        return FoldRuntime(
            self.backend, self.send, TOPICS, DEFAULT_CONFIG, self.metrics, self.tracker
        )

    async def send(self, output: Output) -> Any:
        self.sends += 1
        if self.sends in self.crash_sends:
            raise Crash
        self.logs[output.topic].append(output)
        return acknowledged()

    async def run(self) -> None:
        """Consume until every topic is read; a crash rewinds the consumer to its commit."""
        fold_inputs = (TOPICS.session_events, TOPICS.compaction_events)
        committed = {TOPICS.session_events: 0, TOPICS.compaction_events: 0}
        committed_requests = 0
        while True:
            progressed = False
            for topic in fold_inputs:
                position = committed[topic]
                if position < len(self.logs[topic]):
                    output = self.logs[topic][position]
                    record = SourceRecord(topic, 0, position, output.key, output.value)
                    try:
                        await (await self.fold.handle(record))
                    except Crash:
                        self.crashes += 1
                        progressed = True  # not committed: redelivered
                        continue
                    committed[topic] = position + 1
                    progressed = True
            if committed_requests < len(self.logs[TOPICS.flush_requests]):
                if not await self.answer(committed_requests):
                    continue  # not committed: redelivered
                committed_requests += 1
                progressed = True
            if not progressed:
                return

    async def answer(self, position: int) -> bool:
        """Answer the flush request at `position`; False when a crash came first."""
        output = self.logs[TOPICS.flush_requests][position]
        record = SourceRecord(TOPICS.flush_requests, 0, position, output.key, output.value)
        try:
            await (await self.summarize.handle(record))
        except Crash:
            self.crashes += 1
            return False
        return True


class BatchingCluster(Cluster):
    """The fold takes up to `batch` records (from both topics, in turn), commits them once, and
    acknowledges them all when that is done; a crash loses the process (its open batch) and
    rewinds the consumer to the last commit."""

    def __init__(self, table: CrashingTable, batch: int) -> None:
        super().__init__(table)
        self.batch = batch

    async def run(self) -> None:
        """Consume until every topic is read, a batch of fold records at a time."""
        fold_inputs = (TOPICS.session_events, TOPICS.compaction_events)
        committed = dict.fromkeys(fold_inputs, 0)
        committed_requests = 0
        while True:
            progressed = False
            positions = dict(committed)
            taken = 0
            try:
                moved = True
                while moved and taken < self.batch:
                    moved = False
                    for topic in fold_inputs:
                        position = positions[topic]
                        if taken < self.batch and position < len(self.logs[topic]):
                            output = self.logs[topic][position]
                            record = SourceRecord(topic, 0, position, output.key, output.value)
                            await self.fold.fold(record)
                            positions[topic] = position + 1
                            taken += 1
                            moved = True
                if taken:
                    await (await self.fold.commit())
                    committed = positions
                    progressed = True
            except Crash:
                self.crashes += 1
                self.fold = self.new_fold()
                progressed = True
            if committed_requests < len(self.logs[TOPICS.flush_requests]):
                committed_requests += await self.answer(committed_requests)
                progressed = True
            if not progressed:
                return


def _write_fleet(root: Path, seeds: tuple[int, ...], turns: int) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    return [write_session(root, generate_session(seed, turns)).path for seed in seeds]


def _records(paths: list[Path]) -> Iterator[Any]:
    for path in paths:
        for record in read_session_file(path):
            if not isinstance(record, DeadLetter):
                yield record


def _publish(cluster: Cluster, paths: list[Path]) -> None:
    for envelope in _records(paths):
        key = envelope.session_id.encode()
        cluster.logs[TOPICS.session_events].append(
            Output(TOPICS.session_events, key, encode(envelope))
        )


def _states(table: dict[str, bytes], session_ids: list[str]) -> dict[str, Any]:
    backend = MemoryBackend(table)
    return {
        sid: session_document(read_view(backend, sid), sid, DEFAULT_CONFIG) for sid in session_ids
    }


def _assert_embedded_states(table: dict[str, bytes], expected: dict[str, Any]) -> dict[str, Any]:
    """The states the table holds, each asserted identical (canonical JSON) to the embedded
    runtime's."""
    states = _states(table, list(expected))
    for sid, state in expected.items():
        sort = orjson.OPT_SORT_KEYS
        assert orjson.dumps(states[sid], option=sort) == orjson.dumps(state, option=sort), sid
    return states


def _assert_requests_applied_once(cluster: Cluster, states: dict[str, Any]) -> set[str]:
    """Every flush request on the topic was applied, and none twice; the applied ids."""
    requests = {
        orjson.loads(o.value)["payload"]["request_id"] for o in cluster.logs[TOPICS.flush_requests]
    }
    recorded = Counter(
        attempt["request_id"] for state in states.values() for attempt in state["flush_attempts"]
    )
    assert requests <= set(recorded)
    assert max(recorded.values()) == 1
    return set(recorded)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], dict[str, Any]]:
    """Three generated sessions and their embedded-runtime states."""
    paths = _write_fleet(tmp_path_factory.mktemp("fleet"), (21, 22, 23), 40)
    return paths, fold_files(paths)["sessions"]


class TestWriteSet:
    def test_reads_fall_through_and_writes_stay_local(self) -> None:
        """A write set reads the base, keeps its own writes and deletes, and never writes back."""
        base = DictStore({"a": 1, "b": 2})
        writes = WriteSet(base)
        writes.put("a", 10)
        writes.delete("b")
        writes.put("c", {"x": 1})
        assert (writes.get("a"), writes.get("b"), writes.get("c")) == (10, None, {"x": 1})
        assert dict(base) == {"a": 1, "b": 2}
        assert writes.get("a") is writes.get("a")

    def test_journal_round_trip_applies_the_same_writes(self) -> None:
        """A journal read back applies exactly the writes, deletes and outputs it was made of."""
        table: dict[str, bytes] = {"gone": b"1", "kept": b"2"}
        backend = MemoryBackend(table)
        writes = WriteSet(TableStore(backend))
        writes.put("new", {"n": [1, 2.5, "x"]})
        writes.delete("gone")
        journal = Journal.of(writes, [Output("t", b"k", b'{"v":1}'), Output("d", None, b"{}")])
        again = Journal.decode(journal.encode())
        assert again == journal
        writes = key_writes(backend, again)
        assert writes == [("new", orjson.dumps({"n": [1, 2.5, "x"]})), ("gone", None)]

        async def apply() -> None:
            await (await backend.write_groups([writes], 0))

        asyncio.run(apply())
        assert table == {"kept": b"2", "new": orjson.dumps({"n": [1, 2.5, "x"]})}

    def test_read_view_applies_an_open_journal(self) -> None:
        """A read of a session whose last event was interrupted sees that event complete."""
        table: dict[str, bytes] = {"s/x": orjson.dumps(1)}
        backend = MemoryBackend(table)
        writes = WriteSet(TableStore(backend))
        writes.put("s/x", 2)
        table[journal_key("s")] = Journal.of(writes).encode()
        assert read_view(backend, "s").get("s/x") == 2
        assert orjson.loads(table["s/x"]) == 1


_writes = st.lists(
    st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=300)), min_size=1, max_size=4
)


class TestRecordBatches:
    @given(groups=st.lists(_writes, max_size=12), limit=st.integers(1, 2_000))
    def test_groups_are_packed_in_order_and_never_split(
        self, groups: list[list[Write]], limit: int
    ) -> None:
        """Every write once, in order; each group within one batch; a batch over the limit
        only when it is a single group."""
        batches = record_batches(groups, limit)
        assert [w for batch in batches for w in batch] == [w for group in groups for w in group]
        ends = set()
        position = 0
        for batch in batches:
            position += len(batch)
            ends.add(position)
        position = 0
        starts = {0}
        for group in groups:
            position += len(group)
            starts.add(position)
        assert ends <= starts  # a batch ends only where a group ends
        for batch in batches:
            size = sum(len(k.encode()) + len(v or b"") + RECORD_OVERHEAD for k, v in batch)
            assert size <= limit or any(batch == list(group) for group in groups)


class TestSteps:
    def test_unreadable_records_become_faults(self) -> None:
        """Garbage, newer schemas and records keyed by another session are refused by reason."""
        good = EntryEnvelope(
            session_id="s", seq=1, payload=EntryPayload(entry={"type": "session", "id": "s"})
        )
        newer = orjson.dumps({**good.model_dump(mode="json"), "schema_version": 99})
        cases = {
            b"{nope": "undecodable",
            newer: "newer-schema",
        }
        for value, reason in cases.items():
            fault = read_envelope(SourceRecord("t", 0, 0, b"s", value))
            assert isinstance(fault, Fault) and fault.reason == reason
            assert "nope" not in fault.error
        mismatch = read_envelope(SourceRecord("t", 0, 0, b"other", encode(good)))
        assert isinstance(mismatch, Fault) and mismatch.reason == "key-mismatch"
        assert decode(encode(good)) == read_envelope(SourceRecord("t", 0, 0, b"s", encode(good)))

    def test_fold_records_tool_result_offsets_once(self, fleet: tuple[list[Path], Any]) -> None:
        """Each toolResult entry's log position is recorded; a redelivery writes nothing."""
        paths, _ = fleet
        store = DictStore()
        envelopes = list(_records(paths[:1]))
        for offset, envelope in enumerate(envelopes):
            record = SourceRecord("t", 3, offset, envelope.session_id.encode(), encode(envelope))
            fold_record(store, record, DEFAULT_CONFIG)
        sid = envelopes[0].session_id
        positions = {k: v for k, v in store.items() if k.startswith(f"{sid}/rt/o/")}
        results = [
            e
            for e in envelopes
            if isinstance(e, EntryEnvelope)
            and (e.payload.entry.get("message") or {}).get("role") == "toolResult"
        ]
        assert len(positions) == len(results) > 0
        first = results[0]
        assert positions[f"{sid}/rt/o/{first.seq}"] == {"p": 3, "o": envelopes.index(first)}
        again = WriteSet(store)
        record = SourceRecord("t", 3, 0, first.session_id.encode(), encode(first))
        result = fold_record(again, record, DEFAULT_CONFIG)
        assert (result.fresh, again.puts, again.deletes) == (False, {}, set())

    def test_dead_letters_count_once_per_record(self) -> None:
        """A dead letter counts once, redelivered or dead-lettered twice by a crashed worker."""
        store = DictStore()
        own = orjson.dumps({"source": "se", "offset": 7, "reason": "undecodable"})
        publisher = orjson.dumps({"source": "/f.jsonl", "line": 3})
        counted = [
            count_dead_letter(store, SourceRecord("dl", 0, 0, b"s", publisher)),
            count_dead_letter(store, SourceRecord("dl", 0, 0, b"s", publisher)),  # redelivered
            count_dead_letter(store, SourceRecord("dl", 0, 1, b"s", own)),
            count_dead_letter(store, SourceRecord("dl", 0, 2, b"s", own)),  # sent twice
        ]
        assert counted == [True, False, True, False]
        assert store.get("s/rt/dl")["n"] == 2


class TestFoldRuntime:
    def test_equals_embedded_without_crashes(self, fleet: tuple[list[Path], Any]) -> None:
        """Folded through the runtime and the summarizer, every session equals the embedded run."""
        paths, expected = fleet
        cluster = Cluster(CrashingTable())
        _publish(cluster, paths)
        asyncio.run(cluster.run())
        _assert_embedded_states(cluster.table, expected)
        assert not any(k.endswith("/rt/j") for k in cluster.table)

    @pytest.mark.parametrize("every", [3, 7, 19])
    def test_crashes_at_any_write_change_nothing(
        self, fleet: tuple[list[Path], Any], every: int
    ) -> None:
        """Dying at any table write or send and redelivering gives the same state; each request
        is applied once, and every request gets its flush-metrics record."""
        paths, expected = fleet
        table = CrashingTable()
        table.crash_at = set(range(every, 200_000, every))
        cluster = Cluster(table)
        cluster.crash_sends = set(range(every // 2 + 1, 20_000, every))
        _publish(cluster, paths)
        asyncio.run(cluster.run())
        assert cluster.crashes > 10
        states = _assert_embedded_states(cluster.table, expected)
        recorded = _assert_requests_applied_once(cluster, states)
        on_topic = {
            orjson.loads(o.value)["payload"]["request_id"]
            for o in cluster.logs[TOPICS.flush_metrics]
        }
        assert on_topic == recorded

    @pytest.mark.parametrize("batch", [3, 40])
    def test_batches_equal_embedded_with_fewer_writes(
        self, fleet: tuple[list[Path], Any], batch: int
    ) -> None:
        """Records folded and committed in batches give the embedded run's state, and write
        each key once per batch: fewer table writes than one record at a time."""
        paths, expected = fleet
        single = Cluster(CrashingTable())
        _publish(single, paths)
        asyncio.run(single.run())
        cluster = BatchingCluster(CrashingTable(), batch)
        _publish(cluster, paths)
        asyncio.run(cluster.run())
        _assert_embedded_states(cluster.table, expected)
        assert not any(k.endswith("/rt/j") for k in cluster.table)
        assert cluster.table.writes < single.table.writes

    @pytest.mark.parametrize(("batch", "every"), [(3, 7), (8, 5), (40, 3), (40, 2)])
    def test_batches_survive_crashes_at_any_write(
        self, fleet: tuple[list[Path], Any], batch: int, every: int
    ) -> None:
        """Dying at any write or send of a batched commit, and redelivering the batch from the
        last commit, gives the embedded state; each request is applied and recorded once."""
        paths, expected = fleet
        table = CrashingTable()
        table.crash_at = set(range(every, 200_000, every))
        cluster = BatchingCluster(table, batch)
        cluster.crash_sends = set(range(every // 2 + 1, 20_000, every))
        _publish(cluster, paths)
        asyncio.run(cluster.run())
        assert cluster.crashes > 5
        states = _assert_embedded_states(cluster.table, expected)
        _assert_requests_applied_once(cluster, states)


class TestSlowSteps:
    def loop_ticks_during_fold(self, size: int) -> tuple[int, Any]:
        """Ticks of a 10 ms ticker while one record of `size` bytes is folded by a step that
        takes 0.5 s (a hook sleeping in it), and the session's pruning head after it."""
        backend = MemoryBackend()
        runtime = FoldRuntime(
            backend,
            Cluster(CrashingTable()).send,
            TOPICS,
            DEFAULT_CONFIG,
            create(CollectorRegistry()),
            SessionTracker(backend, DEFAULT_CONFIG, 1),
        )
        runtime.step_hook = lambda record: time.sleep(0.5)
        entry = {"type": "session", "version": 3, "id": "s", "cwd": "/" + "x" * size}
        envelope = EntryEnvelope(session_id="s", seq=1, payload=EntryPayload(entry=entry))
        record = SourceRecord(TOPICS.session_events, 0, 0, b"s", encode(envelope))
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        async def run() -> None:
            ticking = asyncio.ensure_future(ticker())
            await asyncio.sleep(0)
            await runtime.fold(record)
            ticking.cancel()
            await (await runtime.commit())

        asyncio.run(run())
        return ticks, orjson.loads(backend.data["s/pr/h"])

    def test_a_large_records_slow_step_leaves_the_event_loop_free(self) -> None:
        """A record past OFFLOAD_BYTES is folded in a thread: the loop (heartbeat callbacks,
        producer, web server) runs on during its slow step, and the record is folded."""
        ticks, state = self.loop_ticks_during_fold(OFFLOAD_BYTES)
        assert ticks >= 5
        assert state["seq"] == 1

    def test_a_small_records_step_stays_on_the_loop(self) -> None:
        """A small record is folded inline (a thread hop would cost more than its fold)."""
        ticks, state = self.loop_ticks_during_fold(10)
        assert ticks <= 1
        assert state["seq"] == 1


class LaggingBackend(DictBackend):
    """A changelog whose writes are durable only once acknowledged.

    The worker reads and writes `live` (its memory); `settle` acknowledges every write so far
    into `durable`; `lose` is a crash: memory is rebuilt from what was durable, while records
    already sent to other topics stay there (the broker may acknowledge a flush request before
    the changelog writes of the event that raised it).
    """

    def __init__(self) -> None:
        super().__init__()
        self.durable: dict[str, bytes] = {}
        self.unacked: list[tuple[list[Write], asyncio.Future[Any]]] = []

    def written(self, key: str, value: bytes | None) -> asyncio.Future[Any]:
        return self.written_groups([(key, value)])

    def written_groups(self, writes: list[Write]) -> asyncio.Future[Any]:
        done = asyncio.get_running_loop().create_future()
        self.unacked.append((writes, done))
        return done

    def settle(self) -> None:
        for writes, done in self.unacked:
            for key, value in writes:
                if value is None:
                    self.durable.pop(key, None)
                else:
                    self.durable[key] = value
            done.set_result(None)
        self.unacked.clear()

    def lose(self) -> None:
        self.unacked.clear()  # never acknowledged: nobody waits for them any more
        self.live = dict(self.durable)


class LossyCluster(Cluster):
    """Folds records in batches of `settle_every` (as the fold agent does) and commits each once
    its writes are acknowledged; every `lose_every`-th record (and, with `lose_asking`, every
    record that first asks a ledger pass) ends its batch with a crash: the batch's outputs are
    sent, its changelog writes lost, and the consumers go back to their commits. The two fold
    inputs are read in turns, so a compaction can overtake the session event whose lost writes
    asked for it."""

    def __init__(self, lose_every: int, settle_every: int = 3, lose_asking: bool = False) -> None:
        super().__init__(CrashingTable())
        self.lagging = LaggingBackend()
        metrics = create(CollectorRegistry())
        tracker = SessionTracker(self.lagging, DEFAULT_CONFIG, 1)
        self.fold = FoldRuntime(self.lagging, self.send, TOPICS, DEFAULT_CONFIG, metrics, tracker)
        self.lose_every = lose_every
        self.settle_every = settle_every
        self.lose_asking = lose_asking  # also crash after each record that first asks a pass
        self.asked: set[bytes] = set()

    async def run(self) -> None:
        fold_inputs = (TOPICS.session_events, TOPICS.compaction_events)
        committed = dict.fromkeys((*fold_inputs, TOPICS.flush_requests), 0)
        read = dict(committed)
        acks: list[Any] = []
        folded = 0
        for round_ in range(1_000_000):
            progressed = False
            for topic in fold_inputs if round_ % 2 else fold_inputs[::-1]:
                if read[topic] < len(self.logs[topic]):
                    output = self.logs[topic][read[topic]]
                    record = SourceRecord(topic, 0, read[topic], output.key, output.value)
                    sent = len(self.logs[TOPICS.flush_requests])
                    await self.fold.fold(record)
                    if self.lose_asking:
                        acks.append(await self.fold.commit())  # the request goes out now
                    read[topic] += 1
                    folded += 1
                    progressed = True
                    asked = {
                        o.value
                        for o in self.logs[TOPICS.flush_requests][sent:]
                        if b'"producer":"sessionfold-ledger"' in o.value
                    } - self.asked
                    self.asked |= asked
                    if folded % self.lose_every == 0 or (self.lose_asking and asked):
                        await self.fold.commit()  # outputs sent; the writes never acknowledged
                        self.lagging.lose()
                        self.crashes += 1
                        acks.clear()
                        read = {**read, **{t: committed[t] for t in fold_inputs}}
                    elif folded % self.settle_every == 0:
                        acks.append(await self.fold.commit())
                        self.lagging.settle()
                        for ack in acks:
                            await ack
                        acks.clear()
                        committed.update({t: read[t] for t in fold_inputs})
            if read[TOPICS.flush_requests] < len(self.logs[TOPICS.flush_requests]):
                answered = await self.answer(read[TOPICS.flush_requests])
                assert answered  # this cluster's summarizer never crashes
                read[TOPICS.flush_requests] += 1
                progressed = True
            if not progressed:
                # A quiet stream: the open batch is committed (its requests may need answers).
                acks.append(await self.fold.commit())
                self.lagging.settle()
                for ack in acks:
                    await ack
                acks.clear()
                committed.update({t: read[t] for t in fold_inputs})
                if read[TOPICS.flush_requests] == len(self.logs[TOPICS.flush_requests]):
                    return


@pytest.mark.parametrize("lose_every", [5, 17, 61])
@pytest.mark.parametrize("lose_asking", [False, True])
def test_lost_changelog_writes_change_nothing(
    shared_sessions: Path, lose_every: int, lose_asking: bool
) -> None:
    """Changelog writes lost in a crash while the requests they raised got out (pruning flushes
    and ledger passes alike): redelivery still ends in the embedded runtime's state, ledger
    included."""
    paths = [shared_sessions / "before-compaction.jsonl"]
    expected = fold_files(paths)["sessions"]
    cluster = LossyCluster(lose_every, lose_asking=lose_asking)
    _publish(cluster, paths)
    asyncio.run(cluster.run())
    assert cluster.crashes > 10
    assert all(state["ledger"]["span"] == 2 for state in expected.values())
    _assert_embedded_states(cluster.lagging.durable, expected)


class RestartingCluster(Cluster):
    """Consumers whose committed positions survive a restart of the fold, and a summarizer that
    can be kept down; each record is committed once folded (or answered)."""

    def __init__(self) -> None:
        super().__init__(CrashingTable())
        names = (TOPICS.session_events, TOPICS.compaction_events, TOPICS.flush_requests)
        self.committed = dict.fromkeys(names, 0)

    async def drain(self, answer: bool = True) -> None:
        """Fold (and, with `answer`, answer requests) until nothing is left to read."""
        fold_inputs = (TOPICS.session_events, TOPICS.compaction_events)
        progressed = True
        while progressed:
            progressed = False
            for topic in fold_inputs:
                position = self.committed[topic]
                if position < len(self.logs[topic]):
                    output = self.logs[topic][position]
                    record = SourceRecord(topic, 0, position, output.key, output.value)
                    await (await self.fold.handle(record))
                    self.committed[topic] += 1
                    progressed = True
            requests = self.committed[TOPICS.flush_requests]
            if answer and requests < len(self.logs[TOPICS.flush_requests]):
                assert await self.answer(requests)
                self.committed[TOPICS.flush_requests] += 1
                progressed = True

    async def restart(self) -> int:
        """A new fold worker over the recovered table, as the recovery callback runs it."""
        self.fold = self.new_fold()
        return await self.fold.resend_outstanding(1, {0})

    def waiting(self, session_id: str) -> dict[str, Any]:
        """The ids the session's pruning and ledger folds wait on."""
        view = read_view(MemoryBackend(self.table), session_id)
        return {fold: awaited_request(view, session_id, fold) for fold in ("pr", "ledger")}


def _answers_by_request(cluster: Cluster) -> Counter[str]:
    answers: Counter[str] = Counter()
    for output in cluster.logs[TOPICS.compaction_events]:
        payload = orjson.loads(output.value)["payload"]
        answers[payload.get("request_id") or payload.get("request")] += 1
    return answers


class TestStuckRequests:
    def test_a_session_whose_changelog_went_back_to_a_consumed_request_is_freed(
        self, shared_sessions: Path
    ) -> None:
        """The changelog ends with the session waiting on requests whose answers were consumed
        and committed (an older state written back after them): after a restart the requests
        go out again with their ids, and the session ends as the embedded runtime folds it."""
        paths = [shared_sessions / "before-compaction.jsonl"]
        expected = fold_files(paths)["sessions"]
        (session_id,) = expected
        cluster = RestartingCluster()
        _publish(cluster, paths)
        asyncio.run(cluster.drain(answer=False))  # the summarizer is down: the barriers stay up
        waiting = cluster.waiting(session_id)
        assert all(waiting.values()), waiting
        stuck = dict(cluster.table)
        asyncio.run(cluster.drain())
        _assert_embedded_states(cluster.table, expected)
        answered = _answers_by_request(cluster)
        assert all(answered[rid] == 1 for rid in waiting.values())
        # Every key back to its value at the stuck point, as a late batch's writes would leave it.
        dict.clear(cluster.table)
        dict.update(cluster.table, stuck)
        resent = asyncio.run(cluster.restart())
        asyncio.run(cluster.drain())
        states = _assert_embedded_states(cluster.table, expected)
        assert resent == 2  # the pruning flush and the ledger pass
        assert cluster.waiting(session_id) == {"pr": None, "ledger": None}
        assert all(_answers_by_request(cluster)[rid] == 2 for rid in waiting.values())
        recorded = Counter(a["request_id"] for a in states[session_id]["flush_attempts"])
        assert max(recorded.values()) == 1
        assert not any("/rt/rq/" in k for k in cluster.table)

    def test_a_request_sent_again_while_its_answer_is_due_changes_nothing(
        self, fleet: tuple[list[Path], Any]
    ) -> None:
        """A restart while requests wait for their first answer sends them again: both answers
        arrive, the first applied is the one that counts, and every session ends as embedded
        with each request applied once."""
        paths, expected = fleet
        cluster = RestartingCluster()
        _publish(cluster, paths)
        asyncio.run(cluster.drain(answer=False))
        resent = asyncio.run(cluster.restart())
        assert resent >= len(expected)
        asyncio.run(cluster.drain())
        states = _assert_embedded_states(cluster.table, expected)
        _assert_requests_applied_once(cluster, states)
        assert max(_answers_by_request(cluster).values()) == 2
        assert asyncio.run(cluster.restart()) == 0
