"""The fold's state table, and the journal that makes one event's writes atomic and durable.

The table maps string keys (`key(session_id, ...)`, e.g. `sid/pr/h`) to the orjson bytes of a
JSON-ready value. Every write is one record on the table's changelog, so an event that writes five
keys is five records, and a worker killed between two of them would leave a state that is neither
before nor after the event; and an output (a flush request) lost in the same crash would never be
sent again, since redelivery skips an event whose sequence number the head record already holds.

So the fold writes into a `WriteSet` (reads fall through to the table, or to the writes of the
records before it in the same batch: `Pending`), and the runtime commits a batch per session as
a `Journal`: first the session's whole effect over the batch, writes (each key once, its last
value) and outputs, as one changelog record under `sid/rt/j`; then the keys; then the outputs;
and once the broker has acknowledged the outputs, the journal is deleted. A journal still there
when the next record of its session arrives (a crash came between) is replayed: its writes are
absolute values and its outputs are answered idempotently downstream, so doing it twice is
harmless; the batch's records, not acknowledged yet, are redelivered and ignored by sequence
number (a compaction by its request id). The next batch is folded while the outputs are on their
way (worker/agents.py, `FoldRuntime.commit`): a session's next journal then carries the earlier
one's unacknowledged outputs, and only the session's latest journal is deleted. Runtime rows other
than the journal live under `sid/rt/` too: log positions (`o/<seq>`), the dead-letter count (`dl`)
and each outstanding request as sent (`rq/<fold>`, so a recovered worker can send it again:
worker/agents.py, `outstanding_requests`).

A `Backend` returns an acknowledgement for every write; the runtime acknowledges a batch's source
records to Faust only when all of them (and its outputs) are acknowledged, so an offset is never
committed ahead of the state it produced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from sessionfold.projections.store import key


class Backend(Protocol):
    """The state table: immediate reads; writes that return their acknowledgement."""

    def get(self, key: str) -> bytes | None:
        """The value at `key`, or None."""
        ...

    def keys(self) -> Iterable[str]:
        """Every key held."""
        ...

    async def write(
        self, key: str, value: bytes | None, partition: int, generation: int = 0
    ) -> Awaitable[Any]:
        """Set `key` (None deletes it) in changelog partition `partition`; the acknowledgement.

        `generation` is the consumer generation the records behind the write were read in: the
        changelog record's fence epoch (kafka/fence.py).
        """
        ...


class MemoryBackend:
    """A Backend over a plain mapping, acknowledged at once (tests, tools)."""

    def __init__(self, data: MutableMapping[str, bytes] | None = None) -> None:
        self.data: MutableMapping[str, bytes] = {} if data is None else data

    def get(self, key: str) -> bytes | None:
        """The value at `key`, or None."""
        return self.data.get(key)

    def keys(self) -> Iterable[str]:
        """Every key held."""
        return self.data.keys()

    async def write(
        self, key: str, value: bytes | None, partition: int, generation: int = 0
    ) -> Awaitable[Any]:
        """Set or delete `key` now."""
        if value is None:
            self.data.pop(key, None)
        else:
            self.data[key] = right_sized(value)
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def right_sized(value: bytes) -> bytes:
    """`value` in an allocation of its own length, for a table that keeps it.

    orjson (3.12 and later) returns bytes whose buffer stays at least 4 KiB however short the
    JSON; the table keeps ~100 rows per session for the session's life, and 1,000 sessions'
    rows then held ~400 MB for ~20 MB of state. A copy costs a fraction of the encode.
    """
    return bytes(memoryview(value))


def journal_key(session_id: str) -> str:
    """Where a session's open journal lives."""
    return key(session_id, "rt", "j")


def offset_key(session_id: str, seq: int) -> str:
    """Where the log position of a session's toolResult entry `seq` is recorded."""
    return key(session_id, "rt", "o", seq)


def request_key(session_id: str, fold: str) -> str:
    """Where the request a session's `fold` (`pr` or `ledger`) waits on is kept, while it waits."""
    return key(session_id, "rt", "rq", fold)


def dead_letter_key(session_id: str) -> str:
    """Where a session's dead-letter count lives."""
    return key(session_id, "rt", "dl")


#: A key a batch deleted, in `Pending.values` (None is a value a fold may put).
DELETED: Any = object()


class Pending:
    """Writes folded but not committed yet, over the table: the values as put, DELETED for deletes.

    The records of one batch are folded one after another through a Pending: each reads what
    the ones before it wrote (the very objects, as with the embedded runtime's dict: nothing is
    encoded or decoded between them), and the table gets each key once, encoded once, when the
    batch is committed. A record whose fold fails may have changed such an object in place: the
    runtime then folds the batch's records again (worker/agents.py, `FoldRuntime.fold`).
    """

    def __init__(self, table: Backend) -> None:
        self.table = table
        self.values: dict[str, Any] = {}

    def get(self, key: str) -> Any | None:
        """The value the batch wrote at `key`, else the table's (decoded afresh)."""
        values = self.values
        if key in values:
            value = values[key]
            return None if value is DELETED else value
        raw = self.table.get(key)
        return None if raw is None else orjson.loads(raw)


