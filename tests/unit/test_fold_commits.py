"""The fold runtime's pipelined commits (worker/agents.py, `FoldRuntime.commit`), by hand.

A changelog and topics whose acknowledgements the test gives itself: a batch is folded and
committed while the one before it still waits for its outputs' acknowledgements, and a crash at
any point of that (the changelog keeps what it got, the topics only what they acknowledged) is
repaired by redelivering the records not acknowledged to Faust.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from backend_fakes import DictBackend, acknowledged
from prometheus_client import CollectorRegistry

from sessionfold.events.envelope import decode, encode
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.ports.summarizer import OfflineSummarizer
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.store import Store, key
from sessionfold.streams.kafka.table_store import (
    Journal,
    MemoryBackend,
    Output,
    Write,
    journal_key,
)
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.runtime.step import Answerer
from sessionfold.streams.tools.synthetic import generate_session, write_session
from sessionfold.streams.worker import agents
from sessionfold.streams.worker.agents import FoldRuntime, SessionTracker, SourceRecord
from sessionfold.streams.worker.prometheus import create

TOPICS = Topics("p.")
BATCH = 4


class HandAcked(DictBackend):
    """A Backend and a Sender whose writes and sends wait for `ack`; every step is logged.

    `steps` is the order things happened in: ("write", key, value), ("group", writes) (a
    record batch: its writes land together), ("send", output), ("ack", n) (the first n
    writes and sends waiting acknowledged) and ("acked", n) (the first n batches' records
    acknowledged to Faust).
    """

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[Any, ...]] = []
        self.unacked: list[asyncio.Future[Any]] = []

    def written(self, key: str, value: bytes | None) -> asyncio.Future[Any]:
        self.steps.append(("write", key, value))
        return self._waiting()

    def written_groups(self, writes: list[Write]) -> asyncio.Future[Any]:
        self.steps.append(("group", writes))
        return self._waiting()

    async def send(self, output: Output) -> Any:
        self.steps.append(("send", output))
        return self._waiting()

    def _waiting(self) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        self.unacked.append(future)
        return future

    async def ack(self, count: int | None = None) -> None:
        """Acknowledge the first `count` writes and sends waiting (all, and whatever acking
        them leads to, when None), in the order they were made, and let the waiting run."""
        while self.unacked:
            taken = len(self.unacked) if count is None else count
            acked, self.unacked = self.unacked[:taken], self.unacked[taken:]
            self.steps.append(("ack", len(acked)))
            for future in acked:
                future.set_result(None)
            for _ in range(5):
                await asyncio.sleep(0)
            if count is not None:
                return


def _runtime(table: Any, send: Any) -> FoldRuntime:
    tracker = SessionTracker(table, DEFAULT_CONFIG, 1)
    return FoldRuntime(table, send, TOPICS, DEFAULT_CONFIG, create(CollectorRegistry()), tracker)


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> list[SourceRecord]:
    """A generated session's records as the fold agent reads them, each flush request's and
    pass request's answer right after the batch that asked for it (the summarizer is fast)."""
    root = tmp_path_factory.mktemp("pipelined")
    path = write_session(root, generate_session(5, 20)).path
    log = [encode(r) for r in read_session_file(path) if not isinstance(r, DeadLetter)]
    answerer = Answerer(OfflineSummarizer(), OfflineModel())
    position = 0

    async def send(output: Output) -> Any:
        if output.topic == TOPICS.flush_requests:
            answer = answerer.answer(decode(output.value))
            answers.append(encode(answer.envelope))
        return acknowledged()

    async def run() -> None:
        nonlocal position
        runtime = _runtime(MemoryBackend(), send)
        while position < len(log):
            batch = _as_records(log)[position : position + BATCH]
            for record in batch:
                await runtime.fold(record)
            await (await runtime.commit())
            position += len(batch)
            log[position:position] = answers
            answers.clear()

    answers: list[bytes] = []
    asyncio.run(run())
    return _as_records(log)


def _as_records(log: list[bytes]) -> list[SourceRecord]:
    """The fold inputs as one partition of one topic (the agent reads both as one stream)."""
    return [
        SourceRecord(TOPICS.session_events, 0, n, orjson.loads(v)["session_id"].encode(), v)
        for n, v in enumerate(log)
    ]


