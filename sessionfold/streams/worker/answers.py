"""The summarizer agent's answers, several at once (`sessionfold worker --answer-threads`).

A model that takes seconds must not hold every other session's flush: `AnswerPool` runs up to
`limit` answers at once, at most one per session key (a key's answers start in the order its
records were read), and the agent stops reading records while `limit` are out (back-pressure).
Each answer is a task that resolves once it is sent and acknowledged by the broker: the agent
hands it to `OrderedAcks` as the record's `durable`, so records are still acknowledged strictly
in offset order, whatever order the answers come back in.

A failed answer (a send the producer or the broker refused for another reason than its size)
stops the ack chain: no record read after it is acknowledged. Those records and the failed one
go to `on_failure` (the consumer reads them again), and the agent's next `submit` raises the
error, which crashes the agent as the inline answer did. Logs carry counts and error classes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from functools import partial
from typing import Any, Generic, TypeVar

from sessionfold.streams.runtime.live import DEFAULT_ANSWER_THREADS

log = logging.getLogger(__name__)

Item = TypeVar("Item")


class AnswerStopped(Exception):
    """An earlier answer of the same key failed: this one is read again too, not answered."""


class AnswerPool(Generic[Item]):
    """Up to `limit` answers out at once, one per key at a time, each key's in submission order.

    `item` (the agent's record) travels with its answer only to be handed back to
    `on_failure` when it cannot be acknowledged any more.
    """

    def __init__(self, limit: int, on_failure: Callable[[list[Item]], None]) -> None:
        self.limit = max(1, limit)
        self.on_failure = on_failure
        #: The first answer's error; every later `submit` raises it.
        self.failure: BaseException | None = None
        #: Answers out, in submission order (dicts keep it): the ack chain's order.
        self._out: dict[asyncio.Future[Any], Item] = {}
        self._given_back: set[asyncio.Future[Any]] = set()
        self._last: dict[Hashable, asyncio.Future[Any]] = {}
        self._wake: asyncio.Future[None] | None = None

    @property
    def out(self) -> int:
        """Answers submitted and not yet durable."""
        return len(self._out)

    async def submit(
        self, key: Hashable, item: Item, answer: Callable[[], Awaitable[Any]]
    ) -> asyncio.Future[Any]:
        """Start `answer()` (after the key's earlier answer), once fewer than `limit` are out; a
        task resolving with what `answer()` resolves to. Raises an earlier answer's error."""
        while self.failure is None and len(self._out) >= self.limit:
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake
        if self.failure is not None:
            self.on_failure([item])  # read, never to be acknowledged here
            raise self.failure
        task = asyncio.ensure_future(self._answer(self._last.get(key), answer))
        self._out[task] = item
        self._last[key] = task
        task.add_done_callback(partial(self._done, key))
        return task

    async def _answer(
        self, previous: asyncio.Future[Any] | None, answer: Callable[[], Awaitable[Any]]
    ) -> Any:
        if previous is not None:
            await asyncio.wait([previous])
            if previous.cancelled() or previous.exception() is not None:
                raise AnswerStopped
        return await answer()

    def _done(self, key: Hashable, task: asyncio.Future[Any]) -> None:
        if self._last.get(key) is task:
            del self._last[key]
        error = None if task.cancelled() else task.exception()
        if error is not None and task not in self._given_back:
            # Nothing from this record on is acknowledged any more (OrderedAcks stops at it).
            later = list(self._out)
            back = [t for t in later[later.index(task) :] if t not in self._given_back]
            self._given_back.update(back)
            if self.failure is None:
                self.failure = error
                log.error(
                    "an answer was not sent; its record and later ones are read again",
                    extra={"error": type(error).__name__, "records": len(back)},
                )
            self.on_failure([self._out[t] for t in back])
        del self._out[task]
        self._given_back.discard(task)
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)


__all__ = ["DEFAULT_ANSWER_THREADS", "AnswerPool", "AnswerStopped"]