class Reader(Protocol):
    """What a WriteSet reads through to."""

    def get(self, key: str) -> Any | None:
        """The value at `key`, or None."""
        ...


class TableStore:
    """Decoded reads of a Backend (writes go through a WriteSet and a Journal)."""

    def __init__(self, table: Backend) -> None:
        self.table = table

    def get(self, key: str) -> Any | None:
        """The decoded value at `key`, or None (a fresh object on every call)."""
        raw = self.table.get(key)
        return None if raw is None else orjson.loads(raw)


class WriteSet:
    """A Store that keeps one event's writes in memory and reads through to `base`.

    Reads are cached for the event, so within it a value read twice is the same object, as with
    the embedded runtime's dict.
    """

    def __init__(self, base: Reader) -> None:
        self.base = base
        self.puts: dict[str, Any] = {}
        self.deletes: set[str] = set()
        self._read: dict[str, Any] = {}

    def get(self, key: str) -> Any | None:
        """The value this event wrote, or else the base's."""
        if key in self.puts:
            return self.puts[key]
        if key in self.deletes:
            return None
        if key not in self._read:
            self._read[key] = self.base.get(key)
        return self._read[key]

    def put(self, key: str, value: Any) -> None:
        """Record a write."""
        self.deletes.discard(key)
        self.puts[key] = value

    def delete(self, key: str) -> None:
        """Record a delete."""
        self.puts.pop(key, None)
        self.deletes.add(key)


@dataclass(frozen=True, slots=True)
class Output:
    """One record an event sends: topic name, key (None: no key), value bytes."""

    topic: str
    key: bytes | None
    value: bytes


@dataclass(frozen=True, slots=True)
class Journal:
    """One event's effect: encoded writes, deletes and the records it sends."""

    puts: tuple[tuple[str, bytes], ...] = ()
    deletes: tuple[str, ...] = ()
    outputs: tuple[Output, ...] = ()

    @classmethod
    def of(cls, writes: WriteSet, outputs: Iterable[Output] = ()) -> Journal:
        """The journal of a write set (values encoded once, here)."""
        return cls(
            puts=tuple((k, orjson.dumps(v)) for k, v in writes.puts.items()),
            deletes=tuple(sorted(writes.deletes)),
            outputs=tuple(outputs),
        )

    @property
    def empty(self) -> bool:
        """Whether the event changed and sent nothing."""
        return not (self.puts or self.deletes or self.outputs)

    @property
    def atomic(self) -> bool:
        """Whether applying it takes one changelog record at most (no journal needed)."""
        return len(self.puts) + len(self.deletes) <= 1 and not self.outputs

    def encode(self) -> bytes:
        """The journal record: values embedded as they will be written (no re-encoding)."""
        return orjson.dumps(
            {
                "put": [[k, orjson.Fragment(v)] for k, v in self.puts],
                "del": list(self.deletes),
                "out": [[o.topic, _text(o.key), o.value.decode()] for o in self.outputs],
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> Journal:
        """Read a journal record back."""
        body = orjson.loads(raw)
        return cls(
            puts=tuple((k, orjson.dumps(v)) for k, v in body["put"]),
            deletes=tuple(body["del"]),
            outputs=tuple(Output(t, _bytes(k), v.encode()) for t, k, v in body["out"]),
        )


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode()


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


async def write_keys(
    table: Backend, journal: Journal, partition: int, generation: int = 0
) -> list[Awaitable[Any]]:
    """Apply a journal's writes and deletes (absolute values: repeatable); their acks."""
    acks = [await table.write(k, value, partition, generation) for k, value in journal.puts]
    for k in journal.deletes:
        if table.get(k) is not None:
            acks.append(await table.write(k, None, partition, generation))
    return acks


def open_journal(table: Backend, session_id: str) -> Journal | None:
    """The journal a session has open (a crash interrupted its last event), or None."""
    raw = table.get(journal_key(session_id))
    return None if raw is None else Journal.decode(raw)


def read_view(table: Backend, session_id: str) -> WriteSet:
    """A read-only view of one session: the table with any open journal applied over it.

    Writes go to the view and are dropped (reading a session must never change it).
    """
    view = WriteSet(TableStore(table))
    journal = open_journal(table, session_id)
    if journal is not None:
        for k, value in journal.puts:
            view.put(k, orjson.loads(value))
        for k in journal.deletes:
            view.delete(k)
    return view