def _batches(records: list[SourceRecord], start: int = 0) -> Iterator[list[SourceRecord]]:
    for n in range(start, len(records), BATCH):
        yield records[n : n + BATCH]


async def _fold_at_once(table: dict[str, bytes], records: list[SourceRecord]) -> list[Output]:
    """Fold `records` in batches over `table`, every write and send acknowledged at once."""
    sent: list[Output] = []

    async def send(output: Output) -> Any:
        sent.append(output)
        return acknowledged()

    runtime = _runtime(MemoryBackend(table), send)
    for batch in _batches(records):
        for record in batch:
            await runtime.fold(record)
        await (await runtime.commit())
    return sent


async def _fold_pipelined(hand: HandAcked, records: list[SourceRecord]) -> None:
    """Fold `records` in batches, each committed while the one before waits for its acks."""
    runtime = _runtime(hand, hand.send)
    durables: list[asyncio.Future[Any]] = []

    def acked(_done: Any) -> None:
        # Faust's view: records are acked in order (OrderedAcks), a batch once all before are.
        done = 0
        while done < len(durables) and durables[done].done():
            done += 1
        hand.steps.append(("acked", done))

    for batch in _batches(records):
        for record in batch:
            await runtime.fold(record)
        made_before = len(hand.unacked)
        # Returns with the outputs unacknowledged: the producer has them, the broker not yet.
        durable = asyncio.ensure_future(await asyncio.wait_for(runtime.commit(), 1.0))
        durable.add_done_callback(acked)
        durables.append(durable)
        await hand.ack(made_before)  # what came before this commit is acknowledged only now
    await hand.ack()
    await asyncio.gather(*durables)


def _expected(records: list[SourceRecord]) -> tuple[dict[str, bytes], set[bytes]]:
    table: dict[str, bytes] = {}
    sent = asyncio.run(_fold_at_once(table, records))
    return table, {o.value for o in sent}


def test_a_batch_is_committed_while_the_one_before_waits_for_its_acks(
    records: list[SourceRecord],
) -> None:
    """Committing a batch does not wait for the outputs of the one before; a session still
    waiting gets a journal that carries those outputs, and in the end the table holds what
    acknowledging everything at once gives, with no journal left."""
    expected_table, expected_sent = _expected(records)
    hand = HandAcked()
    asyncio.run(_fold_pipelined(hand, records))
    assert hand.live == expected_table
    assert not any(k.endswith("/rt/j") for k in hand.live)
    assert {s[1].value for s in hand.steps if s[0] == "send"} == expected_sent
    carried = 0
    sent_before: set[bytes] = set()
    for step in hand.steps:
        if step[0] == "send":
            sent_before.add(step[1].value)
        for k, value in _writes(step):
            if k.endswith("/rt/j") and value is not None:
                carried += len({o.value for o in Journal.decode(value).outputs} & sent_before)
    assert carried > 0


def _writes(step: tuple[Any, ...]) -> list[Write]:
    """The changelog writes of one step (none for a send or an ack)."""
    if step[0] == "write":
        return [(step[1], step[2])]
    return list(step[1]) if step[0] == "group" else []


def _crash_at(hand: HandAcked, point: int, lose_unacked_writes: bool) -> tuple[dict, list, int]:
    """What survives a crash after `point` steps: the changelog (all of it, or only what was
    acknowledged), the sends the broker acknowledged, and how many batches Faust had acked."""
    table: dict[str, bytes] = {}
    waiting: list[tuple[Any, ...]] = []  # writes and sends in the order made
    sent: list[Output] = []
    batches_acked = 0
    for step in hand.steps[:point]:
        if step[0] in ("write", "group", "send"):
            waiting.append(step)
        elif step[0] == "ack":
            acked, waiting = waiting[: step[1]], waiting[step[1] :]
            _apply(table, acked, sent)
        else:
            batches_acked = step[1]
    if not lose_unacked_writes:
        _apply(table, [step for step in waiting if step[0] != "send"], [])
    return table, sent, batches_acked


def _apply(table: dict[str, bytes], steps: list[tuple[Any, ...]], sent: list[Output]) -> None:
    for step in steps:
        if step[0] == "send":
            sent.append(step[1])
        for k, value in _writes(step):
            if value is None:
                table.pop(k, None)
            else:
                table[k] = value


