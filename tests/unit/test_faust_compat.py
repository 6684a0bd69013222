"""Each Faust/aiokafka workaround's private name, checked on the real libraries (no broker)."""

from __future__ import annotations

import asyncio
import inspect
import logging
from pathlib import Path
from typing import Any

import aiokafka
import faust
import pytest
import rocksdict
from aiokafka import errors as Errors
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.protocol.commit import OffsetCommitRequest
from aiokafka.structs import OffsetAndMetadata, TopicPartition
from faust.stores.rocksdb import Store as RocksStore
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.transport.consumer import Consumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.types import TP, Message
from faust_fakes import RecoveryDriver, unstarted_app
from typer.testing import CliRunner

from sessionfold.streams.cli import app as cli
from sessionfold.streams.kafka import faust_compat

TP0 = TP("t.session-events", 0)


def _message(offset: int) -> Message:
    return Message(TP0.topic, TP0.partition, offset, 0.0, 0, {}, b"k", b"v", None)


class TestVersions:
    def test_the_pinned_versions_are_installed(self) -> None:
        """The installed Faust and aiokafka are the ones the workarounds were written for."""
        assert (faust.__version__, aiokafka.__version__) == (
            faust_compat.TESTED_FAUST,
            faust_compat.TESTED_AIOKAFKA,
        )
        assert faust_compat.version_warning() is None
        assert faust_compat.missing_internals() == []

    def test_another_version_warns_naming_both(
        self, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        """An untested Faust logs a warning with the installed and the tested versions."""
        monkeypatch.setattr(faust, "__version__", "0.99.0")
        with caplog.at_level(logging.WARNING, logger=faust_compat.__name__):
            faust_compat.check_upstream()
        assert "faust-streaming 0.99.0" in caplog.text
        assert f"faust-streaming {faust_compat.TESTED_FAUST}" in caplog.text
        assert f"aiokafka {faust_compat.TESTED_AIOKAFKA}" in caplog.text

    def test_a_missing_private_name_refuses_the_start(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A release without a name a workaround needs raises UpstreamChanged naming it."""
        monkeypatch.delattr(Consumer, "_add_gap")
        with pytest.raises(faust_compat.UpstreamChanged, match=r"Consumer\._add_gap"):
            faust_compat.check_upstream()

    def test_the_worker_command_exits_2_on_a_missing_name(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`sessionfold worker` stops with exit 2 before touching the broker, no traceback."""
        monkeypatch.delattr(RocksStore, "offset_key")
        result = CliRunner().invoke(cli, ["worker", "--bootstrap", "127.0.0.1:1"])
        assert result.exit_code == 2
        assert "offset_key" in result.output
        assert "Traceback" not in result.output


class TestGapBooking:
    def test_faust_commits_past_a_booked_gap_and_not_once_it_is_off(self, tmp_path: Path) -> None:
        """With a gap booked for 5..7, Faust commits offset 9 though 5..7 were never read;
        with gap booking off it stops at the hole."""

        async def new_offset(disable: bool) -> int | None:
            consumer = unstarted_app(tmp_path).consumer
            if disable:
                faust_compat.disable_gap_booking(consumer)
            consumer._committed_offset[TP0] = 4
            await consumer._add_gap(TP0, 5, 7)
            consumer._acked[TP0].extend([4, 8])
            return consumer._new_offset(TP0)

        assert asyncio.run(new_offset(disable=False)) == 9
        assert asyncio.run(new_offset(disable=True)) == 5


class TestCommittedOffset:
    def test_it_reads_what_faust_records_after_a_commit(self, tmp_path: Path) -> None:
        """None before any commit (without creating an entry), then the offset Faust stored."""
        consumer = unstarted_app(tmp_path).consumer
        assert faust_compat.committed_offset(consumer, TP0) is None
        assert TP0 not in consumer._committed_offset
        consumer._committed_offset.update({TP0: 12})  # what Faust does after a commit
        assert faust_compat.committed_offset(consumer, TP0) == 12


class TestStartOffset:
    def test_faust_keeps_no_offset_to_seek_back_to_for_a_partition_never_committed(
        self, tmp_path: Path
    ) -> None:
        """Faust books a committed offset of 0 as None, and aiokafka's `seek_to_committed` moves
        only partitions committed past 0: a partition without a commit stays where the fetcher
        left it, past any record Faust dropped."""
        assert "if offset and offset > 0" in inspect.getsource(
            aiokafka.AIOKafkaConsumer.seek_to_committed
        )

        async def run() -> int | None:
            consumer = unstarted_app(tmp_path).consumer

            async def seek_to_committed() -> dict[TP, int]:
                return {TP0: 0}

            consumer.seek_to_committed = seek_to_committed  # type: ignore[method-assign]
            await consumer.perform_seek()
            return faust_compat.committed_offset(consumer, TP0)

        assert asyncio.run(run()) is None

    @pytest.mark.parametrize(
        ("committed", "earliest", "start"), [(None, 0, 0), (0, 0, 0), (42, 0, 42), (5, 10, 10)]
    )
    def test_the_group_s_commit_else_the_log_s_start(
        self, tmp_path: Path, committed: int | None, earliest: int, start: int
    ) -> None:
        """The broker's committed offset for the group, read through Faust's consumer thread;
        with none, or one the log no longer holds, the partition's earliest offset."""
        asked: list[Any] = []

        class Client:
            async def committed(self, tp: aiokafka.TopicPartition) -> int | None:
                asked.append(tp)
                return committed

        async def run() -> int:
            consumer = unstarted_app(tmp_path).consumer
            thread = consumer._thread
            thread._ensure_consumer = Client  # type: ignore[method-assign]

            async def call_thread(fun: Any, *args: Any) -> Any:
                return await fun(*args)

            async def earliest_offsets(*tps: TP) -> dict[TP, int]:
                return {tp: earliest for tp in tps}

            thread.call_thread = call_thread  # type: ignore[method-assign]
            consumer.earliest_offsets = earliest_offsets  # type: ignore[method-assign]
            return await faust_compat.start_offset(consumer, TP0)

        assert asyncio.run(run()) == start
        assert asked == [aiokafka.TopicPartition(TP0.topic, TP0.partition)]


class TestUnacked:
    def test_a_forgotten_record_leaves_the_set_wait_empty_waits_on(self, tmp_path: Path) -> None:
        """`unacked` is the set Faust's revocation waits to empty (`wait_empty`); a record
        forgotten leaves it, still not acked."""
        consumer = unstarted_app(tmp_path).consumer
        assert consumer.unacked is consumer._unacked_messages
        assert "self._unacked_messages" in inspect.getsource(Consumer.wait_empty)
        message = _message(3)
        consumer.track_message(message)
        assert message in consumer.unacked
        faust_compat.forget_unacked(consumer, message)
        assert message not in consumer.unacked
        assert not message.acked


class TestFetchWait:
    def test_faust_builds_aiokafka_with_a_fixed_wait(self, tmp_path: Path) -> None:
        """Faust's consumer thread builds aiokafka's consumer with a 1.5 s fetch wait."""

        async def run() -> int:
            app = unstarted_app(tmp_path)
            thread = app.consumer._thread
            assert thread._consumer is None  # built only when the thread starts
            consumer = thread._create_worker_consumer(app.transport)
            return int(consumer._fetch_max_wait_ms)

        assert asyncio.run(run()) == 1500

    def test_nothing_is_set_before_the_fetcher_exists(self, tmp_path: Path) -> None:
        """An app whose consumer has not started reports that it could not set the wait."""
        assert faust_compat.set_fetch_max_wait(unstarted_app(tmp_path), 100) is False


class TestCommitOnlyAsMember:
    def coordinator(self, generation: int) -> Any:
        """aiokafka's GroupCoordinator, unstarted, whose commits reach a stand-in broker that
        records each request's generation and answers as to a member it does not know."""
        coordinator = object.__new__(GroupCoordinator)
        coordinator.group_id, coordinator.member_id, coordinator.coordinator_id = "g", "m", 0
        coordinator.generation = generation
        coordinator._commit_lock = asyncio.Lock()
        coordinator.sent = []

        async def known() -> None:
            return None

        async def send(request: Any) -> None:
            coordinator.sent.append(request._consumer_group_generation_id)
            raise Errors.UnknownMemberIdError()

        coordinator.ensure_coordinator_known = known
        coordinator._send_req = send
        return coordinator

    def commit(self, coordinator: Any, guarded: bool) -> str:
        """One commit through aiokafka's `commit_offsets`, the guard installed or not: the
        error it ends in."""
        if guarded:
            thread = type("Thread", (), {"_consumer": type("C", (), {"_coordinator": coordinator})})
            app = type("App", (), {"consumer": type("Consumer", (), {"_thread": thread})})
            assert faust_compat.commit_only_as_member(app) is True
        offsets = {TopicPartition("t", 0): OffsetAndMetadata(5, "")}
        with pytest.raises(Errors.CommitFailedError) as failed:
            asyncio.run(coordinator.commit_offsets(set(), offsets))
        return str(failed.value)

    def test_a_dropped_member_commits_with_no_generation_unless_guarded(self) -> None:
        """After aiokafka has reset its generation (dropped by the group) it still sends a
        commit, with generation -1, which the broker takes whenever the group is empty; the
        guard refuses it before it is sent, with the error Faust takes for a rebalance (its
        `_commit` returns False on "already rebalanced" instead of crashing the worker)."""
        dropped = self.coordinator(OffsetCommitRequest.DEFAULT_GENERATION_ID)
        self.commit(dropped, guarded=False)
        assert dropped.sent == [-1]
        guarded = self.coordinator(OffsetCommitRequest.DEFAULT_GENERATION_ID)
        assert "already rebalanced" in self.commit(guarded, guarded=True)
        assert guarded.sent == []
        assert '"already rebalanced" in str(exc)' in inspect.getsource(
            AIOKafkaConsumerThread._commit
        )

    def test_a_member_commits_as_before(self) -> None:
        """With a generation, the commit goes to the broker with it."""
        member = self.coordinator(7)
        self.commit(member, guarded=True)
        assert member.sent == [7]

    def test_nothing_is_guarded_before_the_consumer_exists(self, tmp_path: Path) -> None:
        """An app whose consumer has not started reports that the guard is not in place."""
        assert faust_compat.commit_only_as_member(unstarted_app(tmp_path)) is False


class TestRocksStore:
    def test_a_partition_db_and_its_offset_key(self, tmp_path: Path) -> None:
        """`_dbs` holds each open partition's RocksDB, and the persisted offset Faust reads
        back is the one written under `offset_key` in that database."""
        app = unstarted_app(tmp_path, store="rocksdb://")
        table = app.Table("state", key_type=str, value_type=bytes, options={"driver": "rocksdict"})
        store = table.data
        tp = TP(table.changelog_topic.get_topic_name(), 1)
        store.set_persisted_offset(tp, 3)
        db = faust_compat.partition_dbs(store)[1]
        key = faust_compat.persisted_offset_key(store)
        assert db.get(key) == b"3"
        batch = rocksdict.WriteBatch(raw_mode=True)
        batch.put(b"sid/pr/h", b"v")
        batch.put(key, b"7")
        db.write(batch)
        assert store.persisted_offset(tp) == 7
        assert store[b"sid/pr/h"] == b"v"


class TestRecoveryOffsets:
    def test_a_changelog_read_again_is_read_from_the_start(self, tmp_path: Path) -> None:
        """Recovery resumes a partition at the offset in `active_offsets` (or standby_offsets);
        revoked, it has none, and the next assignment reads it from the start."""
        app = unstarted_app(tmp_path)
        recovery = app.tables.recovery
        state, other = TP("unstarted-state-changelog", 1), TP("unstarted-other-changelog", 1)
        recovery.active_offsets.update({state: 40, other: 7})
        recovery.standby_offsets[TP("unstarted-state-changelog", 2)] = 9
        faust_compat.read_changelog_again(app, "unstarted-state-changelog")
        assert dict(recovery.active_offsets) == {other: 7}
        assert dict(recovery.standby_offsets) == {}


class TestRecoveryProgress:
    """What the recovery under way has applied of each changelog partition, on Faust's real
    Recovery loops (faust_fakes.RecoveryDriver) over a consumer stand-in."""

    def test_faust_books_a_record_as_read_before_it_applies_it(self, tmp_path: Path) -> None:
        """A record read counts in `active_offsets` while it waits in `buffers`, out of the
        store, until the buffer holds a chunk (of any partition's records)."""

        async def run() -> None:
            driver = RecoveryDriver(tmp_path, chunk=2)
            driver.ends.update({driver.tp(0): 1, driver.tp(1): 1})
            await driver.rebalance(0, 1)
            recovery = driver.recovery
            await driver.read(0, 0)
            assert recovery.active_offsets[driver.tp(0)] == 0
            assert recovery.active_offsets[driver.tp(0)] >= recovery.active_highwaters[driver.tp(0)]
            assert [e.message.offset for e in recovery.buffers[driver.table]] == [0]
            assert dict(driver.table.data) == {}
            await driver.read(1, 0)
            assert recovery.buffers[driver.table] == []
            assert set(driver.table.data) == {b"k0-0", b"k1-0"}
            driver.stop()

        asyncio.run(run())

    def test_faust_keeps_a_kept_partition_s_highwater_over_a_rebalance(
        self, tmp_path: Path
    ) -> None:
        """A rebalance that keeps a partition leaves its old highwater (the end offset less one)
        in `active_highwaters` until the recovery builds the new one; a revoked one has none."""
        recovery = unstarted_app(tmp_path).tables.recovery
        kept, revoked = TP("t-changelog", 0), TP("t-changelog", 1)
        recovery.active_highwaters.update({kept: 4, revoked: 4})

        class Consumer:
            async def highwaters(self, *tps: TP) -> dict[TP, int]:
                return dict.fromkeys(tps, 10)

        async def run() -> None:
            await recovery.on_rebalance({kept}, {revoked}, set(), 0)
            assert dict(recovery.active_highwaters) == {kept: 4}
            await recovery._build_highwaters(Consumer(), {kept}, recovery.active_highwaters, "a")
            assert dict(recovery.active_highwaters) == {kept: 9}

        asyncio.run(run())
        # What a recovery read before the rebalance is applied before the next one builds.
        source = inspect.getsource(Recovery._restart_recovery.fun)
        assert source.index("self.flush_buffers") < source.index("self._build_highwaters")

    def test_every_assignment_reaches_the_table_manager_s_on_rebalance(self) -> None:
        """Faust's app hands each assignment to `app.tables.on_rebalance`, looked up when called
        (so `watch_recovery` sees it), which rebalances the recovery."""
        assigned = inspect.getsource(faust.App._on_partitions_assigned)
        assert "await T(self.tables.on_rebalance)(" in assigned
        assert "self.recovery.on_rebalance" in inspect.getsource(TableManager.on_rebalance)

    def test_a_partition_applied_to_its_highwater_is_recovered_while_others_are_not(
        self, tmp_path: Path
    ) -> None:
        """Partition 0 read to its highwater is recovered once its records are applied, while
        partition 1 still recovers; nothing is before the first rebalance."""

        async def run() -> None:
            driver = RecoveryDriver(tmp_path, chunk=3, tracked=faust_compat.watch_recovery)
            progress = driver.progress
            p0, p1 = driver.tp(0), driver.tp(1)
            assert not progress.recovered(p0)
            driver.ends.update({p0: 2, p1: 3})
            await driver.rebalance(0, 1)
            assert driver.app.in_recovery
            assert not progress.recovered(p0)
            await driver.read(0, 0)
            await driver.read(0, 1)
            assert not progress.recovered(p0)  # read to its highwater, still in the buffer
            await driver.read(1, 0)  # the chunk is applied
            assert progress.recovered(p0)
            assert not progress.recovered(p1)
            assert not progress.recovered(TP(p0.topic, 2))  # not assigned here
            await driver.read(1, 1)
            await driver.read(1, 2)
            assert not driver.app.in_recovery
            assert progress.recovered(p0)
            assert progress.recovered(p1)
            driver.stop()

        asyncio.run(run())

    def test_a_new_rebalance_voids_what_the_last_recovery_built(self, tmp_path: Path) -> None:
        """After a rebalance a partition recovered before is not, until the new recovery has
        applied it up to its new highwater."""

        async def run() -> None:
            driver = RecoveryDriver(tmp_path, chunk=1, tracked=faust_compat.watch_recovery)
            progress = driver.progress
            p0, p1 = driver.tp(0), driver.tp(1)
            driver.ends.update({p0: 1, p1: 1})
            await driver.rebalance(0, 1)
            await driver.read(0, 0)
            await driver.read(1, 0)
            assert not driver.app.in_recovery
            assert progress.recovered(p0)
            driver.ends.update({p0: 2, p1: 2})  # written to since
            await driver.rebalance(0, 1)
            assert driver.app.in_recovery
            assert not progress.recovered(p0)
            await driver.read(0, 1)
            assert progress.recovered(p0)
            assert not progress.recovered(p1)
            driver.stop()

        asyncio.run(run())

    def test_highwaters_are_the_recovery_s_only_if_built_since_its_rebalance(
        self, tmp_path: Path
    ) -> None:
        """Once a rebalance begins, the highwaters Faust still holds are the last recovery's, and
        so are those of a build the rebalance overtook: nothing is recovered until a build that
        began after it."""
        app = unstarted_app(tmp_path)
        progress = faust_compat.watch_recovery(app)
        recovery = app.tables.recovery
        tp = TP("t-changelog", 0)
        recovery.active_tps.add(tp)
        recovery.active_offsets[tp] = 5

        class Consumer:
            def __init__(self) -> None:
                self.answer = asyncio.Event()  # the broker answers the highwater request

            async def highwaters(self, *tps: TP) -> dict[TP, int]:
                await self.answer.wait()
                return dict.fromkeys(tps, 6)

        async def run() -> None:
            consumer = Consumer()
            consumer.answer.set()

            async def build() -> None:
                await recovery._build_highwaters(consumer, {tp}, recovery.active_highwaters, "a")

            progress.rebalanced(recovery)
            await build()
            assert progress.recovered(tp)
            progress.rebalanced(recovery)  # the next rebalance begins
            assert recovery.active_highwaters[tp] == 5
            assert not progress.recovered(tp)
            consumer.answer.clear()
            overtaken = asyncio.ensure_future(build())
            await asyncio.sleep(0)
            progress.rebalanced(recovery)  # and another, while that build waits on the broker
            consumer.answer.set()
            await overtaken
            assert not progress.recovered(tp)
            await build()
            assert progress.recovered(tp)

        asyncio.run(run())


class TestKeySerializer:
    def test_str_keys_are_json_quoted_by_faust_and_raw_in_a_raw_key_table(
        self, tmp_path: Path
    ) -> None:
        """Faust serializes a str table key as JSON; RawKeyTable's go out as plain UTF-8."""
        app = unstarted_app(tmp_path)
        plain = app.Table("plain", key_type=str, value_type=bytes)
        raw = app.tables.add(
            faust_compat.RawKeyTable(app, name="raw", key_type=str, value_type=bytes)
        )
        dumps = app.serializers.dumps_key
        assert dumps(str, "a/b", serializer=plain.key_serializer) == b'"a/b"'
        assert dumps(str, "a/b", serializer=raw.key_serializer) == b"a/b"


class TestProducerBuffer:
    def test_the_buffer_limit_is_faust_s_class_default_until_set(self, tmp_path: Path) -> None:
        """Faust's producer buffer pauses streams past 100 records; the limit is per app."""
        producer = unstarted_app(tmp_path).producer
        assert producer.buffer.max_messages == 100
        faust_compat.set_buffer_limit(producer, 2_000)
        assert producer.buffer.max_messages == 2_000
        assert unstarted_app(tmp_path).producer.buffer.max_messages == 100


class TestRouting:
    """What Faust's router raises while the worker cannot route (`routing_failure`), on Faust's
    real router and producer over aiokafka's real producer, never started."""

    def test_the_router_s_failures_before_the_producer_is_ready_are_named(
        self, tmp_path: Path
    ) -> None:
        """Before the producer starts, Faust's `NotReady`; started, with no metadata of the
        changelog topic, aiokafka's TypeError inside `key_partition`: `producer`, `metadata`.
        The same TypeError raised elsewhere, and a KeyError, are no routing failure."""

        async def run() -> list[BaseException]:
            app = unstarted_app(tmp_path)
            table = app.Table("state", key_type=str, value_type=bytes, partitions=2)
            raised = []
            with pytest.raises(faust.exceptions.NotReady) as not_started:
                app.router.key_store(table.name, "s1")
            raised.append(not_started.value)
            producer = aiokafka.AIOKafkaProducer(bootstrap_servers="127.0.0.1:1")
            app.producer._producer = producer
            with pytest.raises(TypeError, match="'NoneType' object is not iterable") as unknown:
                app.router.key_store(table.name, "s1")
            raised.append(unknown.value)
            await producer.stop()
            return raised

        not_started, no_metadata = asyncio.run(run())
        assert faust_compat.routing_failure(not_started) == "producer"
        assert faust_compat.routing_failure(no_metadata) == "metadata"
        try:
            list(None)  # type: ignore[call-overload]
        except TypeError as elsewhere:
            assert faust_compat.routing_failure(elsewhere) is None
        assert faust_compat.routing_failure(KeyError("s1")) is None
