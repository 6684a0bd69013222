"""The branch digest: per-message facts of a session's current branch, and its tree and leaf.

Public API (all pure folds over a `Store`; no I/O, clock or randomness):

- `apply_entry(store, session_id, entry, seq=None) -> Appended | None`: fold one pi entry (v3
  shape). Returns `Appended(row, switched)` when a message joined the branch (`row` is its
  message row) or the branch switched (`row` may then be None); None when neither happened
  (non-message entries on the leaf, the header, an id already known, an entry without an id).
- `apply_placeholder(store, session_id, entry_id, parent_id, previous) -> Appended | None`: fold
  the place of an entry the reader dead-lettered: a tree node with no message (see below).
- `is_folded(store, session_id, entry_id) -> bool`: an entry with that id is already in the
  tree (a second one is refused: pi never reuses an id).
- `apply_reload(store, session_id, leaf_id=None) -> bool`: a reload may move the leaf: to
  `leaf_id` when it is a known entry, else to the last appended entry (pi's leaf on load).
  True when the branch switched.
- `branch_rows(store, session_id, start=0) -> Iterator[dict]`: the message rows of the current
  branch, in order (rare paths and tests; O(branch)).
- `row_at(store, session_id, n) -> dict | None`: the branch's n-th message row.
- `rows_for_occurrence(store, session_id, occ) -> list[dict]`: the branch's toolResult rows
  with occurrence key `occ` (normally one).
- `head(store, session_id) -> dict`: the session's head record (treat as read-only).
Helpers: `message_of(entry)` (the message an entry puts on the branch), `occurrence_key(id, ts)`,
`iso_to_ms(iso)`; `message_facts.is_text_only_assistant(message)` says what a final reply is.

A message row (JSON-ready dict) has, for every role: `n` (0-based position among the branch's
messages), `id` (entry id), `role`, `chars` (= JSON.stringify(message).length), `ts` (the
message's numeric timestamp or None), `ets` (the entry's ISO timestamp or None) and `seq` when
the caller passed one. By role:
- assistant: `turn` (branch-global 0-based assistant ordinal, the one turn index used
  everywhere), `textOnly` (no toolCall block; non-array content counts), `stop` (stopReason),
  `think` (summed JSON length of thinking blocks), `calls`: [{`id`, `name`, `path`?}] in content
  order (`path` only when the call's `input ?? arguments` has a string `path`; other args stay in
  the log);
- toolResult: `callId`, `tool` (toolName), `occ` (occurrence key `id@timestamp`, or the bare id
  without a numeric timestamp), `tokens` = floor(chars/4 + 0.5), `isError`, `path` (the `path`
  arg of the call, taken from the nearest preceding assistant with that call id);
- user: `pass` = True when it is a `<compressed-chain` passthrough;
- custom (a `custom_message` entry, projected as pi does): `customType`.

Store layout, under `key(session_id, ...)`:
- `h`: the head: `leaf`, `last` (last appended entry), `k` (entries folded), `n` (messages on
  the branch), `turns` (assistants on the branch), `gen` (bumped on every branch switch) and `mx`
  (metrics state, owned by projections.metrics).
- `m/<n>`: the message row at branch position n.
- `t/<entry id>`: tree node {`p`: parent id, `k`: entries folded before it, `n`: row position
  if a message}; a message row whose entry left the branch is parked here under `r` and moves
  back when the branch returns.
- `c/<tool call id>`: the latest assistant on the branch with that call id {`n`, `id`, `path`,
  `g`} (resolves a result's args in O(1)).
- `o/<occurrence key>`: branch positions of the toolResults with that key.
- `s/<occurrence key>`: set by metrics.on_summarized.
The head's `gap`, set only once a session had an unreadable line, is the entry folded just
before it (the line's presumed parent: pi appends to the leaf). The tree rule for dead lines:
- a placeholder with an id is a node like any non-message entry, so its children stay on the
  branch; with `previous` (no readable parentId) its parent is the entry folded before it;
- after a gap, an entry whose parentId names no known entry (most likely the unreadable one)
  hangs under the gap's entry instead of becoming a root. Without a gap it is a root, as pi's
  getTree makes it.
Parent pointers only ever name entries folded earlier, so the tree has no cycle to walk.
Appending to the leaf writes the row, its tree node, its index keys and the head: no value that
grows with the session is rewritten. Appending elsewhere (or a reload to another leaf) moves the
differing rows between `m/` and their tree nodes and rebuilds the metrics: O(branch), rare.
The head is written last, as the commit point: after a crash before it, the tree node's `k` is
not below the head's, so the redelivered event is folded again over the old head (every other
write is an idempotent overwrite, and values read from the store are never mutated in place).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from sessionfold.projections.jsjson import js_json_length, js_number_text
from sessionfold.projections.pruning import context_metrics as metrics
from sessionfold.projections.pruning.message_facts import call_path, is_passthrough
from sessionfold.projections.pruning.message_facts import path_argument as path_argument
from sessionfold.projections.pruning.records import (
    CallFacts,
    CallIndex,
    DigestHead,
    MessageRow,
    TreeNode,
)
from sessionfold.projections.store import Store, key


@dataclass(frozen=True, slots=True)
class Appended:
    """What an entry changed on the branch: the message row that joined it, and/or a switch."""

    row: MessageRow | None
    switched: bool = False


# --- public API ------------------------------------------------------------------------------


def apply_entry(
    store: Store, session_id: str, entry: dict[str, Any], seq: int | None = None
) -> Appended | None:
    """Fold one session entry into the digest and the metrics; see the module docstring."""
    entry_id = entry.get("id")
    if entry.get("type") == "session" or not isinstance(entry_id, str):
        return None  # the header is not in the tree; an entry without an id cannot be placed
    state = metrics.load_head(store, session_id)
    if _folded_before(store, session_id, state, entry_id):
        return None  # an id already folded: pi never reuses one (the reader dead-letters it)
    parent = _parent_of(store, session_id, state, entry.get("parentId"), entry_id)
    return _append(store, session_id, state, entry_id, parent, entry, seq)


def apply_placeholder(
    store: Store,
    session_id: str,
    entry_id: str | None,
    parent_id: str | None,
    previous: bool = False,
) -> Appended | None:
    """Fold the place of a dead-lettered entry: a node without a message, or (no id) a gap."""
    state = metrics.load_head(store, session_id)
    if entry_id is None:
        if state.get("gap") != state["last"]:
            state["gap"] = state["last"]
            store.put(key(session_id, "h"), state)
        return None
    if _folded_before(store, session_id, state, entry_id):
        return None
    if previous:
        parent = state["last"] if state["last"] != entry_id else None
    else:
        parent = _parent_of(store, session_id, state, parent_id, entry_id)
    return _append(store, session_id, state, entry_id, parent, {"id": entry_id}, None)


def is_folded(store: Store, session_id: str, entry_id: Any) -> bool:
    """Whether an entry with this id is already in the session's tree (from an earlier event)."""
    if not isinstance(entry_id, str):
        return False
    return _folded_before(store, session_id, metrics.peek_head(store, session_id), entry_id)


