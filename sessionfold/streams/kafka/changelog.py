"""The fold table's changelog format: one record per session per batch, a ring of keys compaction
keeps bounded, and the recovery that applies them.

A fold commit hands the table one group of writes per session (kafka/table_store.py). Each group
goes to the changelog as one record, the session's journal of the batch: every row it puts (key
and value bytes) and every row it deletes, framed in binary (`encode_record`). One record per
session per batch, not one per row: the producer, the broker and recovery handle a few records
where they handled dozens.

Compaction keeps the last record of each key, and a journal holds only what its batch changed, so
journals cannot share one key. A session's records are numbered (its position, one up per record)
and keyed by the position modulo `RING` (`<sid>/rt/c/<partition>/<slot>`): compaction drops a
record only once the record `RING` positions later exists, so a partition read in offset order
always holds every record of the session's last `RING` positions, and of the ones before only
records whose later changes are gone with them (a record at position a outlives one at b > a
only while b + RING is unwritten, since a + RING comes first). Rows older than the ring would be
lost, so every `SNAPSHOT_RECORDS` records, or once the journals since the last snapshot outweigh
it, the session's whole state follows its journal as snapshot records: plain puts of the values
the table holds, which change nothing when applied in order, and need not land together. Recovery
applies every record in offset order; the state is the last complete snapshot with the journals
after it, all inside the ring.

A group larger than one record (`limit` bytes) goes as several parts, each its own record;
recovery applies a journal's parts only once it has read all of them in order, so a worker killed
between two leaves the state before the batch, which redelivery folds again.

Where the next record goes is a row of the table itself (`position_key`, in every record's puts),
so a local store that recovers from its persisted offset finds it, and a recovered memory store
has it from the records. Records with no `MAGIC` (an earlier version's one record per row) are
rows, applied as before.

A session id is taken to be a key's first part (`owner_of`): sessions whose ids share it (an id
containing `/`) share a ring, which is still one writer's per partition (the ring's keys name it).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import orjson

#: Opens every record of this format (a JSON row, the earlier format, never starts with a NUL).
MAGIC = b"\x00sfj1"
#: Keys per session in the ring: records compaction keeps per session, at most.
RING = 96
#: Records after which a snapshot follows a journal (a snapshot's parts count too).
SNAPSHOT_RECORDS = 48
#: Journal bytes since the last snapshot from which one is due however small that snapshot.
SNAPSHOT_MIN_BYTES = 64 * 1024

JOURNAL, SNAPSHOT = 0, 1

#: kind, position, part, parts, writes.
_HEAD = struct.Struct(">BQHHI")
#: key length, value length (`_DELETED`: a delete).
_ROW = struct.Struct(">HI")
_DELETED = 0xFFFFFFFF

#: One key's write: its value, or None to delete it.
Write = tuple[str, bytes | None]


def owner_of(key: str) -> str:
    """The session a table key belongs to: keys are `sid/part/...` (projections/store.py)."""
    return key.split("/", 1)[0]


def position_key(owner: str, partition: int) -> str:
    """The row holding where the session's next changelog record of `partition` goes."""
    return f"{owner}/rt/c/{partition}"


def record_key(owner: str, partition: int, position: int) -> str:
    """The changelog key of the session's record at `position`: its slot in the ring."""
    return f"{owner}/rt/c/{partition}/{position % RING}"


@dataclass(frozen=True, slots=True)
class Position:
    """Where a session's changelog stands: the next position, where the last complete snapshot
    starts, journal bytes written since it and its size."""

    next: int = 0
    snapshot: int = 0
    since: int = 0
    size: int = 0

    def encode(self) -> bytes:
        """The position row's value."""
        return orjson.dumps({"n": self.next, "s": self.snapshot, "b": self.since, "z": self.size})

    @classmethod
    def decode(cls, raw: bytes | None) -> Position:
        """A position row read back (none: a session with no record yet)."""
        if raw is None:
            return cls()
        body = orjson.loads(raw)
        return cls(body["n"], body["s"], body["b"], body["z"])

    def snapshot_due(self, records: int, min_bytes: int) -> bool:
        """Whether the journals since the last snapshot call for a new one: `records` records
        since it, or journal bytes since it past its size and `min_bytes`."""
        return self.next - self.snapshot >= records or self.since >= max(self.size, min_bytes)


