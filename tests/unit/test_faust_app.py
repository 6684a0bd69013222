"""The Faust app factory's pieces that need no broker: settings, the offset guard, metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import rocksdict
from faust.types import TP
from faust_fakes import Acked, FakeTable, unstarted_app
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import ValidationError

from sessionfold.streams.kafka import changelog
from sessionfold.streams.kafka.fence import FENCE_HEADER, Fence
from sessionfold.streams.kafka.table_store import Write
from sessionfold.streams.worker import app as faust_app
from sessionfold.streams.worker.app import (
    ContiguousOffsets,
    FaustBackend,
    FoldBatcher,
    OrderedAcks,
    StallGuard,
    StateTable,
    Stopwatch,
    WorkerSettings,
    faust_options,
    shorten_fetch_wait,
)
from sessionfold.streams.worker.prometheus import FleetCollector, FleetSnapshot, create

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _is_position(key: Any) -> bool:
    """Whether a table key is a session's changelog position row (kafka/changelog.py)."""
    text = key.decode() if isinstance(key, bytes) else str(key)
    return "/rt/c/" in text


def _rows(data: Any) -> dict[Any, Any]:
    """A store's rows but the changelog position rows."""
    return {k: v for k, v in dict(data).items() if not _is_position(k)}


def _journal(value: bytes) -> list[Write]:
    """A journal record's writes but its position row."""
    record = changelog.decode_record(value)
    assert record is not None
    return [(k, v) for k, v in record.writes if not _is_position(k)]


class FakeConsumer:
    def __init__(self, committed: dict[TP, int]) -> None:
        self._committed_offset = committed
        self.seeks: list[tuple[TP, int]] = []

    async def seek(self, tp: TP, offset: int) -> None:
        self.seeks.append((tp, offset))


class FakeApp:
    def __init__(self, consumer: FakeConsumer) -> None:
        self.consumer = consumer
        self.consumer_generation_id = 1


class Message:
    def __init__(self, tp: TP, offset: int) -> None:
        self.tp = tp
        self.offset = offset


TP0 = TP("t.session-events", 0)


class TestSettings:
    def test_roles_get_their_own_groups(self) -> None:
        """Fold and all share the app id and changelog; summarizers get a group of their own."""
        fold = WorkerSettings(topic_prefix="p.", role="fold")
        assert fold.faust_id == WorkerSettings(topic_prefix="p.", role="all").faust_id == "p.worker"
        assert WorkerSettings(topic_prefix="p.", role="summarize").faust_id == "p.worker-summarize"

    def test_faust_options_follow_the_reference(self, tmp_path: Path) -> None:
        """Short timeouts, no standbys, no leader topic, and partitions as given."""
        settings = WorkerSettings(
            bootstrap="h1:1,h2:2", partitions=3, web_bind="127.0.0.1", data_dir=tmp_path
        )
        options = faust_options(settings)
        assert options["broker"] == "kafka://h1:1;kafka://h2:2"
        assert options["topic_partitions"] == 3
        assert (options["table_standby_replicas"], options["topic_disable_leader"]) == (0, True)
        assert options["broker_session_timeout"] <= options["broker_request_timeout"]
        assert options["canonical_url"] == "http://127.0.0.1:6066"
        assert options["datadir"] == str(tmp_path / "sessionfold.worker")

    def test_unknown_store_is_refused(self) -> None:
        """Only memory:// and rocksdb:// tables exist."""
        with pytest.raises(ValidationError):
            WorkerSettings(store="redis://x")


class NamedEvent:
    def __init__(self, name: str, acked: list[str]) -> None:
        self.name = name
        self.acked = acked

    def ack(self) -> None:
        self.acked.append(self.name)


class TestOrderedAcks:
    def test_records_are_acked_in_read_order(self) -> None:
        """A record whose writes the broker confirms first still waits for the one read before
        it: Faust commits past any unacknowledged record, so acks must not overtake."""
        acked: list[str] = []

        async def run() -> None:
            loop = asyncio.get_running_loop()
            first, second = loop.create_future(), loop.create_future()
            acks = OrderedAcks()
            acks.add([NamedEvent("a1", acked), NamedEvent("a2", acked)], first)
            acks.add(NamedEvent("b", acked), second)
            second.set_result(None)
            await asyncio.sleep(0.01)
            assert acked == []
            first.set_result(None)
            await asyncio.sleep(0.01)

        asyncio.run(run())
        assert acked == ["a1", "a2", "b"]

    def test_a_refused_write_stops_every_later_ack(self) -> None:
        """A write the broker refused leaves its records and every later one unacknowledged."""
        acked: list[str] = []

        async def run() -> None:
            loop = asyncio.get_running_loop()
            first, second = loop.create_future(), loop.create_future()
            acks = OrderedAcks()
            acks.add(NamedEvent("a", acked), first)
            acks.add(NamedEvent("b", acked), second)
            first.set_exception(RuntimeError("refused"))
            second.set_result(None)
            await asyncio.sleep(0.01)

        asyncio.run(run())
        assert acked == []

    def test_records_read_before_a_rebalance_are_not_acked(self) -> None:
        """A batch whose turn comes in a later generation than it was read in is handed back
        unacked (Faust would count the ack in the new generation); one of the same generation,
        and one of no generation, is acked."""
        acked: list[str] = []
        stale: list[str] = []
        generation = [3]

        async def clear(read_in: int) -> bool:
            return read_in == generation[0]

        async def run() -> None:
            loop = asyncio.get_running_loop()
            first, second = loop.create_future(), loop.create_future()
            acks = OrderedAcks(clear, lambda e: stale.extend(x.name for x in e))
            acks.add(NamedEvent("old", acked), first, generation=3)
            acks.add(NamedEvent("untold", acked), second)
            generation[0] = 4  # a rebalance before the broker confirmed the writes
            first.set_result(None)
            second.set_result(None)
            await asyncio.sleep(0.01)
            done = loop.create_future()
            acks.add(NamedEvent("new", acked), done, generation=4)
            done.set_result(None)
            await asyncio.sleep(0.01)

        asyncio.run(run())
        assert (acked, stale) == (["untold", "new"], ["old"])


