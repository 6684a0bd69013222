"""The fold worker's cache of session logs (web/live_worker.py), over a partition in memory: the
integration test (tests/integration/test_kafka_live.py) runs it on the broker.

- however the partition grows between fills (other sessions' records between, duplicates of a
  republish, kinds the view does not take), the cache holds the session's entries and compact
  points once each in sequence order, the last sequence number of every event, and a fill reads
  each record of the partition once: a call costs what arrived since the last one;
- it starts at the session's first record, as the fold recorded it;
- it keeps at most `capacity` sessions, the least recently asked going first.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.events.envelope import (
    CommandEnvelope,
    CommandPayload,
    EntryEnvelope,
    EntryPayload,
    UsageEnvelope,
    UsagePayload,
    encode,
)
from sessionfold.projections.store import DictStore
from sessionfold.streams.kafka.key_reader import KeyRecords
from sessionfold.streams.kafka.table_store import start_key
from sessionfold.streams.web.live_worker import SessionLogs


class Partition:
    """A partition's records in memory, read as `KeyReader.read` reads them; reads counted."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes]] = []
        self.scanned = 0

    def read(self, partition: int, start: int | None, key: bytes) -> KeyRecords:
        first = start or 0
        found = []
        for offset in range(first, len(self.records)):
            self.scanned += 1
            record_key, value = self.records[offset]
            if record_key == key:
                found.append((offset, value))
        return KeyRecords(found, len(self.records))


def _envelope(session_id: str, seq: int, kind: str) -> bytes:
    if kind == "entry":
        entry = {"type": "message", "id": f"e{seq}", "message": {"role": "user", "content": "x"}}
        return encode(
            EntryEnvelope(session_id=session_id, seq=seq, payload=EntryPayload(entry=entry))
        )
    if kind == "compact":
        payload = CommandPayload(name="compact")
        return encode(CommandEnvelope(session_id=session_id, seq=seq, payload=payload))
    return encode(UsageEnvelope(session_id=session_id, seq=seq, payload=UsagePayload(tokens=seq)))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["entry", "compact", "usage"]),
            st.integers(0, 3),  # records of other sessions before it
            st.booleans(),  # published twice (a republish)
        ),
        min_size=1,
        max_size=40,
    ),
    st.lists(st.integers(1, 40), max_size=8),
    st.integers(0, 5),
)
def test_fills_read_each_record_once_and_keep_each_event_once(
    events: list[tuple[str, int, bool]], cuts: list[int], before: int
) -> None:
    """Fills at any points of the partition's growth give the session's events, once each."""
    partition = Partition()
    partition.records += [(b"other", _envelope("other", n + 1, "usage")) for n in range(before)]
    store = DictStore()
    store.put(start_key("s"), {"p": 0, "o": before})
    logs = SessionLogs(partition, partitions=1, capacity=4)  # type: ignore[arg-type]
    stops = sorted({min(c, len(events)) for c in cuts} | {len(events)})
    published = 0
    for stop in stops:
        for seq in range(published + 1, stop + 1):
            kind, others, twice = events[seq - 1]
            partition.records += [(b"other", _envelope("other", 99, "usage"))] * others
            partition.records.append((b"s", _envelope("s", seq, kind)))
            if twice:
                partition.records.append((b"s", _envelope("s", seq, kind)))
        published = stop
        log = asyncio.run(logs.fill("s", store, stop))
        assert log.last_seq == stop
        entries, compacts = log.upto(stop)
        kinds = [k for k, _, _ in events[:stop]]
        assert [e.seq for e in entries] == [n for n, k in enumerate(kinds, 1) if k == "entry"]
        assert [c[0] for c in compacts] == [n for n, k in enumerate(kinds, 1) if k == "compact"]
        assert all(log.entry_at(e.seq) is e.entry for e in entries)
    assert partition.scanned == len(partition.records) - before  # each record once, from start
    cut = stops[0]
    entries, _ = log.upto(cut)
    assert all(e.seq <= cut for e in entries)


def test_a_filled_log_reads_nothing_and_the_least_recently_asked_goes_first() -> None:
    """A session holding the asked seq reads no record; a third session evicts the first, which
    is read again from its start when asked again."""
    partition = Partition()
    store = DictStore()
    for session_id in ("a", "b", "c"):
        store.put(start_key(session_id), {"p": 0, "o": len(partition.records)})
        partition.records.append((session_id.encode(), _envelope(session_id, 1, "entry")))
    logs = SessionLogs(partition, partitions=1, capacity=2)  # type: ignore[arg-type]

    async def run() -> list[Any]:
        await logs.fill("a", store, 1)
        scanned = partition.scanned
        await logs.fill("a", store, 1)
        assert partition.scanned == scanned  # nothing to read: the cache holds seq 1
        await logs.fill("b", store, 1)
        await logs.fill("c", store, 1)
        evicted = list(logs.sessions)
        again = await logs.fill("a", store, 1)
        return [evicted, [e.seq for e in again.entries], list(logs.sessions)]

    assert asyncio.run(run()) == [["b", "c"], [1], ["c", "a"]]
