"""The ledger fold: commands, errors, user messages, World, barrier, formats, real sessions."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.events.envelope import (
    CompactRequestEnvelope,
    EntryEnvelope,
    EntryPayload,
    WorldEnvelope,
    WorldPayload,
)
from sessionfold.events.ledger import LEDGER_PRODUCER, SPAN_RECORD_TYPE
from sessionfold.projections.ledger.fold import LedgerFold, path_digest
from sessionfold.projections.ledger.state import canonical_json, ledger_key, load_head, snapshot
from sessionfold.projections.pruning import fold as session_fold
from sessionfold.projections.store import DictStore
from sessionfold.streams.publishing.session_file import read_session_file

SESSIONS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "sessions"
SID = "sess-1"


def real_session(name: str) -> Path:
    """A real session file from ../shared, or a skip naming where it was looked for."""
    path = SESSIONS / name
    if not path.is_file():
        pytest.skip(f"real session {name} not found in {SESSIONS} (../shared is absent)")
    return path


def entry(seq: int, body: dict[str, Any]) -> EntryEnvelope:
    """An entry envelope at `seq` whose entry id is e<seq>."""
    full = {"id": f"e{seq}", "parentId": None, "timestamp": "2025-01-01T00:00:00Z", **body}
    return EntryEnvelope(session_id=SID, seq=seq, payload=EntryPayload(entry=full))


def user(seq: int, text: str) -> EntryEnvelope:
    """A user message."""
    content = [{"type": "text", "text": text}]
    return entry(seq, {"type": "message", "message": {"role": "user", "content": content}})


def bash_call(seq: int, call_id: str, command: str) -> EntryEnvelope:
    """An assistant message with one bash tool call."""
    block = {"type": "toolCall", "id": call_id, "name": "bash", "arguments": {"command": command}}
    return entry(seq, {"type": "message", "message": {"role": "assistant", "content": [block]}})


def result(
    seq: int, call_id: str, text: str, *, error: bool = False, tool: str = "bash", **extra: Any
) -> EntryEnvelope:
    """A tool result."""
    message = {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": tool,
        "content": [{"type": "text", "text": text}],
        "isError": error,
        **extra,
    }
    return entry(seq, {"type": "message", "message": message})


def bash_run(seq: int, command: str, code: int | None, **extra: Any) -> EntryEnvelope:
    """A user's `!` bashExecution message."""
    message = {"role": "bashExecution", "command": command, "output": "out", "exitCode": code}
    return entry(seq, {"type": "message", "message": {**message, **extra}})


def fold_all(fold: LedgerFold, envelopes: list[Any]) -> list[dict]:
    """Apply every envelope; answer each pass request with a fallback; return the requests."""
    requests = []
    for envelope in envelopes:
        pending = fold.apply(envelope)
        while pending:
            request = pending.pop(0)
            requests.append(request)
            fields = {k: request[k] for k in ("session", "request", "span", "seq")}
            pending += fold.apply_pass({**fields, "fallback": "test"})
    return requests


def test_bash_calls_get_ids_and_exit_codes() -> None:
    """Each bash result becomes C<n> with its exit code; a non-zero exit is also E<n>."""
    store = DictStore()
    fold_all(
        LedgerFold(store),
        [
            bash_call(1, "t1", "npm test"),
            result(2, "t1", "ok\n\nCommand exited with code 0"),
            bash_call(3, "t2", "npm run check"),
            result(4, "t2", "src/a.ts(3,1): error TS1\n\n\nCommand exited with code 2", error=True),
            bash_call(5, "t3", "sleep 100"),
            result(6, "t3", "Command aborted", error=True),
            bash_call(7, "t4", "make"),
            result(8, "t4", "done", details={"exitCode": 3}),
        ],
    )
    state = snapshot(store, SID)
    got = [(c["id"], c["command"], c["exit"], c["status"], c["error"]) for c in state["commands"]]
    assert got == [
        ("C1", "npm test", 0, "ok", None),
        ("C2", "npm run check", 2, "failed", "E1"),
        ("C3", "sleep 100", None, "aborted", "E2"),
        ("C4", "make", 3, "failed", "E3"),
    ]
    assert state["errors"][0]["head"] == "src/a.ts(3,1): error TS1"
    assert state["errors"][0]["command"] == "C2"
    assert store.get(ledger_key(SID, "call", "t1")) is None