class TestContiguousOffsets:
    def test_a_skipped_record_is_read_again(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A jump in offsets refuses the record after the hole and seeks back until it is filled."""
        monkeypatch.setattr(faust_app, "RETRY_SEEK_S", 0.0)
        consumer = FakeConsumer({TP0: 19})
        offsets = ContiguousOffsets(FakeApp(consumer))  # type: ignore[arg-type]

        async def run() -> list[Any]:
            seen = [await offsets.admit(Message(TP0, 19))]
            seen.append(await offsets.admit(Message(TP0, 23)))  # 20..22 skipped by the consumer
            seen.append(await offsets.admit(Message(TP0, 24)))  # stale: no second seek
            await offsets.retry()  # the re-read did not come: seek again
            seen += [await offsets.admit(Message(TP0, n)) for n in (20, 21, 22, 23)]
            return seen

        assert asyncio.run(run()) == [True, False, False, True, True, True, True]
        assert consumer.seeks == [(TP0, 20), (TP0, 20)]
        assert consumer._add_gap.__name__ == "_keep_gap"  # type: ignore[attr-defined]

    def test_the_first_record_after_a_rebalance_starts_at_the_commit(self) -> None:
        """After a rebalance the committed offset is expected next; redeliveries pass."""
        consumer = FakeConsumer({TP0: 5})
        app = FakeApp(consumer)
        offsets = ContiguousOffsets(app)  # type: ignore[arg-type]

        async def run() -> list[bool]:
            seen = [await offsets.admit(Message(TP0, 6))]  # 5 is missing
            app.consumer_generation_id = 2
            consumer._committed_offset[TP0] = 3
            seen += [await offsets.admit(Message(TP0, n)) for n in (3, 4, 3)]
            return seen

        assert asyncio.run(run()) == [False, True, True, True]
        assert consumer.seeks == [(TP0, 5)]

    def test_a_partition_faust_holds_no_commit_for_starts_where_the_group_reads_it(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With no committed offset in Faust's books (never committed, or at 0), the first record
        expected is where the group's reading starts (faust_compat.start_offset), asked once:
        records Faust dropped before the first commit are read again, not committed past (a
        frozen-worker run lost a session's first 85 events so)."""
        asked: list[TP] = []

        async def start_offset(_consumer: Any, tp: TP) -> int:
            asked.append(tp)
            return 0

        monkeypatch.setattr(faust_app.faust_compat, "start_offset", start_offset)
        consumer = FakeConsumer({})
        offsets = ContiguousOffsets(FakeApp(consumer))  # type: ignore[arg-type]

        async def run() -> list[bool]:
            return [await offsets.admit(Message(TP0, n)) for n in (85, 86, 0, 1)]

        assert asyncio.run(run()) == [False, False, True, True]
        assert consumer.seeks == [(TP0, 0)]
        assert asked == [TP0]

    def test_a_start_the_broker_cannot_tell_lets_the_record_through(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A lookup that fails (a rebalance, no answer) leaves the record to Faust, as before."""

        async def start_offset(_consumer: Any, _tp: TP) -> int:
            raise TimeoutError

        monkeypatch.setattr(faust_app.faust_compat, "start_offset", start_offset)
        consumer = FakeConsumer({})
        offsets = ContiguousOffsets(FakeApp(consumer))  # type: ignore[arg-type]
        assert asyncio.run(offsets.admit(Message(TP0, 85)))
        assert consumer.seeks == []

    def test_exactly_once_lets_everything_through(self) -> None:
        """Under exactly_once, transaction markers make real gaps: nothing is refused."""
        consumer = FakeConsumer({TP0: 0})
        offsets = ContiguousOffsets(FakeApp(consumer), repair=False)  # type: ignore[arg-type]
        assert asyncio.run(offsets.admit(Message(TP0, 9)))
        assert consumer.seeks == []


class TestMetrics:
    def test_every_metric_is_documented(self) -> None:
        """docs/metrics.md names every metric the registry exposes, with the sessionfold_ prefix."""
        registry = CollectorRegistry()
        metrics = create(registry)
        metrics.worker_info.labels(role="fold").set(1)
        snapshot = FleetSnapshot(2, 3, 0, 1, [10, 5000])
        registry.register(FleetCollector(lambda: snapshot, lambda: {"fold": 4}))
        text = generate_latest(registry).decode()
        names = {
            f"{family.name}_total" if family.type == "counter" else family.name
            for family in registry.collect()
        }
        documented = DOCS.read_text()
        assert all(n.startswith("sessionfold_") for n in names)
        missing = sorted(n for n in names if f"`{n}`" not in documented)
        assert missing == []
        assert 'sessionfold_frontier_gap_tokens_bucket{le="1000.0"} 1.0' in text
        assert 'sessionfold_consumer_lag_records{role="fold"} 4.0' in text

    def test_the_fold_agents_laps_go_to_their_kinds(self) -> None:
        """Each lap adds the time since the one before (or the start) to its own kind only."""
        registry = CollectorRegistry()
        metrics = create(registry)
        now = iter([10.0, 10.5, 10.75, 12.0, 12.25, 13.0])
        watch = Stopwatch(metrics.fold_agent_seconds, clock=lambda: next(now))
        for kind in ("awaiting_records", "awaiting_commit", "folding", "awaiting_records"):
            watch.lap(kind)

        def seconds(kind: str) -> float | None:
            name = "sessionfold_fold_agent_seconds_total"
            return registry.get_sample_value(name, {"kind": kind})

        assert (seconds("awaiting_records"), seconds("awaiting_commit")) == (0.75, 0.25)
        assert seconds("folding") == 1.25
        with pytest.raises(KeyError):
            watch.lap("resting")  # only the three kinds: a typo is no new label

    def test_no_session_labels(self) -> None:
        """Labels are bounded: kind, trigger, outcome, role only."""
        registry = CollectorRegistry()
        create(registry)
        registry.register(FleetCollector(lambda: FleetSnapshot(), lambda: {}))
        labels = set()
        for family in registry.collect():
            for sample in family.samples:
                labels.update(sample.labels)
        assert labels <= {"kind", "trigger", "outcome", "role", "le"}


class TestFaustBackend:
    def test_direct_writes_go_to_the_changelog_and_persist_their_offset(self) -> None:
        """A write sets the store and sends one journal record to the changelog partition, keyed
        by the session's next slot in its ring; once acknowledged its offset is the store's
        persisted offset; None deletes."""

        async def run() -> tuple[FakeTable, list[Any]]:
            table = FakeTable()
            backend = FaustBackend(table, direct=True)  # type: ignore[arg-type]
            first = await backend.write("s/pr/h", b"1", 2)
            second = await backend.write("s/pr/h", None, 2)
            producer = table.app.producer
            producer.pending[0].set_result(Acked("app-state-cl", 2, 7))
            producer.pending[1].set_result(Acked("app-state-cl", 2, 8))
            await asyncio.gather(first, second)
            return table, producer.sent

        table, sent = asyncio.run(run())
        assert [(t, k, _journal(v), p) for t, k, v, p in sent] == [
            ("app-state-cl", b"s/rt/c/2/0", [("s/pr/h", b"1")], 2),
            ("app-state-cl", b"s/rt/c/2/1", [("s/pr/h", None)], 2),
        ]
        assert _rows(table.data) == {}
        assert table.data.persisted == {TP("app-state-cl", 2): 8}

    def test_every_write_carries_its_fence_epoch(self) -> None:
        """The epoch of the generation its records were read in, or past what was recovered."""

        async def run() -> list[Any]:
            table = FakeTable()
            fence = Fence()
            backend = FaustBackend(table, direct=True, fence=fence)  # type: ignore[arg-type]
            await backend.write("s/pr/h", b"1", 2, generation=4)
            fence.admits(3, 0, 57)  # partition 3's changelog was recovered up to epoch 57
            await backend.write("t/pr/h", b"1", 3, generation=5)
            groups = [[("u/rt/j", b"[]"), ("u/pr/h", b"1")], [("v/pr/h", b"1")]]
            await backend.write_groups(groups, 3, generation=60)
            producer = table.app.producer
            return [*producer.headers, *producer._producer.headers]

        stamp = [(FENCE_HEADER, b"60")]
        assert asyncio.run(run()) == [
            [(FENCE_HEADER, b"4")],
            [(FENCE_HEADER, b"58")],
            [stamp, stamp],  # the record batch: every record
        ]

    def test_groups_go_to_the_changelog_as_one_record_batch(self) -> None:
        """A partition's groups are one journal record each, sent in one record batch, in
        order; the store has them at once, and once the batch is acknowledged its last
        record's offset is the persisted offset."""

        async def run() -> tuple[FakeTable, Any, bool]:
            table = FakeTable()
            table.data["t/gone"] = b"0"
            backend = FaustBackend(table, direct=True)  # type: ignore[arg-type]
            groups = [[("s/rt/j", b"[]"), ("s/pr/h", b"1")], [("t/gone", None)]]
            ack = await backend.write_groups(groups, 2)
            waited = ack.done()
            table.app.producer.pending[0].set_result(Acked("app-state-cl", 2, 7))
            await ack
            return table, table.app.producer._producer.batches, waited

        table, batches, waited = asyncio.run(run())
        assert [(t, p, [(k, _journal(v)) for k, v in records]) for t, p, records in batches] == [
            (
                "app-state-cl",
                2,
                [
                    (b"s/rt/c/2/0", [("s/rt/j", b"[]"), ("s/pr/h", b"1")]),
                    (b"t/rt/c/2/0", [("t/gone", None)]),
                ],
            )
        ]
        assert not waited
        assert _rows(table.data) == {"s/rt/j": b"[]", "s/pr/h": b"1"}
        assert table.data.persisted == {TP("app-state-cl", 2): 8}
        assert table.app.producer.sent == []  # no record went one at a time

    @pytest.mark.parametrize("local", [False, True])
    @pytest.mark.parametrize("groups", [[[("s/pr/h", b"1")]], [[("s/pr/h", b"1"), ("s/h", b"2")]]])
    def test_a_send_cancelled_while_it_waits_leaves_the_store_as_it_was(
        self, tmp_path: Path, local: bool, groups: list[list[Write]]
    ) -> None:
        """A commit cancelled (its agent stopped) while the producer makes it wait: nothing of
        it is read back, so redelivered events are folded again rather than skipped as folded
        with their writes and outputs never sent."""

        async def run() -> tuple[Any, Any]:
            if local:
                store = FakeRocksStore(tmp_path, (0,))
                table: Any = FakeLocalTable(store)
                backend: Any = faust_app.LocalBackend(table)
            else:
                table = FakeTable()
                backend = FaustBackend(table, direct=True)  # type: ignore[arg-type]
            table.app.producer.full = asyncio.Event()
            table.app.producer.full.set()
            task = asyncio.ensure_future(backend.write_groups(groups, 0))
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            seen = (backend.get("s/pr/h"), backend.keys() if local else table.data)
            if local:
                store.close()
            return seen

        read, keys = asyncio.run(run())
        assert read is None
        assert not set(keys)

    def test_groups_too_large_for_one_record_batch_are_split_between_groups(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Packed in order, one record never split: each group's journal lands whole."""
        monkeypatch.setattr(faust_app, "BATCH_RECORD_BYTES", 700)
        groups = [[(f"s{n}/pr/h", b"x" * 200), (f"s{n}/h", b"y" * 50)] for n in range(3)]

        async def run() -> Any:
            table = FakeTable()
            backend = FaustBackend(table, direct=True)  # type: ignore[arg-type]
            ack = await backend.write_groups(groups, 0)
            for n, future in enumerate(table.app.producer.pending):
                future.set_result(Acked("app-state-cl", 0, 10 * n))
            await ack
            producer = table.app.producer
            alone = [[(key, value)] for _t, key, value, _p in producer.sent]
            return alone + [records for _t, _p, records in producer._producer.batches]

        batches = asyncio.run(run())
        sent = [[_journal(value) for _key, value in records] for records in batches]
        assert sorted(journal for batch in sent for journal in batch) == groups
        assert len(sent) > 1

    def test_a_group_larger_than_a_record_goes_in_parts_under_the_limit(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A session's group over the record limit is several journal records, each under the
        limit; recovery applies them only once it has read every part."""
        monkeypatch.setattr(faust_app, "BATCH_RECORD_BYTES", 1_000)
        group = [(f"s/pr/m/{n}", bytes([65 + n]) * 300) for n in range(10)]

        async def run() -> list[tuple[bytes, bytes]]:
            table = FakeTable()
            backend = FaustBackend(table, direct=True)  # type: ignore[arg-type]
            ack = await backend.write_groups([group], 0)
            for n, future in enumerate(table.app.producer.pending):
                future.set_result(Acked("app-state-cl", 0, 10 * n))
            await ack
            assert _rows(table.data) == dict(group)
            sent = [(r[1], r[2]) for r in table.app.producer.sent]
            sent += [r for _t, _p, records in table.app.producer._producer.batches for r in records]
            return sent

        records = asyncio.run(run())
        assert len(records) > 1
        assert all(len(key) + len(value) <= 1_000 for key, value in records)
        reader = changelog.Reader()
        applied = [reader.writes(k.decode(), v, 0) for k, v in records]
        assert all(writes == [] for writes in applied[:-1])  # nothing before the last part
        assert [w for w in applied[-1] or [] if not _is_position(w[0])] == group
        cut = changelog.Reader()  # the last part never came: nothing is applied
        assert all(cut.writes(k.decode(), v, 0) == [] for k, v in records[:-1])

    def test_exactly_once_sends_a_journal_record_per_group_through_the_table(self) -> None:
        """Under exactly_once a group is one journal record through `send_changelog` (Faust's
        transaction), and the store has its rows at once."""

        async def run() -> tuple[FakeTable, list[Any]]:
            table = FakeTable()
            calls: list[Any] = []

            def send_changelog(partition: int, key: str, value: bytes) -> asyncio.Future[None]:
                calls.append((partition, key, value))
                done = asyncio.get_running_loop().create_future()
                done.set_result(None)
                return done

            table.send_changelog = send_changelog  # type: ignore[attr-defined]
            table.app.producer.buffer = type("Buffer", (), {"max_messages": 100})()
            backend = FaustBackend(table)  # type: ignore[arg-type]
            groups = [[("s/rt/j", b"[]"), ("s/pr/h", b"1")], [("t/pr/h", b"2")]]
            await (await backend.write_groups(groups, 1))
            return table, calls

        table, calls = asyncio.run(run())
        assert [(p, k, _journal(v)) for p, k, v in calls] == [
            (1, "s/rt/c/1/0", [("s/rt/j", b"[]"), ("s/pr/h", b"1")]),
            (1, "t/rt/c/1/0", [("t/pr/h", b"2")]),
        ]
        assert _rows(table.data) == {"s/rt/j": b"[]", "s/pr/h": b"1", "t/pr/h": b"2"}

    def test_a_batch_read_before_a_rejoin_writes_the_changelog_only(self) -> None:
        """Emptied at generation 6, the store takes no write of a batch read at generation 3 (a
        commit still handing its writes over), while the changelog still gets it; writes of
        generation 6, and of no generation (tools), go into the store."""

        async def run() -> tuple[list[Any], dict[str, Any]]:
            table = FakeTable()
            backend = FaustBackend(table, direct=True)  # type: ignore[arg-type]
            backend.forget(6)
            await backend.write("old/pr/h", b"3", 0, generation=3)
            await backend.write("s/pr/h", b"6", 0, generation=6)
            await backend.write("t/pr/h", b"0", 0)
            return [_journal(sent[2]) for sent in table.app.producer.sent], _rows(table.data)

        sent, held = asyncio.run(run())
        assert sent == [[("old/pr/h", b"3")], [("s/pr/h", b"6")], [("t/pr/h", b"0")]]
        assert held == {"s/pr/h": b"6", "t/pr/h": b"0"}


class TestStateTable:
    def test_a_worker_that_missed_generations_reads_its_state_again(self, tmp_path: Path) -> None:
        """From one generation to the next the store stays and recovery resumes; after a gap
        (the group went on without this worker) the store is emptied and the changelog read
        from the start."""
        app = unstarted_app(tmp_path)
        table = app.tables.add(StateTable(app, name="state", key_type=str, value_type=bytes))
        backend = FaustBackend(table)
        table.on_rejoined = backend.forget
        changelog = TP(table.changelog_topic.get_topic_name(), 0)

        async def rebalance(generation: int) -> tuple[bytes | None, Any]:
            backend.table.data["s/pr/h"] = b"1"
            app.tables.recovery.active_offsets[changelog] = 40
            await table.on_rebalance(set(), set(), set(), generation)
            return backend.get("s/pr/h"), app.tables.recovery.active_offsets.get(changelog)

        async def run() -> list[Any]:
            return [await rebalance(g) for g in (3, 4, 6)]

        assert asyncio.run(run()) == [(b"1", 40), (b"1", 40), (None, None)]


class FakeRuntime:
    def __init__(self) -> None:
        self.folded: list[int] = []
        self.commits: list[list[int]] = []
        self.batch_full = False

    async def fold(self, record: Any) -> None:
        self.folded.append(record.offset)

    def discard(self) -> None:
        self.folded = []

    async def commit(self) -> Any:
        self.commits.append(self.folded)
        self.folded = []
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class Event:
    def __init__(self, offset: int) -> None:
        self.message = type(
            "Message",
            (),
            {"topic": "t", "partition": 0, "offset": offset, "key": b"s", "value": b"{}"},
        )()
        self.acked = False

    def ack(self) -> None:
        self.acked = True


class TestFoldBatcher:
    def test_batches_end_when_full_or_when_no_record_follows(self) -> None:
        """Records arriving back to back share a batch up to the limit; a pause longer than
        the linger commits what is folded; every record is acked after its batch's commit."""

        async def run() -> tuple[FakeRuntime, list[Event]]:
            runtime = FakeRuntime()
            batcher = FoldBatcher(runtime, limit=3, linger_s=0.05)  # type: ignore[arg-type]
            events = [Event(offset) for offset in range(5)]
            for event in events:
                await batcher.before()
                await batcher.add(event)
                batcher.after()
            await asyncio.sleep(0.2)  # no record follows: the last batch is committed
            await batcher.before()
            await asyncio.sleep(0)
            return runtime, events

        runtime, events = asyncio.run(run())
        assert runtime.commits == [[0, 1, 2], [3, 4]]
        assert all(event.acked for event in events)

    def test_an_abandoned_batch_is_read_again(self) -> None:
        """A batch the agent stops with is dropped unwritten and its records handed back to be
        read again, never acked (Faust would commit past them once a later one is)."""
        abandoned: list[int] = []

        async def run() -> tuple[FakeRuntime, list[Event]]:
            runtime = FakeRuntime()
            batcher = FoldBatcher(
                runtime,  # type: ignore[arg-type]
                limit=10,
                linger_s=5.0,
                on_abandon=lambda events: abandoned.extend(e.message.offset for e in events),
            )
            events = [Event(offset) for offset in range(3)]
            for event in events:
                await batcher.before()
                await batcher.add(event)
                batcher.after()
            batcher.close()
            return runtime, events

        runtime, events = asyncio.run(run())
        assert abandoned == [0, 1, 2]
        assert runtime.commits == [] and runtime.folded == []
        assert not any(event.acked for event in events)

    def test_records_given_back_are_expected_again(self) -> None:
        """Records handed back make the next record look like a hole: the consumer is sent
        back to the first of them."""
        consumer = FakeConsumer({TP0: 0})
        offsets = ContiguousOffsets(FakeApp(consumer))  # type: ignore[arg-type]

        async def run() -> list[bool]:
            seen = [await offsets.admit(Message(TP0, n)) for n in (0, 1, 2)]
            offsets.reread([type("E", (), {"message": Message(TP0, 1)})()])
            seen.append(await offsets.admit(Message(TP0, 3)))
            return seen

        assert asyncio.run(run()) == [True, True, True, False]
        assert consumer.seeks == [(TP0, 1)]

    def test_records_given_back_no_longer_hold_a_revocation(self) -> None:
        """Records handed back leave Faust's unacked set (a revocation waits for it to empty)
        without being acked."""
        consumer = FakeConsumer({TP0: 0})
        kept, given_back = Message(TP0, 0), Message(TP0, 1)
        consumer.unacked = {kept, given_back}  # type: ignore[attr-defined]
        offsets = ContiguousOffsets(FakeApp(consumer))  # type: ignore[arg-type]
        offsets.reread([type("E", (), {"message": given_back})()])
        assert consumer.unacked == {kept}  # type: ignore[attr-defined]

    def test_refused_records_no_longer_hold_a_revocation(self) -> None:
        """A record refused after a hole leaves Faust's unacked set, unacked: the rebalance that
        follows a hole must not wait for it (the frozen-worker test hung there for ever)."""
        consumer = FakeConsumer({TP0: 19})
        first, after_hole = Message(TP0, 19), Message(TP0, 23)
        consumer.unacked = {first, after_hole}  # type: ignore[attr-defined]
        offsets = ContiguousOffsets(FakeApp(consumer))  # type: ignore[arg-type]

        async def run() -> list[bool]:
            return [await offsets.admit(first), await offsets.admit(after_hole)]

        assert asyncio.run(run()) == [True, False]
        assert consumer.unacked == {first}  # type: ignore[attr-defined]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class StallingRuntime(FakeRuntime):
    """Its fold of offset `stall_at` takes `seconds` of the clock with the loop stopped, as a
    SIGSTOP or a step holding the GIL does."""

    def __init__(self, clock: Clock, stall_at: int, seconds: float) -> None:
        super().__init__()
        self.clock, self.stall_at, self.seconds = clock, stall_at, seconds

    async def fold(self, record: Any) -> None:
        if record.offset == self.stall_at:
            self.clock.now += self.seconds
        await super().fold(record)


class GroupApp:
    consumer_generation_id = 4
    rebalancing = False


class ConfirmedLater(FakeRuntime):
    """A runtime whose commit resolves only once the test confirms it (`durable`)."""

    async def commit(self) -> Any:
        await super().commit()
        self.durable: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        return self.durable


async def commit_unconfirmed(
    runtime: ConfirmedLater, guard: StallGuard, stale: list[int]
) -> list[Event]:
    """Offsets 0 and 1 folded and committed in one batch, their writes with the producer (not
    yet confirmed); the offsets of records given back go to `stale`."""
    batcher = FoldBatcher(
        runtime,  # type: ignore[arg-type]
        limit=2,
        linger_s=0.0,
        guard=guard,
        on_stale=lambda events: stale.extend(e.message.offset for e in events),
    )
    events = [Event(offset) for offset in range(2)]
    for event in events:
        await batcher.before()
        await batcher.add(event)
    batcher.after()
    await batcher.before()
    return events


class TestStallGuard:
    def test_start_up_is_no_stall(self) -> None:
        """The seconds between building the app and its watch task starting (recovery,
        joining the group) are not taken for a stall of the event loop."""
        clock = Clock()
        guard = StallGuard(GroupApp(), lease_s=4.0, grace_s=3.0, tick_s=0.001, clock=clock)
        clock.now += 9.0  # the app starts its tasks only after recovery

        async def run() -> None:
            watching = asyncio.ensure_future(guard.watch())
            await asyncio.sleep(0.01)
            watching.cancel()

        asyncio.run(run())
        assert not guard.stalled()

    def run_stalled_batch(
        self, stall_s: float, after_stall: Any
    ) -> tuple[StallingRuntime, list[Event], list[int]]:
        """Fold offsets 0..2 (1 stalls for `stall_s`), commit at once; `after_stall(app)` is
        what the group does while the guard waits (the watchdog ticks every 0.5 s of clock)."""
        clock = Clock()
        app = GroupApp()
        guard = StallGuard(app, lease_s=4.0, grace_s=3.0, tick_s=0.001, clock=clock)
        runtime = StallingRuntime(clock, stall_at=1, seconds=stall_s)
        abandoned: list[int] = []
        batcher = FoldBatcher(
            runtime,  # type: ignore[arg-type]
            limit=3,
            linger_s=0.0,
            on_abandon=lambda events: abandoned.extend(e.message.offset for e in events),
            guard=guard,
        )
        events = [Event(offset) for offset in range(3)]

        async def watchdog() -> None:
            guard.tick()  # the first tick after the stall sees the gap
            after_stall(app)
            for _ in range(20):
                await asyncio.sleep(0.002)
                clock.now += 0.5
                guard.tick()

        async def run() -> None:
            for event in events:
                await batcher.before()
                await batcher.add(event)
            ticking = asyncio.ensure_future(watchdog())
            batcher.after()
            await asyncio.wait_for(batcher.before(), 10)
            await ticking
            await asyncio.sleep(0)

        asyncio.run(run())
        return runtime, events, abandoned

    def test_a_batch_folded_across_a_stall_is_dropped_when_the_group_moved_on(self) -> None:
        """A batch whose fold spanned a stall longer than the lease waits out the grace; the
        revocation that follows (the worker was dropped) makes it abandoned: nothing written,
        nothing acked, its records read again."""

        def revoke(app: Any) -> None:
            app.rebalancing = True

        runtime, events, abandoned = self.run_stalled_batch(10.0, revoke)
        assert runtime.commits == []
        assert abandoned == [0, 1, 2]
        assert not any(event.acked for event in events)

    def test_a_batch_read_before_a_new_generation_is_dropped(self) -> None:
        """A rebalance already over by the end of the grace counts as well."""

        def reassign(app: Any) -> None:
            app.consumer_generation_id = 6

        runtime, _events, abandoned = self.run_stalled_batch(10.0, reassign)
        assert (runtime.commits, abandoned) == ([], [0, 1, 2])

    def test_a_stall_the_group_did_not_notice_only_delays_the_commit(self) -> None:
        """After the grace, with the worker still a member, the batch is committed and acked;
        a stall shorter than the lease does not hold anything."""
        for stall_s in (10.0, 2.0):
            runtime, events, abandoned = self.run_stalled_batch(stall_s, lambda app: None)
            assert (runtime.commits, abandoned) == ([[0, 1, 2]], [])
            assert all(event.acked for event in events)

    def test_a_batch_confirmed_after_a_rebalance_is_read_again_unacked(self) -> None:
        """Committed in its generation, a batch whose writes the broker confirms only after a
        rebalance is not acked: its records go back to be read again."""
        stale: list[int] = []

        async def run() -> list[Event]:
            app = GroupApp()
            guard = StallGuard(app, lease_s=4.0, grace_s=3.0, tick_s=0.001, clock=Clock())
            runtime = ConfirmedLater()
            events = await commit_unconfirmed(runtime, guard, stale)
            app.consumer_generation_id = 5  # type: ignore[misc]
            runtime.durable.set_result(None)
            await asyncio.sleep(0.01)
            return events

        events = asyncio.run(run())
        assert stale == [0, 1]
        assert not any(event.acked for event in events)

    def run_batch_confirmed_after_a_stall(
        self, after_stall: Any
    ) -> tuple[list[Event], list[int], float]:
        """Commit offsets 0..1, stall 10 s before the broker confirms their writes, then tick
        the watchdog every 0.5 s of clock; `after_stall(app)` is what the group does meanwhile.
        Returns the events, those given back, and the clock seconds the acks waited."""
        stale: list[int] = []
        clock = Clock()
        app = GroupApp()
        guard = StallGuard(app, lease_s=4.0, grace_s=3.0, tick_s=0.001, clock=clock)
        waited = [0.0]

        async def run() -> list[Event]:
            runtime = ConfirmedLater()
            events = await commit_unconfirmed(runtime, guard, stale)
            start = clock.now
            clock.now += 10.0  # the process is stopped; the writes land after the stall
            runtime.durable.set_result(None)  # the acks run before the watchdog's next tick
            after_stall(app)
            for _ in range(20):
                await asyncio.sleep(0.002)
                if not any(event.acked for event in events) and not stale:
                    waited[0] = clock.now - start
                clock.now += 0.5
                guard.tick()
            return events

        events = asyncio.run(run())
        return events, stale, waited[0]

    def test_a_batch_confirmed_after_a_stall_is_read_again_when_the_group_moved_on(
        self,
    ) -> None:
        """Writes sent just before a stall land after it, perhaps after the new owner's (the
        fence leaves them out): once the grace shows the worker was dropped, the records are
        given back unacked. Acked, a commit the broker takes from the dropped worker (no
        generation, the group empty) had skipped them: a looped frozen-worker run lost a
        session's last 12 events so."""

        def revoke(app: Any) -> None:
            app.rebalancing = True

        events, stale, _waited = self.run_batch_confirmed_after_a_stall(revoke)
        assert stale == [0, 1]
        assert not any(event.acked for event in events)

    def test_a_batch_confirmed_after_a_stall_the_group_did_not_notice_is_acked(self) -> None:
        """With the worker still a member after the grace, the acks only wait for it."""
        events, stale, waited = self.run_batch_confirmed_after_a_stall(lambda app: None)
        assert stale == []
        assert all(event.acked for event in events)
        assert waited >= 13.0  # the 10 s stall and its 3 s grace

    def test_lease_and_grace_follow_the_heartbeat_settings(self) -> None:
        """The lease is the session timeout less two heartbeats; the grace two heartbeats and
        a second."""
        settings = WorkerSettings(session_timeout_s=6.0, heartbeat_interval_s=1.0)
        guard = StallGuard.for_settings(GroupApp(), settings)
        assert (guard.lease_s, guard.grace_s) == (4.0, 3.0)


def test_the_fetch_wait_is_shortened_once_the_consumer_exists() -> None:
    """The aiokafka fetcher's wait is set as soon as Faust's consumer thread has built it."""
    fetcher = type("Fetcher", (), {"_fetch_max_wait_ms": 1500})()
    thread = type("Thread", (), {"_consumer": None})()
    app = type("App", (), {"consumer": type("Consumer", (), {"_thread": thread})()})()

    async def run() -> None:
        task = asyncio.ensure_future(shorten_fetch_wait(app, 0.1, timeout_s=5))  # type: ignore[arg-type]
        await asyncio.sleep(0.15)
        thread._consumer = type("AIOKafkaConsumer", (), {"_fetcher": fetcher})()
        await asyncio.wait_for(task, 2)

    asyncio.run(run())
    assert fetcher._fetch_max_wait_ms == 100


def _rocks(path: Path) -> Any:
    return rocksdict.Rdict(str(path), options=rocksdict.Options(raw_mode=True))


class FakeRocksStore:
    """What LocalBackend uses of Faust's rocksdb Store: a database per open partition."""

    offset_key = b"__faust\0offset__"

    def __init__(self, root: Path, partitions: tuple[int, ...]) -> None:
        self.root = root
        self._dbs = {p: _rocks(root / f"state-{p}.db") for p in partitions}

    def close(self) -> None:
        for db in self._dbs.values():
            db.close()
        self._dbs = {}


class FakeLocalTable(FakeTable):
    def __init__(self, store: FakeRocksStore) -> None:
        super().__init__()
        self.data = store  # type: ignore[assignment]

    def __iter__(self) -> Any:
        for db in self.data._dbs.values():
            for k, _value in db.items():
                if k != FakeRocksStore.offset_key:
                    yield k


class TestLocalBackend:
    def test_the_store_gets_a_write_only_once_the_changelog_has_it(self, tmp_path: Path) -> None:
        """Read back at once, but in the partition's store (with its offset as the persisted
        offset) only when acknowledged: killed before that, the store holds neither."""

        async def run() -> tuple[bytes | None, Any, Any]:
            store = FakeRocksStore(tmp_path, (0, 2))
            table = FakeLocalTable(store)
            backend = faust_app.LocalBackend(table)  # type: ignore[arg-type]
            first = await backend.write("s/pr/h", b"1", 2)
            table.app.producer.pending[0].set_result(Acked("app-state-cl", 2, 7))
            await first
            await asyncio.sleep(0)
            await backend.write("s/pr/h", b"2", 2)
            await backend.write("s/pr/m/1", b"3", 2)
            read = backend.get("s/pr/h")
            keys = backend.keys()
            store.close()  # killed: the last two writes were never acknowledged
            return read, keys, _rocks(tmp_path / "state-2.db")

        read, keys, db = asyncio.run(run())
        assert read == b"2"
        assert set(_rows(dict.fromkeys(keys))) == {"s/pr/h", "s/pr/m/1"}
        assert db[b"s/pr/h"] == b"1"
        assert db.get(b"s/pr/m/1") is None
        assert db[FakeRocksStore.offset_key] == b"7"
        db.close()

    def test_a_group_reaches_the_store_whole_once_its_batch_is_acknowledged(
        self, tmp_path: Path
    ) -> None:
        """A record batch's writes are read back at once, and enter the partition's store in
        one RocksDB batch with its last offset as the persisted offset, only when acknowledged:
        killed before that, the store holds none of them."""

        async def run() -> tuple[list[Any], Any, Any]:
            store = FakeRocksStore(tmp_path, (0, 2))
            store._dbs[2][b"s/gone"] = b"0"
            table = FakeLocalTable(store)
            backend = faust_app.LocalBackend(table)  # type: ignore[arg-type]
            groups = [[("s/rt/j", b"[]"), ("s/pr/h", b"1")], [("s/gone", None)]]
            ack = await backend.write_groups(groups, 2)
            await asyncio.sleep(0)
            seen = [backend.get("s/pr/h"), backend.get("s/gone"), backend.unconfirmed]
            before = dict(store._dbs[2].items())
            table.app.producer.pending[0].set_result(Acked("app-state-cl", 2, 7))
            await ack
            await asyncio.sleep(0)
            seen.append(backend.unconfirmed)
            store.close()
            return seen, before, _rocks(tmp_path / "state-2.db")

        seen, before, db = asyncio.run(run())
        assert seen == [b"1", None, 4, 0]  # and the session's position row
        assert before == {b"s/gone": b"0"}
        assert db.get(b"s/pr/h") == b"1" and db.get(b"s/rt/j") == b"[]"
        assert db.get(b"s/gone") is None
        assert db[FakeRocksStore.offset_key] == b"8"  # two journal records
        db.close()

    def test_reads_find_the_key_in_its_partition_and_deletes_wait_for_acks(
        self, tmp_path: Path
    ) -> None:
        """Any partition's key is found (no current event needed); a delete leaves the store
        when acknowledged; an earlier ack does not hide a later write of the same key."""

        async def run() -> list[Any]:
            store = FakeRocksStore(tmp_path, (0, 1))
            store._dbs[1][b"a/pr/h"] = b"old"
            table = FakeLocalTable(store)
            backend = faust_app.LocalBackend(table)  # type: ignore[arg-type]
            seen = [backend.get("a/pr/h"), backend.get("b/pr/h")]
            first = await backend.write("a/pr/h", b"x", 1)
            second = await backend.write("a/pr/h", None, 1)
            pending = table.app.producer.pending
            pending[0].set_result(Acked("app-state-cl", 1, 4))
            await first
            await asyncio.sleep(0)
            seen += [backend.get("a/pr/h"), store._dbs[1].get(b"a/pr/h"), backend.unconfirmed]
            pending[1].set_result(Acked("app-state-cl", 1, 5))
            await second
            await asyncio.sleep(0)
            keys = _rows(dict.fromkeys(backend.keys()))
            seen += [store._dbs[1].get(b"a/pr/h"), backend.unconfirmed, keys]
            store.close()
            return seen

        # Unconfirmed: the second write's row and the session's position row.
        assert asyncio.run(run()) == [b"old", None, None, b"x", 2, None, 0, {}]

    def test_the_store_keeps_its_fence_epoch_for_the_next_process(self, tmp_path: Path) -> None:
        """A confirmed write's epoch, and the highest a recovered batch read, with the persisted
        offset: a restart on the store fences its recovery with it and writes above it."""

        async def run() -> tuple[bytes, bytes, bool, int, Any]:
            store = FakeRocksStore(tmp_path, (1,))
            table = FakeLocalTable(store)
            backend = faust_app.LocalBackend(table)  # type: ignore[arg-type]
            sent = await backend.write("s/pr/h", b"1", 1, generation=6)
            table.app.producer.pending[0].set_result(Acked("app-state-cl", 1, 3))
            await sent
            await asyncio.sleep(0)
            confirmed = store._dbs[1][faust_app.LocalBackend.FENCE_KEY]
            backend.fence.admits(1, 4, 9)  # a recovered record of a later owner
            table.on_applied({1: 4})
            recovered = store._dbs[1][faust_app.LocalBackend.FENCE_KEY]
            offset = store._dbs[1][FakeRocksStore.offset_key]
            restarted = faust_app.LocalBackend(FakeLocalTable(store))  # type: ignore[arg-type]
            late = restarted.fence.admits(1, 5, 8)
            epoch = restarted.fence.epoch(1, 1)
            keys = set(_rows(dict.fromkeys(restarted.keys())))
            store.close()
            return confirmed, recovered + b"@" + offset, late, epoch, keys

        assert asyncio.run(run()) == (b"6", b"9@4", False, 10, {"s/pr/h"})

    def test_forgetting_empties_the_store_and_keeps_later_acks_out(self, tmp_path: Path) -> None:
        """Emptied (the worker missed generations), every partition's database is read again
        from the start: no key, no persisted offset, no fence epoch; a write sent before and
        acknowledged after stays out of it."""

        async def run() -> tuple[list[Any], Any, Any]:
            store = FakeRocksStore(tmp_path, (0, 1))
            table = FakeLocalTable(store)
            backend = faust_app.LocalBackend(table)  # type: ignore[arg-type]
            acked = await backend.write("s/pr/h", b"1", 1, generation=3)
            table.app.producer.pending[0].set_result(Acked("app-state-cl", 1, 4))
            await acked
            late = await backend.write("t/pr/h", b"2", 0, generation=3)
            await asyncio.sleep(0)
            backend.forget()
            table.app.producer.pending[1].set_result(Acked("app-state-cl", 0, 5))
            await late
            await asyncio.sleep(0)
            held = [dict(db.items()) for db in store._dbs.values()]
            seen = (backend.get("t/pr/h"), backend.fence.newest(1))
            store.close()
            return held, *seen

        assert asyncio.run(run()) == ([{}, {}], None, None)

    def test_a_batch_read_before_a_rejoin_stays_out_of_the_local_store(
        self, tmp_path: Path
    ) -> None:
        """A write of a batch read before the rejoin's generation, sent after the store was
        emptied and acknowledged, is neither read back nor kept; a current one is."""

        async def run() -> tuple[Any, ...]:
            store = FakeRocksStore(tmp_path, (0,))
            table = FakeLocalTable(store)
            backend = faust_app.LocalBackend(table)  # type: ignore[arg-type]
            backend.forget(6)
            stale = await backend.write("old/pr/h", b"3", 0, generation=3)
            current = await backend.write("s/pr/h", b"6", 0, generation=6)
            seen = (backend.get("old/pr/h"), backend.unconfirmed)
            table.app.producer.pending[0].set_result(Acked("app-state-cl", 0, 7))
            table.app.producer.pending[1].set_result(Acked("app-state-cl", 0, 8))
            await stale
            await current
            await asyncio.sleep(0)
            kept = {bytes(k) for k, _ in store._dbs[0].items()} - {
                faust_app.LocalBackend.FENCE_KEY,
                FakeRocksStore.offset_key,
            }
            store.close()
            return *seen, kept, len(table.app.producer.sent)

        assert asyncio.run(run()) == (None, 2, {b"s/pr/h", b"s/rt/c/0"}, 2)

    def test_an_ack_after_revocation_leaves_the_store_alone(self, tmp_path: Path) -> None:
        """The partition's database is closed: the next assignment recovers the write."""

        async def run() -> int:
            store = FakeRocksStore(tmp_path, (0,))
            table = FakeLocalTable(store)
            backend = faust_app.LocalBackend(table)  # type: ignore[arg-type]
            sent = await backend.write("s/pr/h", b"1", 3)
            table.app.producer.pending[0].set_result(Acked("app-state-cl", 3, 9))
            await sent
            await asyncio.sleep(0)
            store.close()
            return backend.unconfirmed

        assert asyncio.run(run()) == 0
        assert not (tmp_path / "state-3.db").exists()

    def test_a_local_store_needs_at_least_once(self) -> None:
        """Faust's exactly_once path writes the store ahead of the changelog."""
        with pytest.raises(ValidationError):
            WorkerSettings(store="rocksdb://", processing_guarantee="exactly_once")
        assert WorkerSettings(store="rocksdb://").local_store
