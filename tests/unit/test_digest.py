"""The branch digest fold: message rows, the tree, the leaf and branch switches."""

from __future__ import annotations

from typing import Any

from sessionfold.projections.jsjson import js_json_length
from sessionfold.projections.pruning import context_metrics as metrics
from sessionfold.projections.pruning import digest
from sessionfold.projections.pruning.digest import (
    Appended,
    apply_entry,
    apply_reload,
    branch_rows,
    head,
)
from sessionfold.projections.store import DictStore, key

SID = "s1"


class CountingStore(DictStore):
    """A DictStore that counts puts, to check what one event writes."""

    puts = 0

    def put(self, key: str, value: Any) -> None:
        self.puts += 1
        super().put(key, value)


def msg(eid: str, parent: str | None, message: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "message",
        "id": eid,
        "parentId": parent,
        "timestamp": "2025-01-01T00:00:00.000Z",
        "message": message,
    }


def user(text: str, ts: int) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": ts}


def assistant(ts: int, *calls: tuple[str, str, dict[str, Any]], think: str = "") -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if think:
        content.append({"type": "thinking", "thinking": think, "thinkingSignature": "sig"})
    content.append({"type": "text", "text": "ok"})
    for call_id, name, args in calls:
        content.append({"type": "toolCall", "id": call_id, "name": name, "arguments": args})
    return {
        "role": "assistant",
        "content": content,
        "stopReason": "toolUse" if calls else "stop",
        "usage": {"input": 1, "output": 2, "cost": {"total": 0.0015}},
        "timestamp": ts,
    }


def result(call_id: str, name: str, ts: int, text: str = "out", error: bool = False) -> dict:
    return {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": name,
        "content": [{"type": "text", "text": text}],
        "isError": error,
        "timestamp": ts,
    }


def fold(store: DictStore, entries: list[dict[str, Any]]) -> list[Appended | None]:
    return [apply_entry(store, SID, e) for e in entries]


def chain(*messages: dict[str, Any]) -> list[dict[str, Any]]:
    """Entries e1, e2, ... each the child of the one before."""
    return [msg(f"e{i + 1}", f"e{i}" if i else None, m) for i, m in enumerate(messages)]


def test_assistant_row_facts() -> None:
    """An assistant row has its turn, calls (path args only), thinking size, text-only flag."""
    store = DictStore()
    think = "let me think"
    message = assistant(
        2, ("c1", "read", {"path": "a.md", "offset": 3}), ("c2", "bash", {"cmd": "ls"}), think=think
    )
    out = fold(store, chain(user("hi", 1), message, assistant(3)))
    row = out[1].row
    assert row["turn"] == 0 and row["textOnly"] is False and row["stop"] == "toolUse"
    assert row["calls"] == [
        {"id": "c1", "name": "read", "path": "a.md"},
        {"id": "c2", "name": "bash"},
    ]
    assert row["think"] == js_json_length(message["content"][0])
    assert row["chars"] == js_json_length(message)
    assert out[2].row["turn"] == 1 and out[2].row["textOnly"] is True


def test_tool_result_row_facts() -> None:
    """A toolResult row has its occurrence key, tokens, error flag and the call's path."""
    store = DictStore()
    res = result("c1", "read", 1700000000123, text="x" * 37, error=True)
    out = fold(store, chain(user("u", 1), assistant(2, ("c1", "read", {"path": "p.py"})), res))
    row = out[2].row
    assert row["occ"] == "c1@1700000000123"
    assert row["tokens"] == (js_json_length(res) * 2 + 4) // 8  # floor(chars / 4 + 0.5)
    assert row["isError"] is True and row["tool"] == "read" and row["path"] == "p.py"


def test_result_args_come_from_nearest_assistant_with_that_id() -> None:
    """A repeated call id takes its args from the nearest preceding assistant that has it."""
    store = DictStore()
    fold(
        store,
        chain(
            user("u", 1),
            assistant(2, ("c1", "read", {"path": "old.md"})),
            result("c1", "read", 3),
            assistant(4, ("c9", "bash", {})),
            assistant(5, ("c1", "read", {"path": "new.md"})),
            result("c1", "read", 6),
            result("c9", "bash", 7),
        ),
    )
    rows = list(branch_rows(store, SID))
    assert rows[2]["path"] == "old.md" and rows[5]["path"] == "new.md"
    assert "path" not in rows[6]


def test_non_array_and_empty_content_are_text_only() -> None:
    """Aborted (empty) and string-content assistants count as text-only."""
    store = DictStore()
    aborted = {"role": "assistant", "content": [], "stopReason": "aborted", "timestamp": 2}
    stringy = {"role": "assistant", "content": "plain", "timestamp": 3}
    out = fold(store, chain(user("u", 1), aborted, stringy))
    assert out[1].row["textOnly"] and out[2].row["textOnly"]
    assert out[2].row["think"] == 0 and out[2].row["calls"] == []