def _settle(table: dict[str, bytes], sent: list[Output]) -> None:
    """Replay the journals left open, as the next record of their sessions would."""
    for k in [k for k in table if k.endswith("/rt/j")]:
        journal = Journal.decode(table.pop(k))
        _apply(table, [("write", k, v) for k, v in journal.puts], sent)
        _apply(table, [("write", k, None) for k in journal.deletes], sent)
        sent += journal.outputs


@pytest.mark.parametrize("lose_unacked_writes", [False, True])
def test_a_crash_at_any_point_of_pipelined_commits_is_repaired_by_redelivery(
    records: list[SourceRecord], lose_unacked_writes: bool
) -> None:
    """Whatever step a worker dies after (its unacknowledged sends lost, and with them or
    not its unacknowledged changelog writes), a new worker folding the records Faust had not
    acknowledged ends with the table and the outputs of a run without a crash."""
    expected_table, expected_sent = _expected(records)
    hand = HandAcked()
    asyncio.run(_fold_pipelined(hand, records))
    for point in range(len(hand.steps) + 1):
        table, sent, batches_acked = _crash_at(hand, point, lose_unacked_writes)
        redelivered = records[batches_acked * BATCH :]
        sent += asyncio.run(_fold_at_once(table, redelivered))
        _settle(table, sent)
        assert table == expected_table, point
        assert {o.value for o in sent} >= expected_sent, point


