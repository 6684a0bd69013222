"""The fold's state table, and the journal that keeps a batch's outputs until the broker has them.

The table maps string keys (`key(session_id, ...)`, e.g. `sid/pr/h`) to the orjson bytes of a
JSON-ready value. A worker killed between two writes of an event would leave a state that is
neither before nor after the event, so the runtime hands a session's writes over a batch to the
Backend as one group (`write_groups`), and a group lands in the changelog whole or not at all:
`FaustBackend` sends each group as one journal record (kafka/changelog.py), and as many records
of the same partition as fit as one record batch, which the broker appends as a unit.

The fold writes into a `WriteSet` (reads fall through to the table, or to the writes of the
records before it in the same batch: `Pending`), and the runtime commits a batch per session:
the session's keys (each once, its last value) in one group, and then its outputs (flush
requests, ledger pass requests, flush-metrics, on other topics). An output lost in a crash would
never be sent again, since redelivery skips an event whose sequence number the head record
already holds; so a session with outputs also gets a `Journal`, one changelog record under
`sid/rt/j` holding them, written in the same group as the keys (and so does each later batch of
the session while its journal is open, replacing it). Once the broker has acknowledged
the outputs, the journal is deleted. A journal still there when the next record of its session
arrives (a crash came between) is replayed: its outputs are answered idempotently downstream, so
sending them twice is harmless. The next batch is folded while the outputs are on their way
(worker/agents.py, `FoldRuntime.commit`): a session's next journal then carries the earlier one's
unacknowledged outputs, and only the session's latest journal is deleted. A journal may also hold
writes (puts and deletes, absolute values: replaying them is repeatable); this version writes
none, and replays those of journals an earlier one left. Runtime rows other than the journal live
under `sid/rt/` too: log positions (`o/<seq>`, and `s` for the session's first record), the
dead-letter count (`dl`) and each outstanding request as sent (`rq/<fold>`, so a recovered
worker can send it again: worker/agents.py, `outstanding_requests`).

A `Backend` returns an acknowledgement for every write; the runtime acknowledges a batch's source
records to Faust only when all of them (and its outputs) are acknowledged, so an offset is never
committed ahead of the state it produced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from sessionfold.projections.store import key

#: One key's write: its value, or None to delete it.
Write = tuple[str, bytes | None]


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

    async def write_groups(
        self, groups: Sequence[Sequence[Write]], partition: int, generation: int = 0
    ) -> Awaitable[Any]:
        """Apply `groups` in order, each whole or not at all; the acknowledgement of them all.

        `generation` is as for `write`.
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
        self._apply(key, value)
        return _done()

    async def write_groups(
        self, groups: Sequence[Sequence[Write]], partition: int, generation: int = 0
    ) -> Awaitable[Any]:
        """Apply every group now, each with one `update` of the mapping (then its deletes)."""
        for group in groups:
            last = dict(group)  # a key's last write in the group wins, as in the changelog
            self.data.update({k: right_sized(v) for k, v in last.items() if v is not None})
            for k in [k for k, v in last.items() if v is None]:
                self.data.pop(k, None)
        return _done()

    def _apply(self, key: str, value: bytes | None) -> None:
        if value is None:
            self.data.pop(key, None)
        else:
            self.data[key] = right_sized(value)


def _done() -> asyncio.Future[None]:
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


def start_key(session_id: str) -> str:
    """Where the log position of a session's first folded record is recorded: where a reader
    of the session's records in session-events starts (web/live_worker.py)."""
    return key(session_id, "rt", "s")


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


def key_writes(table: Backend, journal: Journal) -> list[Write]:
    """A journal's puts, and its deletes of keys the table holds (absolute values: repeatable)."""
    writes: list[Write] = list(journal.puts)
    writes += [(k, None) for k in journal.deletes if table.get(k) is not None]
    return writes


#: Bytes a record adds to a record batch besides its key and value, at most (varints, headers).
RECORD_OVERHEAD = 64


def record_batches(groups: Sequence[Sequence[Write]], limit: int) -> list[list[Write]]:
    """`groups` packed in order into record batches of at most `limit` bytes, no group split.

    A group larger than `limit` alone is a batch of its own (the broker then refuses it whole).
    """
    batches: list[list[Write]] = []
    current: list[Write] = []
    size = 0
    for group in groups:
        group_size = sum(len(k.encode()) + len(v or b"") + RECORD_OVERHEAD for k, v in group)
        if current and size + group_size > limit:
            batches.append(current)
            current, size = [], 0
        current += group
        size += group_size
    if current:
        batches.append(current)
    return batches


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