def test_custom_message_is_projected_as_pi_does() -> None:
    """A custom_message entry becomes a role-custom message with the timestamp in ms."""
    store = DictStore()
    entry = {
        "type": "custom_message",
        "id": "c",
        "parentId": None,
        "timestamp": "2025-12-09T00:53:29.825Z",
        "customType": "context-prune-summary",
        "content": "summary",
        "display": False,
    }
    row = apply_entry(store, SID, entry).row
    expected = (
        '{"role":"custom","customType":"context-prune-summary","content":"summary",'
        '"display":false,"timestamp":1765241609825}'
    )
    assert row["role"] == "custom" and row["chars"] == len(expected)
    assert row["customType"] == "context-prune-summary"


def test_passthrough_user_is_flagged() -> None:
    """A user message starting with <compressed-chain is marked as a chain passthrough."""
    store = DictStore()
    out = fold(store, chain(user("  <compressed-chain id=b1>", 1), user("real", 2)))
    assert out[0].row["pass"] is True and "pass" not in out[1].row


def test_non_message_entries_move_leaf_without_rows() -> None:
    """Header, model changes and unknown entry types add no row; tree entries move the leaf."""
    store = DictStore()
    assert apply_entry(store, SID, {"type": "session", "id": "hdr", "version": 3}) is None
    entries = [
        msg("e1", None, user("u", 1)),
        {"type": "model_change", "id": "e2", "parentId": "e1", "provider": "p", "modelId": "m"},
        {"type": "mystery", "id": "e3", "parentId": "e2", "blob": [1, 2]},
        msg("e4", "e3", {"role": "weird", "stuff": 1, "timestamp": 5}),
        msg("e5", "e4", {"role": "bashExecution", "command": "ls", "output": "", "timestamp": 6}),
    ]
    out = fold(store, entries)
    assert out[1] is None and out[2] is None
    assert out[3].row["role"] == "weird" and not out[3].switched
    assert head(store, SID)["leaf"] == "e5" and head(store, SID)["n"] == 3


def test_odd_entries_do_not_crash() -> None:
    """Entries without an id, with a missing parent or with a junk message are tolerated."""
    store = DictStore()
    assert apply_entry(store, SID, {"type": "message", "message": user("x", 1)}) is None
    row = apply_entry(store, SID, msg("a", "nowhere", user("x", 1))).row
    assert row["n"] == 0  # a missing parent makes a root, as pi's getTree does
    assert (
        apply_entry(store, SID, {"type": "message", "id": "b", "parentId": "a", "message": 3})
        is None
    )
    odd = {"role": "toolResult", "toolCallId": None, "content": "?", "timestamp": "later"}
    row = apply_entry(store, SID, msg("c", "b", odd)).row
    assert row["occ"] == "undefined" and row["callId"] is None


def test_known_id_is_ignored() -> None:
    """An entry id already folded is ignored (a redelivery under a new sequence number)."""
    store = DictStore()
    entries = chain(user("u", 1), assistant(2))
    fold(store, entries)
    before = dict(store)
    assert apply_entry(store, SID, entries[0]) is None
    assert dict(store) == before


def test_append_writes_a_small_constant() -> None:
    """Appending to the leaf writes the row, its tree node, index keys and the head only."""
    store = CountingStore()
    fold(store, chain(*[user(f"u{i}", i) for i in range(50)]))
    store.puts = 0
    apply_entry(store, SID, msg("x", "e50", assistant(99, ("c1", "read", {}), ("c2", "read", {}))))
    assert store.puts == 3 + 2  # row, node, head, one call-index key per call
    store.puts = 0
    apply_entry(store, SID, msg("y", "x", result("c1", "read", 100)))
    assert store.puts == 4  # row, node, head, occurrence index


def test_branch_switch_on_append_to_earlier_parent() -> None:
    """Appending to an earlier entry switches the branch; rows and metrics follow the new one."""
    store = DictStore()
    entries = chain(
        user("u", 1),
        assistant(2, ("c1", "read", {})),
        result("c1", "read", 3, text="a" * 400),
        assistant(4),
        user("again", 5),
    )
    fold(store, entries)
    side = msg("s1", "e2", result("c1", "read", 9, text="b" * 40))
    appended = apply_entry(store, SID, side)
    assert appended.switched and appended.row["n"] == 2
    assert [r["id"] for r in branch_rows(store, SID)] == ["e1", "e2", "s1"]
    messages = [entries[0]["message"], entries[1]["message"], side["message"]]
    assert metrics.snapshot(store, SID) == metrics.naive_snapshot(messages)
    # And back: appending to the old leaf brings the old rows back from the tree.
    back = apply_entry(store, SID, msg("b1", "e5", user("third", 10)))
    assert back.switched
    assert [r["id"] for r in branch_rows(store, SID)] == ["e1", "e2", "e3", "e4", "e5", "b1"]
    full = [e["message"] for e in entries] + [user("third", 10)]
    assert metrics.snapshot(store, SID) == metrics.naive_snapshot(full)
    assert head(store, SID)["turns"] == 2