@dataclass(frozen=True, slots=True)
class Record:
    """One changelog record read back."""

    kind: int
    position: int
    part: int
    parts: int
    writes: list[Write]


def write_bytes(key: str, value: bytes | None) -> int:
    """Bytes a write takes in a record."""
    return _ROW.size + len(key.encode()) + (0 if value is None else len(value))


def encode_record(
    kind: int, position: int, part: int, parts: int, writes: Sequence[Write]
) -> bytes:
    """A record's value: the head, then each write's key and value (or a delete)."""
    chunks = [MAGIC, _HEAD.pack(kind, position, part, parts, len(writes))]
    for key, value in writes:
        raw = key.encode()
        if value is None:
            chunks += (_ROW.pack(len(raw), _DELETED), raw)
        else:
            chunks += (_ROW.pack(len(raw), len(value)), raw, value)
    return b"".join(chunks)


def decode_record(value: bytes | None) -> Record | None:
    """A record of this format read back; None for anything else (a row of the earlier one)."""
    if value is None or not value.startswith(MAGIC):
        return None
    view = memoryview(value)
    at = len(MAGIC)
    kind, position, part, parts, count = _HEAD.unpack_from(view, at)
    at += _HEAD.size
    writes: list[Write] = []
    for _ in range(count):
        key_size, value_size = _ROW.unpack_from(view, at)
        at += _ROW.size
        key = bytes(view[at : at + key_size]).decode()
        at += key_size
        if value_size == _DELETED:
            writes.append((key, None))
        else:
            writes.append((key, bytes(view[at : at + value_size])))  # a copy of its own size
            at += value_size
    return Record(kind, position, part, parts, writes)


#: Bytes of a record besides its writes (magic and head), with room for the key.
RECORD_HEAD_BYTES = len(MAGIC) + _HEAD.size + 256


def split(writes: Sequence[Write], limit: int) -> list[list[Write]]:
    """`writes` in order, in parts of at most `limit` bytes each (a write larger alone is a part
    of its own, which the broker then refuses)."""
    parts: list[list[Write]] = [[]]
    size = RECORD_HEAD_BYTES
    for key, value in writes:
        cost = write_bytes(key, value)
        if parts[-1] and size + cost > limit:
            parts.append([])
            size = RECORD_HEAD_BYTES
        parts[-1].append((key, value))
        size += cost
    return parts


#: A changelog record to send: key and value.
Out = tuple[str, bytes]


