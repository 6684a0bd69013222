"""The fold worker's cache of session logs (web/live_worker.py), over a partition in memory: the
integration test (tests/integration/test_kafka_live.py) runs it on the broker.

- however the partition grows between fills (other sessions' records between, duplicates of a
  republish, kinds the view does not take), the cache holds the session's entries and compact
  points once each in sequence order, the last sequence number of every event, and a fill reads
  each record of the partition once: a call costs what arrived since the last one;
- it starts at the session's first record, as the fold recorded it;
- it keeps at most `capacity` sessions, the least recently asked going first;
- over the table the fold leaves, the context route renders what `sessionfold context` does,
  and a log it cannot read makes a stale answer (context) or a 503 (recall), not a 500;
- the plan route's answer is the rewrite of that render, in serve's JSON.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
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
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.projections.ledger.config import DEFAULT_LEDGER
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.store import DictStore
from sessionfold.projections.views.context import apply_patch
from sessionfold.streams.cli.context import view_from_replay
from sessionfold.streams.kafka.key_reader import KeyRecords
from sessionfold.streams.kafka.table_store import MemoryBackend, read_view, start_key
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.runtime.embedded import EmbeddedRuntime
from sessionfold.streams.tools.replay import Collector, replay_files
from sessionfold.streams.tools.synthetic import generate_session, write_session
from sessionfold.streams.web.live_contract import epoch_of, plan_json, unknown_plan
from sessionfold.streams.web.live_worker import LogUnavailable, SessionLogs, WorkerLive


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


# --- the routes over a folded state ------------------------------------------------------------


class Failing:
    """A reader whose every read fails, as one does while the broker is unreachable."""

    def read(self, partition: int, start: int | None, key: bytes) -> KeyRecords:
        raise ConnectionError("broker down")


def _folded(path: Path, upto: int) -> tuple[MemoryBackend, Partition, list[Any]]:
    """The worker's table and partition for the first `upto` lines of a session file."""
    cut = path.with_suffix(".cut.jsonl")
    cut.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:upto]))
    runtime = EmbeddedRuntime()
    partition = Partition()
    records = [r for r in read_session_file(cut) if not isinstance(r, DeadLetter)]
    for record in records:
        runtime.publish(record)
        partition.records.append((record.session_id.encode(), encode(record)))
    state = MemoryBackend({k: orjson.dumps(v) for k, v in runtime.store.items()})
    state.data[start_key(records[0].session_id)] = orjson.dumps({"p": 0, "o": 0})
    cut.unlink()
    return state, partition, records


def _cli_view(path: Path, session_id: str, upto: int) -> tuple[bytes, list[dict[str, Any]]]:
    cut = path.with_suffix(".cli.jsonl")
    cut.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:upto]))
    collector = Collector(session_id)
    replayer = replay_files([cut], DEFAULT_CONFIG, [session_id], on_folded=collector)
    view = view_from_replay(replayer, collector, DEFAULT_CONFIG)
    cut.unlink()
    return orjson.dumps(view.to_json()), view.unpruned


def test_the_context_at_each_user_message_is_the_context_commands(tmp_path: Path) -> None:
    """Over the table a fold leaves at a user message, the route renders `sessionfold context
    FILE --format json` of the file cut there; unsettled it waits, then answers stale."""
    path = write_session(tmp_path, generate_session(5, 40)).path
    lines = path.read_bytes().splitlines()
    users = [
        (n, entry["id"])
        for n, entry in enumerate((orjson.loads(line) for line in lines), start=1)
        if entry.get("type") == "message" and entry["message"]["role"] == "user"
    ]
    changed = 0
    for upto, leaf in users:
        state, partition, records = _folded(path, upto)
        session_id = records[0].session_id
        live = WorkerLive(
            state, SessionLogs(partition, 1, 4), DEFAULT_CONFIG, DEFAULT_LEDGER, OfflineModel()
        )  # type: ignore[arg-type]
        expected, pi_array = _cli_view(path, session_id, upto)
        answer = asyncio.run(live.context(session_id, {"leaf": leaf, "messages": pi_array}))
        cli = orjson.loads(expected)
        assert answer["stale"] is False and answer["reason"] is None
        assert orjson.dumps(answer["tokens"]) == orjson.dumps(cli["tokens"])
        assert orjson.dumps(answer.get("messages", pi_array)) == orjson.dumps(cli["messages"])
        shape = [[m["role"], m.get("toolCallId")] for m in pi_array]
        slim = {"leaf": leaf, "shape": shape, "answer": "patch"}
        patched = asyncio.run(live.context(session_id, slim))
        got = apply_patch(patched.pop("patch"), pi_array) if patched["changed"] else pi_array
        assert orjson.dumps(got) == orjson.dumps(cli["messages"])
        assert patched == {k: v for k, v in answer.items() if k != "messages"}
        changed += answer["changed"]
    assert changed > 0
    unfolded = {"leaf": "not-folded", "messages": [], "wait_ms": 50}
    started = time.monotonic()
    stale = asyncio.run(live.context(session_id, unfolded))
    assert stale["stale"] is True and time.monotonic() - started >= 0.05