def test_user_bash_runs_and_other_tool_errors_are_recorded() -> None:
    """A `!` run is a command (a non-zero exit an error); any tool result with isError is E<n>."""
    store = DictStore()
    fold_all(
        LedgerFold(store),
        [
            bash_run(1, "ls", 0),
            bash_run(2, "false", 1),
            bash_run(3, "yes", None, cancelled=True),
            result(4, "x9", "Could not find the text in a.ts.\nmore", error=True, tool="edit"),
            result(5, "x10", "fine", tool="read"),
        ],
    )
    state = snapshot(store, SID)
    assert [(c["id"], c["source"], c["status"]) for c in state["commands"]] == [
        ("C1", "user", "ok"),
        ("C2", "user", "failed"),
        ("C3", "user", "cancelled"),
    ]
    assert [(e["id"], e["tool"], e["command"]) for e in state["errors"]] == [
        ("E1", "bash", "C2"),
        ("E2", "bash", "C3"),
        ("E3", "edit", None),
    ]
    assert state["errors"][2]["head"] == "Could not find the text in a.ts."


def test_world_envelope_sets_a_bounded_world() -> None:
    """A `world` envelope's facts become the World, capped in keys and value length."""
    store = DictStore()
    facts = {"branch": "main", "dirty": ["a.py"], "long": "x" * 5000}
    facts.update({f"k{i}": i for i in range(100)})
    fold_all(
        LedgerFold(store), [WorldEnvelope(session_id=SID, seq=1, payload=WorldPayload(facts=facts))]
    )
    world = snapshot(store, SID)["world"]
    assert world["branch"] == "main" and world["dirty"] == ["a.py"]
    assert len(world) == 32 and len(world["long"]) == 200


def world(seq: int, **facts: Any) -> WorldEnvelope:
    """A World snapshot that follows the event at `seq` (it takes no seq of its own)."""
    return WorldEnvelope(session_id=SID, seq=seq, payload=WorldPayload(facts=facts))


def test_a_world_takes_no_sequence_number_of_its_own() -> None:
    """A snapshot carrying the seq of the entry it follows is folded, and the next entry (the
    following seq) is too: snapshots never shift the file's sequence numbers."""
    store = DictStore()
    fold = LedgerFold(store)
    fold_all(fold, [user(1, "one"), world(1, branch="a"), user(2, "two"), world(2, branch="b")])
    head = load_head(store, SID)
    assert head["world"] == {"branch": "b"} and head["n"]["u"] == 2 and head["seq"] == 2


def test_an_older_world_redelivered_changes_nothing() -> None:
    """A redelivered snapshot older than the last one folded is ignored; a newer look at the
    same point replaces it."""
    store = DictStore()
    fold = LedgerFold(store)
    fold_all(fold, [user(1, "one"), world(1, branch="a"), user(2, "two"), world(2, branch="b")])
    before = canonical_json(dict(store))
    fold_all(fold, [world(1, branch="a"), user(2, "two")])
    assert canonical_json(dict(store)) == before
    fold_all(fold, [world(2, branch="c")])
    assert load_head(store, SID)["world"] == {"branch": "c"}


def test_a_world_is_held_in_log_order_behind_the_barrier() -> None:
    """While a pass is pending a snapshot waits with the held events: a pass raised by a held
    event sees the World that came before it in the log, not one that came after."""
    store = DictStore()
    fold = LedgerFold(store)
    fold_all(fold, [world(0, branch="start"), user(1, "one")])
    [first] = fold.apply(CompactRequestEnvelope(session_id=SID, seq=2))
    assert first["state"]["world"] == {"branch": "start"}
    held = [
        user(3, "three"),
        world(3, branch="before-second"),
        CompactRequestEnvelope(session_id=SID, seq=4),
        world(4, branch="after-second"),
    ]
    for envelope in held:
        assert fold.apply(envelope) == []
    assert load_head(store, SID)["buffer"] == [3, "w3", 4, "w4"]
    assert load_head(store, SID)["world"] == {"branch": "start"}
    fields = {k: first[k] for k in ("session", "request", "span", "seq")}
    [second] = fold.apply_pass({**fields, "fallback": "test"})
    assert second["seq"] == 4 and second["state"]["world"] == {"branch": "before-second"}
    fields = {k: second[k] for k in ("session", "request", "span", "seq")}
    assert fold.apply_pass({**fields, "fallback": "test"}) == []
    head = load_head(store, SID)
    assert head["world"] == {"branch": "after-second"} and head["buffer"] == []
    assert not [k for k in store if "/buf/" in k]


