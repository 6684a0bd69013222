"""The summarizer agent's answer pool (worker/answers.py) with the agent's ack chain (app.py
`OrderedAcks`): whatever order the model's answers come back in, at most `limit` are out, at
most one per session, each session's in the order read, and records are acknowledged strictly
in offset order; a failed answer stops the chain, gives its record and every later one back to
be read again, and the agent's next submit raises it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.streams.worker.answers import AnswerPool
from sessionfold.streams.worker.app import OrderedAcks


@dataclass
class _Event:
    """A record as the agent holds it: acking it tells the log."""

    offset: int
    acked: list[int]

    def ack(self) -> None:
        self.acked.append(self.offset)


@dataclass
class _Model:
    """Answers the test releases one by one; checks what is out at any moment."""

    limit: int
    gates: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    running: dict[int, str] = field(default_factory=dict)  # offset -> key
    started: list[tuple[str, int]] = field(default_factory=list)
    most: int = 0

    def answer(self, key: str, offset: int, fail: bool = False) -> Any:
        async def run() -> int:
            assert key not in self.running.values(), "two answers of one session at once"
            self.running[offset] = key
            self.started.append((key, offset))
            self.most = max(self.most, len(self.running))
            gate = self.gates[offset] = asyncio.get_running_loop().create_future()
            await gate
            del self.running[offset]
            if fail:
                raise ConnectionError("broker away")
            return offset

        return run

    async def release(self, offset: int) -> None:
        while offset not in self.gates:  # not started yet: its turn comes
            await asyncio.sleep(0)
        self.gates[offset].set_result(None)
        for _ in range(5):
            await asyncio.sleep(0)


@given(
    keys=st.lists(st.sampled_from("abcd"), min_size=1, max_size=14),
    limit=st.integers(1, 5),
    data=st.data(),
)
@settings(max_examples=150, deadline=None)
def test_answers_run_at_once_per_session_in_order_and_are_acked_in_offset_order(
    keys: list[str], limit: int, data: st.DataObject
) -> None:
    """Records of random sessions, answers released in a random order: never more than `limit`
    out nor two of one session, each session's answers start in offset order, every answer
    resolves its record's durable and the records are acked in offset order, all of them."""

    async def run() -> None:
        model = _Model(limit)
        acked: list[int] = []
        given_back: list[Any] = []
        pool: AnswerPool[_Event] = AnswerPool(limit, given_back.extend)
        acks = OrderedAcks()
        pending = list(range(len(keys)))

        async def feed() -> None:
            for offset, key in enumerate(keys):
                event = _Event(offset, acked)
                acks.add(event, await pool.submit(key, event, model.answer(key, offset)))

        feeder = asyncio.ensure_future(feed())
        for _ in range(5):
            await asyncio.sleep(0)
        while pending:
            startable = [o for o in pending if o in model.running]
            assert startable, "nothing out while records wait: the pool is stuck"
            offset = data.draw(st.sampled_from(startable))
            pending.remove(offset)
            await model.release(offset)
            assert acked == list(range(len(acked))), "acked out of offset order"
        await feeder
        for _ in range(10):
            await asyncio.sleep(0)
        assert acked == list(range(len(keys)))
        assert model.most <= limit and not given_back and pool.out == 0
        for key in set(keys):
            mine = [o for k, o in model.started if k == key]
            assert mine == sorted(mine)

    asyncio.run(run())


def test_a_pool_answers_others_while_one_is_held() -> None:
    """With room for three, the second and third records are answered (their durables resolve)
    while the first is held; none is acked before the first."""

    async def run() -> None:
        model = _Model(3)
        acked: list[int] = []
        pool: AnswerPool[_Event] = AnswerPool(3, lambda _items: None)
        acks = OrderedAcks()
        durables = []
        for offset, key in enumerate("abc"):
            event = _Event(offset, acked)
            durables.append(await pool.submit(key, event, model.answer(key, offset)))
            acks.add(event, durables[-1])
        await asyncio.sleep(0)
        await model.release(1)
        await model.release(2)
        assert durables[1].done() and durables[2].done() and not durables[0].done()
        assert acked == []
        await model.release(0)
        assert acked == [0, 1, 2]

    asyncio.run(run())


def test_the_agent_stops_reading_while_the_pool_is_full() -> None:
    """A submit past `limit` waits until an answer is durable."""

    async def run() -> None:
        model = _Model(2)
        pool: AnswerPool[_Event] = AnswerPool(2, lambda _items: None)
        for offset, key in enumerate("ab"):
            await pool.submit(key, _Event(offset, []), model.answer(key, offset))
        third = asyncio.ensure_future(pool.submit("c", _Event(2, []), model.answer("c", 2)))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not third.done()
        await model.release(1)
        assert third.done()
        await model.release(0)
        await model.release(2)

    asyncio.run(run())


@pytest.mark.parametrize("waiting", [False, True], ids=["next-record", "waiting-for-room"])
def test_a_failed_answer_stops_the_chain_and_the_agent(waiting: bool) -> None:
    """The second of four answers fails (a send refused for another reason than size): the first
    is still acked, nothing after it is; its record and the later ones are given back to be read
    again, the earlier one is not; the error is raised at the agent's next submit, or at once
    to an agent waiting for room; that record is given back too."""

    async def run() -> None:
        model = _Model(4)
        acked: list[int] = []
        given_back: list[_Event] = []
        pool: AnswerPool[_Event] = AnswerPool(4 if waiting else 5, given_back.extend)
        acks = OrderedAcks()
        for offset, key in enumerate("abcd"):
            event = _Event(offset, acked)
            answer = model.answer(key, offset, fail=offset == 1)
            acks.add(event, await pool.submit(key, event, answer))
        last = _Event(9, acked)
        submit = None
        if waiting:
            submit = asyncio.ensure_future(pool.submit("e", last, model.answer("e", 9)))
            for _ in range(5):
                await asyncio.sleep(0)
            assert not submit.done()
        await model.release(1)
        assert [e.offset for e in given_back] == [1, 2, 3, *([9] if waiting else [])]
        with pytest.raises(ConnectionError):
            await (submit or pool.submit("e", last, model.answer("e", 9)))
        assert [e.offset for e in given_back] == [1, 2, 3, 9]
        for offset in (0, 2, 3):
            await model.release(offset)
        assert acked == [0] and pool.out == 0 and 9 not in model.gates
        with pytest.raises(ConnectionError):
            await pool.submit("f", _Event(10, acked), model.answer("f", 10))

    asyncio.run(run())


def test_a_session_answer_after_a_failed_one_is_not_asked() -> None:
    """A session's second record waits for its first; the first fails: the second is given back
    unanswered (the model never sees it)."""

    async def run() -> None:
        model = _Model(3)
        given_back: list[_Event] = []
        pool: AnswerPool[_Event] = AnswerPool(3, given_back.extend)
        first = await pool.submit("a", _Event(0, []), model.answer("a", 0, fail=True))
        second = await pool.submit("a", _Event(1, []), model.answer("a", 1))
        await model.release(0)
        await asyncio.gather(first, second, return_exceptions=True)
        assert [k for k, _ in model.started] == ["a"]
        assert [e.offset for e in given_back] == [0, 1]

    asyncio.run(run())