def test_an_unreadable_log_answers_stale_and_recall_refuses_with_a_503_reason(
    tmp_path: Path,
) -> None:
    """A worker that cannot read session-events keeps pi's array (stale, `log-unavailable`) and
    its recall raises LogUnavailable (the state API's 503), never a traceback's 500."""
    path = write_session(tmp_path, generate_session(5, 20)).path
    state, _partition, records = _folded(path, len(path.read_bytes().splitlines()))
    session_id = records[0].session_id
    live = WorkerLive(
        state, SessionLogs(Failing(), 1, 4), DEFAULT_CONFIG, DEFAULT_LEDGER, OfflineModel()
    )  # type: ignore[arg-type]
    answer = asyncio.run(live.context(session_id, {"leaf": None, "messages": [], "wait_ms": 30}))
    assert (answer["stale"], answer["changed"], answer["reason"]) == (
        True,
        False,
        "log-unavailable",
    )
    with pytest.raises(LogUnavailable):
        asyncio.run(live.recall(session_id, {"ids": ["t1"]}))


def test_the_plan_at_each_user_message_is_the_rewrite_of_the_context_commands_render(
    tmp_path: Path,
) -> None:
    """The plan route's answer over the table a fold leaves is `rewrite_plan` of `sessionfold
    context FILE`'s render there, in the JSON serve's plan route answers (live_contract.py);
    a session the table lacks is `known: false`; a log it cannot read raises LogUnavailable
    (the state API's 503)."""
    path = write_session(tmp_path, generate_session(5, 40)).path
    lines = path.read_bytes().splitlines()
    users = [
        n
        for n, entry in enumerate((orjson.loads(line) for line in lines), start=1)
        if entry.get("type") == "message" and entry["message"]["role"] == "user"
    ]
    rewritten = 0
    for upto in [*users[1:], len(lines)]:
        state, partition, records = _folded(path, upto)
        session_id = records[0].session_id
        live = WorkerLive(
            state, SessionLogs(partition, 1, 4), DEFAULT_CONFIG, DEFAULT_LEDGER, OfflineModel()
        )  # type: ignore[arg-type]
        cut = path.with_suffix(".plan.jsonl")
        cut.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:upto]))
        collector = Collector(session_id)
        replayer = replay_files([cut], DEFAULT_CONFIG, [session_id], on_folded=collector)
        view = view_from_replay(replayer, collector, DEFAULT_CONFIG)
        cut.unlink()
        store = read_view(state, session_id)
        expected = plan_json(session_id, view, epoch_of(store, session_id))
        got = asyncio.run(live.plan(session_id))
        assert got == expected
        rewritten += bool(orjson.loads(got)["results"])
    assert rewritten > 0
    assert asyncio.run(live.plan("nobody")) == unknown_plan("nobody")
    assert orjson.loads(unknown_plan("nobody")) == {
        "session": "nobody",
        "known": False,
        "results": {},
        "chains": [],
    }
    broken = WorkerLive(
        state, SessionLogs(Failing(), 1, 4), DEFAULT_CONFIG, DEFAULT_LEDGER, OfflineModel()
    )  # type: ignore[arg-type]
    with pytest.raises(LogUnavailable):
        asyncio.run(broken.plan(session_id))