def test_pruning_ignores_world_snapshots() -> None:
    """The pruning folds keep no trace of a World: a session with snapshots folds the same."""
    envelopes = [user(1, "one"), world(1, branch="a"), user(2, "two"), world(2, branch="b")]
    plain, with_world = DictStore(), DictStore()
    for envelope in envelopes:
        session_fold.apply(with_world, envelope)
        if not isinstance(envelope, WorldEnvelope):
            session_fold.apply(plain, envelope)
    assert canonical_json(dict(plain)) == canonical_json(dict(with_world))


def test_every_envelope_twice_changes_nothing() -> None:
    """Feeding each envelope twice gives the same store as feeding it once (idempotent by seq)."""
    envelopes = [
        user(1, "never push to main"),
        bash_call(2, "t1", "git push"),
        result(3, "t1", "Command exited with code 1", error=True),
        CompactRequestEnvelope(session_id=SID, seq=4),
        user(5, "ok"),
    ]
    once, twice = DictStore(), DictStore()
    fold_all(LedgerFold(once), envelopes)
    fold_all(LedgerFold(twice), [e for e in envelopes for _ in range(2)])
    assert canonical_json(dict(once)) == canonical_json(dict(twice))


def test_compact_request_raises_a_pass_and_holds_later_events() -> None:
    """A compact-request emits one pass request; later events wait until its answer is folded."""
    store = DictStore()
    fold = LedgerFold(store)
    assert fold.apply(user(1, "hello")) == []
    [request] = fold.apply(CompactRequestEnvelope(session_id=SID, seq=2))
    assert request["trigger"] == "compact-request" and request["span"] == 1
    assert [m["id"] for m in request["offered"]] == ["u1"]
    assert fold.apply(user(3, "held")) == []
    assert load_head(store, SID)["n"]["u"] == 1 and load_head(store, SID)["buffer"] == [3]
    fields = {k: request[k] for k in ("session", "request", "span", "seq")}
    assert fold.apply_pass({**fields, "fallback": "test"}) == []
    head = load_head(store, SID)
    assert head["n"]["u"] == 2 and head["buffer"] == [] and head["pending"] is None
    assert store.get(ledger_key(SID, "buf", 3)) is None


def test_an_answer_that_overtook_its_request_is_ignored() -> None:
    """An answer whose request the state does not hold yet (a crash lost the event that asked
    while its request got out) changes nothing; the event folded again asks again, and that
    answer closes the span as it would have without the crash."""
    envelopes = [user(1, "never push to main"), CompactRequestEnvelope(session_id=SID, seq=2)]
    reference = DictStore()
    fold = LedgerFold(reference)
    fold.apply(envelopes[0])
    [request] = fold.apply(envelopes[1])
    answer = {k: request[k] for k in ("session", "request", "span", "seq")}
    answer = {**answer, "fallback": "test"}
    fold.apply_pass(answer)

    crashed = DictStore()
    fold = LedgerFold(crashed)
    fold.apply(envelopes[0])
    before = canonical_json(dict(crashed))
    assert fold.apply_pass(answer) == []
    assert canonical_json(dict(crashed)) == before
    [again] = fold.apply(envelopes[1])
    assert again["request"] == request["request"]
    fold.apply_pass(answer)
    assert canonical_json(dict(crashed)) == canonical_json(dict(reference))