def _folded_before(store: Store, session_id: str, state: DigestHead, entry_id: str) -> bool:
    # A node written by an event whose head write a crash lost has `k` equal to the head's:
    # that event is being folded again, not a second entry with the id.
    known = store.get(key(session_id, "t", entry_id))
    return known is not None and known["k"] < state["k"]


def _append(
    store: Store,
    session_id: str,
    state: DigestHead,
    entry_id: str,
    parent: str | None,
    entry: dict[str, Any],
    seq: int | None,
) -> Appended | None:
    """Put an entry's node under `parent` (moving the branch there first) and make it the leaf."""
    node_key = key(session_id, "t", entry_id)
    switched = parent != state["leaf"]
    if switched:
        _move_branch(store, session_id, state, parent)
    node: TreeNode = {"p": parent, "k": state["k"]}
    row: MessageRow | None = None
    message = message_of(entry)
    if message is not None:
        row = _append_row(store, session_id, state, message, entry, seq)
        node["n"] = row["n"]
    store.put(node_key, node)
    state["leaf"] = entry_id
    state["last"] = entry_id
    state["k"] += 1
    store.put(key(session_id, "h"), state)  # last: the commit point of the whole event
    if row is None and not switched:
        return None
    return Appended(row, switched)


def apply_reload(store: Store, session_id: str, leaf_id: str | None = None) -> bool:
    """Move the leaf as a reload does; True when the branch switched."""
    state = metrics.load_head(store, session_id)
    target = state["last"]
    if leaf_id is not None and store.get(key(session_id, "t", leaf_id)) is not None:
        target = leaf_id
    if target == state["leaf"]:
        return False
    _move_branch(store, session_id, state, target)
    store.put(key(session_id, "h"), state)
    return True


def head(store: Store, session_id: str) -> DigestHead:
    """The session's head record (a fresh one for an unknown session)."""
    state = store.get(key(session_id, "h"))
    return metrics.empty_head() if state is None else state


def row_at(store: Store, session_id: str, n: int) -> MessageRow | None:
    """The message row at branch position n, or None."""
    return store.get(key(session_id, "m", n))


