"""The changelog fence (kafka/fence.py): which recovered records are taken, and the epochs written.

The property: a changelog made of owners' terms (each an epoch above the last), with a stalled
former owner's late writes landing anywhere after its successor's first write, recovers to the
state of the owners' writes alone, whether read in one pass (memory://) or resumed from a local
store's kept epoch (rocksdb://, reading some records again or none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.streams.kafka.fence import (
    FENCE_HEADER,
    Fence,
    decode_epoch,
    encode_epoch,
    epoch_of,
)


@dataclass(frozen=True)
class Record:
    """A changelog record as recovery sees it."""

    offset: int
    key: str
    value: int
    epoch: int
    late: bool  # a stalled former owner's


@st.composite
def changelogs(draw: st.DrawFn) -> list[Record]:
    """Owners' terms; after a successor's first write, its predecessor's late writes."""
    records: list[Record] = []
    epoch = 0
    values = iter(range(10**6))
    for term in range(draw(st.integers(1, 5))):
        previous = epoch
        epoch += draw(st.integers(1, 3))
        keys = draw(st.lists(st.sampled_from("klmn"), min_size=1, max_size=6))
        late = draw(st.lists(st.sampled_from("klmn"), max_size=4)) if term else []
        landing = draw(st.integers(1, len(keys)))
        for i, key in enumerate(keys):
            records.append(Record(len(records), key, next(values), epoch, False))
            if i + 1 == landing:
                for key_late in late:
                    records.append(Record(len(records), key_late, next(values), previous, True))
    return records


def replay(records: list[Record], fence: Fence, state: dict[str, int] | None = None) -> dict:
    """The state recovery builds: each key's last value the fence takes."""
    state = {} if state is None else state
    for r in records:
        if fence.admits(0, r.offset, r.epoch):
            state[r.key] = r.value
    return state


def owners_only(records: list[Record]) -> dict[str, int]:
    return {r.key: r.value for r in records if not r.late}


@settings(max_examples=500)
@given(changelogs())
def test_late_writes_change_no_recovered_state(records: list[Record]) -> None:
    assert replay(records, Fence()) == owners_only(records)


@settings(max_examples=500)  # a re-read that starts between a successor's write and a late one
@given(changelogs(), st.data())
def test_a_local_store_resumes_with_the_epoch_it_kept(records: list[Record], data: Any) -> None:
    """Part read, the highest epoch kept as a store keeps it; a new process reads on from any
    offset up to where the store stopped (records read again change nothing)."""
    stop = data.draw(st.integers(0, len(records)))
    first = Fence()
    state = replay(records[:stop], first)
    newest = first.newest(0)
    kept = None if newest is None else encode_epoch(newest.epoch)
    again = data.draw(st.integers(0, stop))
    second = Fence(load=lambda _p: None if kept is None else decode_epoch(kept))
    assert replay(records[again:], second, state) == owners_only(records)


def test_a_partition_read_again_from_the_start_is_fenced_afresh() -> None:
    """memory://: a partition assigned again is recovered from offset 0."""
    fence = Fence()
    assert fence.admits(0, 0, 3)
    assert fence.admits(0, 1, 7)
    assert not fence.admits(0, 2, 3)
    assert fence.admits(0, 0, 3)  # from the start again: no epoch 7 read yet


def test_records_with_no_epoch_are_taken_and_partitions_fenced_apart() -> None:
    fence = Fence()
    assert fence.admits(1, 0, 8)
    assert fence.admits(1, 1, None)  # exactly_once: no epoch
    assert not fence.admits(1, 2, 5)
    assert fence.admits(0, 3, 1)


def test_the_epoch_written_counts_on_past_what_was_recovered() -> None:
    """A group whose generations start again at 1 still writes above the changelog's epochs,
    and a process never writes a partition an epoch below one it wrote it before."""
    fence = Fence()
    assert fence.epoch(0, 4) == 4
    assert fence.epoch(0, 2) == 4
    fence.admits(1, 0, 57)
    assert fence.epoch(1, 1) == 58
    assert fence.epoch(1, 60) == 60


def test_a_local_store_fences_with_what_it_kept_and_the_floor_stays() -> None:
    """A kept write fences the store's next recovery; it does not raise the epochs written."""
    fence = Fence(load=lambda p: 9 if p == 2 else None)
    assert fence.epoch(2, 1) == 10
    fence.kept(2, 10)
    assert fence.epoch(2, 1) == 10
    assert not fence.admits(2, 40, 9)
    assert fence.admits(2, 41, 10)


def test_epochs_read_back_from_headers() -> None:
    assert decode_epoch(encode_epoch(12)) == 12
    assert epoch_of([("x", b"1"), (FENCE_HEADER, b"12")]) == 12
    assert epoch_of(None) is None and epoch_of([("x", b"12")]) is None
    for junk in (b"", b"-1", b"1.5", b"x", b"\xff"):
        assert decode_epoch(junk) is None


def test_a_local_store_is_asked_once_per_partition() -> None:
    """Writes ask for the epoch on every record; a store that keeps none is read once."""
    asked: list[int] = []
    fence = Fence(load=lambda p: asked.append(p))  # type: ignore[func-returns-value]
    for _ in range(3):
        fence.epoch(0, 2)
        fence.admits(1, 5, None)
    fence.forget()
    fence.epoch(0, 2)
    assert asked == [0, 1, 0]