class Writer:
    """Turns one session's group of writes into its changelog records; keeps each session's
    position from the moment its records are made (two groups of a session may be on their way
    at once), reading it from the table when it has none.

    `read` reads a table row; `rows(owner, partition)` lists a session's rows for a snapshot;
    `limit` is the largest record in bytes; `snapshot_records` and `snapshot_min_bytes` say when
    a snapshot is due (`Position.snapshot_due`).
    """

    def __init__(
        self,
        read: Callable[[str], bytes | None],
        rows: Callable[[str, int], Iterable[tuple[str, bytes]]],
        limit: int,
    ) -> None:
        self.read = read
        self.rows = rows
        self.limit = limit
        self.snapshot_records = SNAPSHOT_RECORDS
        self.snapshot_min_bytes = SNAPSHOT_MIN_BYTES
        self._positions: dict[tuple[str, int], Position] = {}
        #: Snapshots written, and records that could not keep the ring's promise (a state too
        #: large for the ring: its oldest records may be compacted before a snapshot holds them).
        self.snapshots = 0
        self.overflows = 0

    def forget(self, owner: str | None = None, partition: int | None = None) -> None:
        """Read positions from the table again: every session's, or one's (its records were
        not sent, or the table was recovered)."""
        if owner is None:
            self._positions.clear()
        else:
            self._positions.pop((owner, partition or 0), None)

    def position(self, owner: str, partition: int) -> Position:
        """Where the session's next record of `partition` goes."""
        found = self._positions.get((owner, partition))
        if found is None:
            found = Position.decode(self.read(position_key(owner, partition)))
        return found

    def records(self, group: Sequence[Write], partition: int) -> tuple[list[Out], list[Write]]:
        """The changelog records of one session's `group`, and the writes the table takes for
        it (the group and the session's position row).

        The journal's last part holds the position row as it stands after the journal; a
        snapshot's last part, as it stands after the snapshot (a snapshot cut short by a crash
        is made again by the next record).
        """
        owner = owner_of(group[0][0])
        row_key = position_key(owner, partition)
        room = write_bytes(row_key, Position(1 << 60, 1 << 60, 1 << 60, 1 << 60).encode())
        at = self.position(owner, partition)
        parts = split(group, self.limit - room)
        start = at.next
        after = Position(
            start + len(parts), at.snapshot, at.since + sum(map(_bytes_of, parts)), at.size
        )
        records = _encoded(JOURNAL, owner, partition, start, parts, (row_key, after.encode()))
        final = after
        if after.snapshot_due(self.snapshot_records, self.snapshot_min_bytes):
            rows = dict(self.rows(owner, partition))
            for key, value in group:
                if value is None:
                    rows.pop(key, None)
                else:
                    rows[key] = value
            rows.pop(row_key, None)
            snapshot = split(sorted(rows.items()), self.limit - room)
            size = sum(map(_bytes_of, snapshot))
            final = Position(after.next + len(snapshot), after.next, 0, size)
            row = (row_key, final.encode())
            records += _encoded(SNAPSHOT, owner, partition, after.next, snapshot, row)
            self.snapshots += 1
        if final.next - final.snapshot > RING:
            self.overflows += 1
        self._positions[(owner, partition)] = final
        return records, [*group, (row_key, final.encode())]


def _bytes_of(part: Sequence[Write]) -> int:
    return sum(write_bytes(k, v) for k, v in part)


def _encoded(
    kind: int,
    owner: str,
    partition: int,
    start: int,
    parts: Sequence[Sequence[Write]],
    row: Write,
) -> list[Out]:
    """`parts` as records from position `start`, `row` (the position row) in the last."""
    records: list[Out] = []
    for n, part in enumerate(parts):
        writes = [*part, row] if n == len(parts) - 1 else part
        value = encode_record(kind, start + n, n, len(parts), writes)
        records.append((record_key(owner, partition, start + n), value))
    return records


class Reader:
    """Recovery's side: each changelog record, read in offset order, as the writes it applies.

    A journal in parts is applied once all its parts are read, in order and one after another;
    parts that never complete (their writer was killed between two) are dropped.
    """

    def __init__(self) -> None:
        self._parts: dict[tuple[str, int], list[Record]] = {}

    def writes(self, key: str, value: bytes | None, partition: int) -> list[Write] | None:
        """The writes of the record at `key`; None for a record of the earlier format (a row)."""
        record = decode_record(value)
        if record is None:
            return None
        slot = (owner_of(key), partition)
        if record.kind == SNAPSHOT or record.parts == 1:
            self._parts.pop(slot, None)  # a journal cut short is never completed after this
            return record.writes
        pending = self._parts.get(slot)
        if record.part == 0:
            pending = self._parts[slot] = [record]
        elif (
            pending is not None
            and len(pending) == record.part
            and pending[-1].position + 1 == record.position
            and pending[0].parts == record.parts
        ):
            pending.append(record)
        else:
            self._parts.pop(slot, None)
            return []
        if len(pending) < record.parts:
            return []
        del self._parts[slot]
        return [write for part in pending for write in part.writes]