def branch_rows(store: Store, session_id: str, start: int = 0) -> Iterator[MessageRow]:
    """The current branch's message rows from position `start`, in order."""
    count = head(store, session_id)["n"]
    for n in range(start, count):
        yield _row(store, session_id, n)


def _row(store: Store, session_id: str, n: int) -> MessageRow:
    """The message row at position n, which the head's count says exists."""
    return cast(MessageRow, store.get(key(session_id, "m", n)))


def rows_for_occurrence(store: Store, session_id: str, occ: str) -> list[MessageRow]:
    """The branch's toolResult rows whose occurrence key is `occ`."""
    count = head(store, session_id)["n"]
    found = []
    for n in store.get(key(session_id, "o", occ)) or ():
        row = store.get(key(session_id, "m", n)) if n < count else None
        if row is not None and row.get("occ") == occ:
            found.append(row)
    return found


# --- entry -> message ------------------------------------------------------------------------


def message_of(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The message an entry puts on the branch (metrics projection, §9.1), or None."""
    kind = entry.get("type")
    if kind == "message":
        message = entry.get("message")
        return message if isinstance(message, dict) else None
    if kind != "custom_message":
        return None
    # pi's createCustomMessage: undefined fields vanish from JSON.stringify, so leave them out.
    custom: dict[str, Any] = {"role": "custom"}
    for field in ("customType", "content", "display", "details"):
        if field in entry:
            custom[field] = entry[field]
    custom["timestamp"] = iso_to_ms(entry.get("timestamp"))
    return custom


def tool_calls(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An assistant's toolCall blocks, in content order."""
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == "toolCall"]


def iso_to_ms(value: Any) -> int | None:
    """`new Date(value).getTime()` for an ISO timestamp; None where JavaScript gives NaN."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # ISO date-times without offset: read as UTC here
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def occurrence_key(call_id: Any, timestamp: Any) -> str:
    """`id@timestamp` (§1.1), or the bare id when the timestamp is not a number."""
    bare = _js_string(call_id)
    if isinstance(timestamp, int | float) and not isinstance(timestamp, bool):
        return f"{bare}@{js_number_text(timestamp)}"
    return bare


def _js_string(value: Any) -> str:
    # What a template literal makes of the value; ids are strings in every real file.
    if isinstance(value, str):
        return value
    if value is None:
        return "undefined"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return js_number_text(value)
    return "[object Object]"


# --- rows ------------------------------------------------------------------------------------


def _new_row(message: dict[str, Any], entry: dict[str, Any], n: int, seq: int | None) -> MessageRow:
    timestamp = message.get("timestamp")
    ets = entry.get("timestamp")
    row: MessageRow = {
        "n": n,
        "id": entry["id"],
        "role": message.get("role"),
        "chars": js_json_length(message),
        "ts": _number_or_none(timestamp),
        "ets": ets if isinstance(ets, str) else None,
    }
    if seq is not None:
        row["seq"] = seq
    return row


def _number_or_none(value: Any) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _assistant_facts(message: dict[str, Any], row: MessageRow, turn: int) -> None:
    content = message.get("content")
    calls: list[CallFacts] = []
    think = 0
    if isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "thinking":
                think += js_json_length(block)
            elif kind == "toolCall":
                call: CallFacts = {"id": block.get("id"), "name": block.get("name")}
                path = call_path(block)
                if path is not None:
                    call["path"] = path
                calls.append(call)
    row["turn"] = turn
    row["textOnly"] = not calls
    row["stop"] = message.get("stopReason")
    row["think"] = think
    row["calls"] = calls


def _result_facts(message: dict[str, Any], row: MessageRow) -> None:
    call_id = message.get("toolCallId")
    row["callId"] = call_id if isinstance(call_id, str) else None
    row["tool"] = message.get("toolName")
    row["occ"] = occurrence_key(call_id, message.get("timestamp"))
    row["tokens"] = (row["chars"] + 2) // 4  # Math.round(chars / 4)
    row["isError"] = message.get("isError") is True


def _append_row(
    store: Store,
    session_id: str,
    state: DigestHead,
    message: dict[str, Any],
    entry: dict[str, Any],
    seq: int | None,
) -> MessageRow:
    n = state["n"]
    row = _new_row(message, entry, n, seq)
    role = row["role"]
    if role == "assistant":
        _assistant_facts(message, row, state["turns"])
    elif role == "toolResult":
        _result_facts(message, row)
        path = _nearest_call_path(store, session_id, state, row["callId"], n)
        if path is not None:
            row["path"] = path
    elif role == "user" and is_passthrough(message):
        row["pass"] = True
    elif role == "custom" and "customType" in message:
        row["customType"] = message["customType"]
    store.put(key(session_id, "m", n), row)
    _index_row(store, session_id, state, row)
    state["n"] = n + 1
    if role == "assistant":
        state["turns"] += 1
    metrics.fold_row(store, session_id, state, row)
    return row


def _index_row(store: Store, session_id: str, state: DigestHead, row: MessageRow) -> None:
    """Point the call-id and occurrence indexes at a row that just joined the branch."""
    role = row["role"]
    if role == "assistant":
        seen = set()
        for call in row["calls"]:
            # Within one message the first call with an id wins, as pi-condense's `find` does.
            if isinstance(call["id"], str) and call["id"] not in seen:
                seen.add(call["id"])
                value = {
                    "n": row["n"],
                    "id": row["id"],
                    "path": call.get("path"),
                    "g": state["gen"],
                }
                store.put(key(session_id, "c", call["id"]), value)
    elif role == "toolResult":
        occ_key = key(session_id, "o", row["occ"])
        # Keep only positions still below this row: others belong to an abandoned branch.
        kept = [n for n in store.get(occ_key) or () if n < row["n"]]
        store.put(occ_key, [*kept, row["n"]])


def _nearest_call_path(
    store: Store, session_id: str, state: DigestHead, call_id: str | None, n: int
) -> str | None:
    """The `path` arg of the nearest assistant before position n that has call `call_id`."""
    if call_id is None:
        return None
    found: CallIndex | None = store.get(key(session_id, "c", call_id))
    if found is None:
        return None  # no assistant on any branch ever had this id
    path: str | None = found["path"]
    if found["g"] == state["gen"]:
        return path  # written since the last switch: on this branch, the latest one
    row: MessageRow | None = store.get(key(session_id, "m", found["n"])) if found["n"] < n else None
    if row is not None and row["id"] == found["id"]:
        return path
    # The index points into an abandoned branch: look back on this one (rare, after a switch).
    for m in range(n - 1, -1, -1):
        row = _row(store, session_id, m)
        if row["role"] != "assistant":
            continue
        for call in row["calls"]:
            if call["id"] == call_id:
                return call.get("path")
    return None


# --- tree ------------------------------------------------------------------------------------


def _parent_of(
    store: Store, session_id: str, state: DigestHead, parent: Any, entry_id: str
) -> str | None:
    """The entry's parent in the tree; None for a root (null, itself, or missing: pi's getTree),
    except that after a gap a missing parent is the gap's entry (see the module docstring)."""
    if not isinstance(parent, str) or parent == entry_id:
        return None
    if store.get(key(session_id, "t", parent)) is None:
        gap = state.get("gap")
        return gap if gap != entry_id else None
    return parent