def test_reload_moves_leaf() -> None:
    """A reload to a known entry switches the branch; None or unknown goes to the last entry."""
    store = DictStore()
    entries = chain(user("u", 1), assistant(2), user("v", 3), assistant(4))
    fold(store, entries)
    assert apply_reload(store, SID, "e2") is True
    assert [r["id"] for r in branch_rows(store, SID)] == ["e1", "e2"]
    expected = metrics.naive_snapshot([entries[0]["message"], entries[1]["message"]])
    assert metrics.snapshot(store, SID) == expected
    assert apply_reload(store, SID, "e2") is False
    assert apply_reload(store, SID, None) is True
    assert head(store, SID)["leaf"] == "e4" and head(store, SID)["n"] == 4
    apply_reload(store, SID, "e1")
    assert apply_reload(store, SID, "unknown") is True and head(store, SID)["leaf"] == "e4"


def test_new_root_starts_an_empty_branch() -> None:
    """An entry with a null parent while a leaf exists starts a new root branch."""
    store = DictStore()
    fold(store, chain(user("u", 1), assistant(2)))
    out = apply_entry(store, SID, msg("r", None, user("fresh", 3)))
    assert out.switched and out.row["n"] == 0
    assert [r["id"] for r in branch_rows(store, SID)] == ["r"]


def test_rows_for_occurrence_follow_the_branch() -> None:
    """rows_for_occurrence finds a key's rows on the current branch only."""
    store = DictStore()
    fold(store, chain(user("u", 1), assistant(2, ("c1", "read", {})), result("c1", "read", 3)))
    assert [r["id"] for r in digest.rows_for_occurrence(store, SID, "c1@3")] == ["e3"]
    apply_reload(store, SID, "e2")
    assert digest.rows_for_occurrence(store, SID, "c1@3") == []
    assert store.get(key(SID, "t", "e3"))["r"]["occ"] == "c1@3"  # parked off-branch


class Crash(Exception):
    """The process died between two writes."""


class CrashingStore(DictStore):
    """A DictStore that dies at its `fuse`-th put (counting from 1), once."""

    fuse = 0

    def put(self, key: str, value: Any) -> None:
        self.fuse -= 1
        if self.fuse == 0:
            raise Crash
        super().put(key, value)

    def delete(self, key: str) -> None:
        self.fuse -= 1
        if self.fuse == 0:
            raise Crash
        super().delete(key)


def _events() -> list[tuple[str, Any]]:
    entries = chain(
        user("u", 1),
        assistant(2, ("c1", "read", {}), ("c2", "read", {})),
        result("c1", "read", 3),
        result("c2", "read", 4),
        assistant(5),
    )
    side = msg("s1", "e2", result("c1", "read", 9))
    return [
        *(("entry", e) for e in entries),
        ("summarize", ["c1@3", "c2@4"]),
        ("frontier", {"last_attempted_turn_index": 0, "last_attempted_tool_call_id": "c1"}),
        ("entry", side),
        ("reload", None),
        ("entry", msg("x", "e5", user("v", 6))),
    ]


def _run(store: DictStore, op: str, arg: Any) -> None:
    if op == "entry":
        apply_entry(store, SID, arg)
    elif op == "reload":
        apply_reload(store, SID, arg)
    elif op == "summarize":
        metrics.on_summarized(store, SID, arg)
    else:
        metrics.on_frontier(store, SID, arg)


def test_crash_between_writes_is_repaired_by_redelivery() -> None:
    """A crash at any write of an event, then the event redelivered, gives the clean state."""
    events = _events()
    clean = DictStore()
    for op, arg in events:
        _run(clean, op, arg)
    for index in range(len(events)):
        for fuse in range(1, 40):
            store = CrashingStore()
            for op, arg in events[:index]:
                _run(store, op, arg)
            store.fuse = fuse
            try:
                _run(store, *events[index])
            except Crash:
                _run(store, *events[index])  # redelivery
            else:
                break  # the event has fewer writes than the fuse: all positions tried
            for op, arg in events[index + 1 :]:
                _run(store, op, arg)
            assert metrics.snapshot(store, SID) == metrics.snapshot(clean, SID), (index, fuse)
            assert dict(store) == dict(clean), (index, fuse)
