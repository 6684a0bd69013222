"""The changelog's fence against a worker that writes after it lost its partitions.

A worker that stalls past its session timeout (SIGSTOP, a long pause) is dropped from the group
and its partitions go to another worker, which recovers their state from the changelog and folds
on. StallGuard keeps the stalled worker from committing a batch once it resumes, but writes it had
handed to the producer before the stall still go out after it: they land in the changelog behind
the new owner's, and the next recovery of the partition would take their older values (a session
back to an older sequence number, or waiting on a request already answered).

So every changelog record the fold writes carries an epoch in its `sf-fence` header: the consumer
generation its batch was read in, raised to one past the highest epoch recovered from the
partition (a group whose metadata expired counts its generations from 1 again) and never below an
epoch the process wrote to the partition before (its own records stay in order). Recovery reads a
partition's records in order and skips a record whose epoch is below the highest it has read. A
record with no epoch (exactly_once writes, which Faust's transactions fence already) is taken.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

#: The header that carries a changelog record's epoch.
FENCE_HEADER = "sf-fence"


def encode_epoch(epoch: int) -> bytes:
    """A header value."""
    return str(epoch).encode()


def decode_epoch(raw: bytes) -> int | None:
    """A header value read back (None: not an epoch)."""
    return int(raw) if raw.isdigit() else None


def epoch_of(headers: Iterable[tuple[str, bytes]] | None) -> int | None:
    """The epoch among a record's headers, or None."""
    for name, value in headers or ():
        if name == FENCE_HEADER and value is not None:
            return decode_epoch(bytes(value))
    return None


@dataclass(frozen=True, slots=True)
class Newest:
    """The highest epoch read from a partition, and the offset of the record last read.

    It holds for the records after that offset only: a partition read again from an earlier
    offset (a memory:// worker recovers it from the start) is fenced afresh. A local store's
    (offset None) holds for every record its recovery reads: the store has applied the records
    up to its persisted offset already, and reading some again changes nothing.
    """

    epoch: int
    offset: int | None


class Fence:
    """Per changelog partition, the highest epoch recovered: which records to take, and which
    epoch to write with.

    `load` gives the highest epoch a partition's local store kept (rocksdb://, whose recovery
    starts at its persisted offset), or None.
    """

    def __init__(self, load: Callable[[int], int | None] = lambda _partition: None) -> None:
        self.load = load
        self._newest: dict[int, Newest] = {}  # what recovery fences with
        self._loaded: set[int] = set()  # partitions `load` was asked about (once each)
        self._floor: dict[int, int] = {}  # one past the highest epoch recovered
        self._written: dict[int, int] = {}  # the highest epoch this process wrote

    def newest(self, partition: int) -> Newest | None:
        """The highest epoch recovered from `partition` (or kept by its local store), or None."""
        newest = self._newest.get(partition)
        if newest is None and partition not in self._loaded:
            # Once per partition: writes ask on every record, and a store with nothing kept
            # (a fresh one) would be read each time.
            self._loaded.add(partition)
            kept = self.load(partition)
            if kept is not None:
                newest = self._newest[partition] = Newest(kept, None)
                self._raise_floor(partition, kept)
        return newest

    def admits(self, partition: int, offset: int, epoch: int | None) -> bool:
        """Whether recovery takes the record at `offset` of `partition`, of `epoch`."""
        newest = self.newest(partition)
        if newest is not None and newest.offset is not None and offset <= newest.offset:
            newest = None  # read again from an earlier offset
        if newest is not None and epoch is not None and epoch < newest.epoch:
            return False
        if epoch is not None:
            self._raise_floor(partition, epoch)
        if newest is not None or epoch is not None:
            highest = max(epoch or 0, 0 if newest is None else newest.epoch)
            self._newest[partition] = Newest(highest, offset)
        return True

    def admitted(self, events: Iterable[Any]) -> list[Any]:
        """The changelog events (Faust's) recovery takes, in order."""
        taken = []
        for event in events:
            message = event.message
            if self.admits(message.partition, message.offset, epoch_of(message.headers)):
                taken.append(event)
        return taken

    def epoch(self, partition: int, generation: int) -> int:
        """The epoch of a write to `partition` of what was read in consumer `generation`."""
        self.newest(partition)  # a local store's epoch raises the floor
        epoch = max(generation, self._floor.get(partition, 0), self._written.get(partition, 0))
        self._written[partition] = epoch
        return epoch

    def kept(self, partition: int, epoch: int) -> None:
        """Note a write of this process's that a local store holds now, with its offset as the
        store's persisted offset: the store's next recovery fences with its epoch."""
        newest = self.newest(partition)
        highest = epoch if newest is None else max(epoch, newest.epoch)
        self._newest[partition] = Newest(highest, None)

    def forget(self) -> None:
        """The store was emptied, to be recovered from the start: fence afresh (the epochs this
        process writes still count on from the highest it has read or written)."""
        self._newest.clear()
        self._loaded.clear()

    def _raise_floor(self, partition: int, epoch: int) -> None:
        self._floor[partition] = max(self._floor.get(partition, 0), epoch + 1)