def _move_branch(store: Store, session_id: str, state: DigestHead, target: str | None) -> None:
    """Make the branch end at entry `target`: swap the differing rows, rebuild the metrics."""
    count = state["n"]
    adopted: list[tuple[str, MessageRow]] = []
    keep = 0
    current = target
    while current is not None:
        node = store.get(key(session_id, "t", current))
        if node is None:
            break
        if "n" in node:
            n = node["n"]
            # Rows are intrinsic to their entry, so a row in place is on the branch (beyond
            # `count` only when a crashed move had already put it there).
            row = store.get(key(session_id, "m", n))
            if row is not None and row["id"] == current:
                keep = n + 1  # the first message node still on the branch: the common prefix
                if "r" in node:
                    _unpark(store, session_id, current, node)  # left by a crash mid-move
                break
            adopted.append((current, node))
        current = node["p"]
    for n in range(keep, count):
        _park_row(store, session_id, n)
    state["gen"] += 1
    state["n"] = keep
    for entry_id, node in reversed(adopted):
        row = node["r"]
        store.put(key(session_id, "m", row["n"]), row)
        _unpark(store, session_id, entry_id, node)
        state["n"] = row["n"] + 1
        _index_row(store, session_id, state, row)
    state["leaf"] = target
    metrics.rebuild(store, session_id, state)


def _unpark(store: Store, session_id: str, entry_id: str, node: TreeNode) -> None:
    """Drop the parked copy of a row that is back on the branch (written after the row)."""
    store.put(key(session_id, "t", entry_id), {k: v for k, v in node.items() if k != "r"})


def _park_row(store: Store, session_id: str, n: int) -> None:
    """Move the row at position n off the branch into its entry's tree node."""
    row_key = key(session_id, "m", n)
    row = store.get(row_key)
    if row is None:
        return
    node_key = key(session_id, "t", row["id"])
    node = dict(store.get(node_key) or {"p": None, "k": 0, "n": n})
    node["r"] = row
    store.put(node_key, node)
    store.delete(row_key)