def test_empty_span_raises_no_pass() -> None:
    """A compact-request or a pi compaction with nothing new since the last pass asks nothing."""
    fold = LedgerFold(DictStore())
    assert fold.apply(CompactRequestEnvelope(session_id=SID, seq=1)) == []
    assert fold.apply(entry(2, {"type": "compaction", "summary": "s", "tokensBefore": 1})) == []


def test_newer_stored_state_format_starts_clean_with_an_anomaly() -> None:
    """A stored head of a newer stateFormat is refused by name: a clean state and an anomaly."""
    store = DictStore()
    store.put(ledger_key(SID, "head"), {"stateFormat": 2, "whatever": True})
    fold_all(LedgerFold(store), [user(1, "hi")])
    state = snapshot(store, SID)
    assert state["anomalies"][0]["code"] == "state-format-newer"
    assert state["anomalies"][0]["found"] == 2
    assert load_head(store, SID)["stateFormat"] == 1


def test_newer_formats_are_anomalies_and_other_span_record_versions_are_skipped() -> None:
    """Our compaction entry or span record of a newer format is an anomaly; v 2 is skipped."""
    store = DictStore()
    details = {"producer": LEDGER_PRODUCER, "stateFormat": 7, "request": "r"}
    record = {"type": "custom", "customType": SPAN_RECORD_TYPE, "data": {"v": 2, "payload": {}}}
    newer = {"type": "custom", "customType": SPAN_RECORD_TYPE}
    newer["data"] = {"v": 1, "stateFormat": 3, "payload": {}}
    fold_all(
        LedgerFold(store),
        [
            user(1, "hi"),
            entry(2, {"type": "compaction", "summary": "s", "tokensBefore": 1, "details": details}),
            entry(3, record),
            entry(4, newer),
        ],
    )
    state = snapshot(store, SID)
    assert [(a["code"], a["found"]) for a in state["anomalies"]] == [
        ("state-format-newer", 7),
        ("state-format-newer", 3),
    ]
    assert state["spans"] == []


class CountingStore(DictStore):
    """A DictStore that records the size of every write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[int] = []

    def put(self, key: str, value: Any) -> None:
        """Record the JSON size, then set."""
        self.writes.append(len(json.dumps(value)))
        super().put(key, value)


@pytest.mark.parametrize("name", ["before-compaction.jsonl", "large-session.jsonl"])
def test_real_session_ledger_matches_the_file(name: str) -> None:
    """On a real session: one command per bash result and `!` run, one error per failure."""
    path = real_session(name)
    bash_calls, results, runs, errors, failed_runs = set(), 0, 0, 0, 0
    for line in path.read_text().splitlines():
        obj = json.loads(line)
        message = obj.get("message") or {}
        if message.get("role") == "assistant":
            bash_calls |= {
                b["id"]
                for b in message["content"]
                if b.get("type") == "toolCall"
                if b["name"] == "bash"
            }
        elif message.get("role") == "toolResult":
            results += message["toolCallId"] in bash_calls
            errors += bool(message.get("isError"))
        elif message.get("role") == "bashExecution":
            runs += 1
            failed_runs += message.get("exitCode") not in (0, None)
    store = CountingStore()
    envelopes = [r for r in read_session_file(path) if isinstance(r, EntryEnvelope)]
    requests = fold_all(LedgerFold(store), envelopes)
    head = load_head(store, envelopes[0].session_id)
    assert head["n"]["C"] == results + runs
    assert head["n"]["E"] == errors + failed_runs
    compactions = sum(e.payload.entry["type"] == "compaction" for e in envelopes)
    assert [r["trigger"] for r in requests] == ["compaction"] * compactions
    # Small writes: no single event write comes near the size of the session.
    assert max(store.writes) < 12_000


@settings(max_examples=500)
@given(st.lists(st.text(max_size=40), min_size=1, max_size=8))
def test_a_paths_digest_kept_per_path_is_its_sha256(paths: list[str]) -> None:
    """Property: the file index's key part, kept per path, is the path's sha256 (20 hex
    digits) as the fold computed it for every result, asked once or again."""
    for path in paths + paths:
        assert path_digest(path) == hashlib.sha256(path.encode()).hexdigest()[:20]
