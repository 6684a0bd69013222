"""The fold table's changelog format (kafka/changelog.py): one journal record per session's group
of writes, a ring of keys per session, snapshots, parts, and recovery applying them in order.

The property: whatever compaction dropped and wherever the writer was killed, the records read
back in offset order give the table the writer held after its last group that reached the log
whole; a writer restarted on that table writes on, and the property holds again.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.streams.kafka import changelog
from sessionfold.streams.kafka.changelog import Reader, Write, Writer

PARTITION = 3
SESSIONS = ("a", "b")

values = st.one_of(st.none(), st.binary(min_size=0, max_size=120))
groups = st.tuples(
    st.sampled_from(SESSIONS),
    st.lists(st.tuples(st.integers(0, 7), values), min_size=1, max_size=6),
)


def _group(session: str, writes: list[tuple[int, bytes | None]]) -> list[Write]:
    return [(f"{session}/pr/{n}", value) for n, value in writes]


class Worker:
    """A writer over a dict table, and the changelog partition it appends to."""

    def __init__(self, table: dict[str, bytes], log: list[tuple[str, bytes]], limit: int) -> None:
        self.table = table
        self.log = log
        self.writer = Writer(table.get, self.rows, limit)
        #: After each group: where its journal ends in the log, and the table then.
        self.done: list[tuple[int, dict[str, bytes]]] = []

    def rows(self, owner: str, _partition: int) -> Iterable[tuple[str, bytes]]:
        return [(k, v) for k, v in self.table.items() if k.startswith(f"{owner}/")]

    def write(self, group: list[Write]) -> None:
        records, writes = self.writer.records(group, PARTITION)
        journal_parts = sum(
            1 for _k, v in records if (r := changelog.decode_record(v)) and r.kind == 0
        )
        self.log += records
        for key, value in writes:
            if value is None:
                self.table.pop(key, None)
            else:
                self.table[key] = value
        self.done.append((len(self.log) - len(records) + journal_parts, dict(self.table)))


def _rows(table: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in table.items() if "/rt/c/" not in k}


def compacted(log: list[tuple[str, bytes]], cleaned: int) -> list[tuple[str, bytes]]:
    """The log after the cleaner went over its first `cleaned` records: each record there whose
    key has a later record there is gone (Kafka's cleaner, at its most thorough)."""
    last = {key: offset for offset, (key, _value) in enumerate(log[:cleaned])}
    return [
        (key, value)
        for offset, (key, value) in enumerate(log)
        if offset >= cleaned or last[key] == offset
    ]


def recovered(log: Iterable[tuple[str, bytes]]) -> dict[str, bytes]:
    """A table rebuilt by reading `log` in order."""
    reader = Reader()
    table: dict[str, bytes] = {}
    for key, value in log:
        writes = reader.writes(key, value, PARTITION)
        assert writes is not None
        for row, row_value in writes:
            if row_value is None:
                table.pop(row, None)
            else:
                table[row] = row_value
    return table


def expected(worker: Worker, end: int) -> dict[str, bytes]:
    """The table after the last group whose journal lies whole in the log's first `end`."""
    state: dict[str, bytes] = {}
    for journal_end, table in worker.done:
        if journal_end <= end:
            state = table
    return state


@pytest.fixture(autouse=True)
def small_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ring and snapshot thresholds small enough for a short run to wrap around many times."""
    monkeypatch.setattr(changelog, "RING", 24)
    monkeypatch.setattr(changelog, "SNAPSHOT_RECORDS", 4)
    monkeypatch.setattr(changelog, "SNAPSHOT_MIN_BYTES", 600)


@settings(max_examples=300, deadline=None)
@given(
    before=st.lists(groups, min_size=1, max_size=40),
    after=st.lists(groups, max_size=20),
    limit=st.sampled_from([400, 700, 100_000]),
    data=st.data(),
)
def test_records_read_back_in_order_give_the_table(
    before: list[tuple[str, list[tuple[int, bytes | None]]]],
    after: list[tuple[str, list[tuple[int, bytes | None]]]],
    limit: int,
    data: st.DataObject,
) -> None:
    """Killed anywhere, compacted anyhow, restarted on what it recovers: the table read back is
    the writer's after its last whole group, every time."""
    log: list[tuple[str, bytes]] = []
    first = Worker({}, log, limit)
    for session, writes in before:
        first.write(_group(session, writes))
    assert first.writer.overflows == 0
    assert recovered(log) == first.table
    cut = data.draw(st.integers(0, len(log)), label="killed after")
    del log[cut:]
    cleaned = data.draw(st.integers(0, cut), label="cleaned")
    table = recovered(compacted(log, cleaned))
    # The rows; the position row may be the journal's when its snapshot was cut short.
    assert _rows(table) == _rows(expected(first, cut))

    second = Worker(table, log, limit)  # a new worker recovers and folds on
    for session, writes in after:
        second.write(_group(session, writes))
    cleaned = data.draw(st.integers(0, len(log)), label="cleaned again")
    assert recovered(compacted(log, cleaned)) == second.table
    assert all(len(k) + len(v) <= limit for k, v in log) or limit < 1_000


def test_a_record_holds_its_writes_and_deletes() -> None:
    """Encoded and decoded: kind, position, part, the writes in order (None: a delete)."""
    writes: list[Write] = [("s/pr/h", b'{"seq":1}'), ("s/gone", None), ("s/e", b"")]
    value = changelog.encode_record(changelog.JOURNAL, 7, 1, 3, writes)
    assert changelog.decode_record(value) == changelog.Record(0, 7, 1, 3, writes)
    assert changelog.decode_record(b'{"seq":1}') is None  # a row of the earlier format


def test_compaction_keeps_a_bounded_number_of_records_per_session() -> None:
    """However long a session writes, compaction leaves at most its ring's records."""
    log: list[tuple[str, bytes]] = []
    worker = Worker({}, log, 100_000)
    for n in range(500):
        worker.write([(f"a/pr/{n % 50}", b"x" * 50), ("a/pr/h", str(n).encode())])
    kept = compacted(log, len(log))
    assert len(kept) <= changelog.RING
    assert recovered(kept) == worker.table
    assert worker.writer.snapshots > 0