def test_a_failed_fold_leaves_no_trace_in_the_batch(
    records: list[SourceRecord], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record whose fold raises after changing, in place, values the records before it in
    the batch wrote is dead-lettered with nothing of it written: the batch ends as if its fold
    had raised before doing anything."""
    session_id = records[0].key.decode()  # type: ignore[union-attr]
    failing = records[6].offset
    real = agents.fold_record

    def fold_then_fail(store: Store, record: SourceRecord, *args: Any) -> Any:
        result = real(store, record, *args)
        if record.offset == failing:
            store.get(key(session_id, "pr", "h"))["seq"] += 1000  # type: ignore[index]
            raise RuntimeError
        return result

    def fail_first(store: Store, record: SourceRecord, *args: Any) -> Any:
        if record.offset == failing:
            raise RuntimeError
        return real(store, record, *args)

    tables = []
    for fold in (fail_first, fold_then_fail):
        monkeypatch.setattr(agents, "fold_record", fold)
        table: dict[str, bytes] = {}
        sent = asyncio.run(_fold_at_once(table, records[: BATCH * 3]))
        tables.append((table, [o.value for o in sent]))
    assert tables[0] == tables[1]
    assert journal_key(session_id) not in tables[1][0]


class Lease:
    """A consumer generation the test moves on by hand."""

    def __init__(self) -> None:
        self.current = 1

    def generation(self) -> int:
        return self.current

    async def clear(self, generation: int) -> bool:
        return generation == self.current


def test_a_worker_whose_group_moved_on_leaves_its_journal(records: list[SourceRecord]) -> None:
    """A journal whose outputs are acknowledged only after a rebalance began is not deleted
    (the session may be another worker's, and so the key in the changelog); if the session
    stays here, its next batch replaces the journal and deletes its own."""
    expected_table, _sent = _expected(records)

    async def run() -> tuple[bool, HandAcked]:
        hand = HandAcked()
        runtime = _runtime(hand, hand.send)
        lease = Lease()
        runtime.lease = lease
        batches = list(_batches(records))
        left = False
        for n, batch in enumerate(batches):
            for record in batch:
                await runtime.fold(record)
            durable = await runtime.commit()
            if n == 0 or left or not any(s[0] == "send" for s in hand.steps):
                await hand.ack()
                await durable
                continue
            lease.current += 1  # a rebalance, before the broker acknowledged the outputs
            await hand.ack()
            await durable
            left = any(k.endswith("/rt/j") for k in hand.live)
            if not left:
                return False, hand
        return left, hand

    left, hand = asyncio.run(run())
    assert left
    assert hand.live == expected_table


def test_a_journal_left_open_is_replaced_by_the_next_batch_without_outputs(
    records: list[SourceRecord],
) -> None:
    """A journal a rebalance kept from being deleted is replaced (and then deleted) by the
    session's next batch even when that batch sends nothing: left in place, it would be replayed
    by whoever next owns the session, with outputs older than the session's state."""

    async def run() -> tuple[bool, bool]:
        hand = HandAcked()
        runtime = _runtime(hand, hand.send)
        lease = Lease()
        runtime.lease = lease
        pending = iter(records)
        left = False
        for record in pending:  # one record a batch, until a journal is left behind
            await runtime.fold(record)
            sends = sum(s[0] == "send" for s in hand.steps)
            durable = await runtime.commit()
            if sum(s[0] == "send" for s in hand.steps) > sends:
                lease.current += 1  # a rebalance, before the broker acknowledged the outputs
            await hand.ack()
            await durable
            left = any(k.endswith("/rt/j") for k in hand.live)
            if left:
                break
        for record in pending:  # then the next batch that writes and sends nothing
            await runtime.fold(record)
            sends = sum(s[0] == "send" for s in hand.steps)
            writes = len(hand.steps)
            durable = await runtime.commit()
            await hand.ack()
            await durable
            quiet = sum(s[0] == "send" for s in hand.steps) == sends
            if quiet and len(hand.steps) > writes:
                return left, any(k.endswith("/rt/j") for k in hand.live)
        return left, True

    left, still_there = asyncio.run(run())
    assert left
    assert not still_there


class QueuedDeletes(DictBackend):
    """Writes acknowledged at once, sends once `ack_sends`; while `hold` is set, a journal's
    delete reaches `live` only at `release`, as if it waited in the producer's queue (aiokafka
    sends one record batch per partition at a time, and the store drops a key only once the
    producer has it)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.held: list[asyncio.Future[None]] = []
        self.sends: list[asyncio.Future[None]] = []
        self.sent: list[Output] = []

    async def write(
        self, key: str, value: bytes | None, partition: int, generation: int = 0
    ) -> Any:
        if self.hold and value is None and key.endswith("/rt/j"):
            gate = asyncio.get_running_loop().create_future()
            self.held.append(gate)
            await gate
        return await super().write(key, value, partition, generation)

    def written(self, key: str, value: bytes | None) -> asyncio.Future[Any]:
        return acknowledged()

    def written_groups(self, writes: list[Write]) -> asyncio.Future[Any]:
        return acknowledged()

    async def send(self, output: Output) -> Any:
        self.sent.append(output)
        ack = asyncio.get_running_loop().create_future()
        self.sends.append(ack)
        return ack

    async def ack_sends(self) -> None:
        sends, self.sends = self.sends, []
        for ack in sends:
            ack.set_result(None)
        for _ in range(10):  # the journals' closes run up to their deletes
            await asyncio.sleep(0)

    def release(self) -> int:
        """Let the held deletes through; how many there were."""
        held, self.held = self.held, []
        for gate in held:
            gate.set_result(None)
        return len(held)


def test_a_journal_whose_delete_waits_in_the_producer_is_not_replayed(
    records: list[SourceRecord],
) -> None:
    """A journal whose outputs are acknowledged is deleted, and the delete can wait in the
    producer's queue before the store drops the journal. A record of the session folded
    meanwhile must not take it for a crash's and send its outputs again (a one-worker run
    answered a flush request twice so: a compaction counted as ignored)."""
    _table, expected_sent = _expected(records)

    async def run() -> tuple[int, float | None, list[Output]]:
        backend = QueuedDeletes()
        runtime = _runtime(backend, backend.send)
        raced = 0
        durables = []
        for record in records:  # one record a batch, each folded while deletes wait
            folding = asyncio.ensure_future(runtime.fold(record))
            for _ in range(10):
                await asyncio.sleep(0)
            backend.hold = False
            raced += backend.release()
            while not folding.done():  # a replay would wait for its sends' acks
                await backend.ack_sends()
            durables.append(await runtime.commit())
            backend.hold = True
            await backend.ack_sends()
        backend.hold = False
        raced += backend.release()
        await backend.ack_sends()
        await asyncio.gather(*durables)
        replays = runtime.metrics.registry.get_sample_value("sessionfold_journal_replays_total")
        return raced, replays, backend.sent

    raced, replays, sent = asyncio.run(run())
    assert raced > 0  # some fold did run while a journal's delete waited
    assert replays == 0
    assert sorted(o.value for o in sent) == sorted(expected_sent)
