"""The branch digest: per-message facts of a session's current branch, and its tree and leaf.

Public API (all pure folds over a `Store`; no I/O, clock or randomness):

- `apply_facts(store, session_id, facts, seq=None) -> Appended | None`: fold one pi entry (v3
  shape) by its facts (`entry_facts.EntryFacts`, read once per entry; `apply_entry(store,
  session_id, entry, seq)` reads them first). Returns `Appended(row, switched)` when a
  message joined the branch (`row` is its message row) or the branch switched (`row` may then
  be None); None when neither happened (non-message entries on the leaf, the header, an id
  already known, an entry without an id).
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
Helpers (from `entry_facts`): `message_of(entry)` (the message an entry puts on the branch),
`occurrence_key(id, ts)`, `iso_to_ms(iso)`; a final reply is an assistant whose facts say
`text_only`.

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
from typing import Any, cast

import msgspec

from sessionfold.projections.pruning import context_metrics as metrics
from sessionfold.projections.pruning.entry_facts import NO_CUSTOM_TYPE, EntryFacts, entry_facts
from sessionfold.projections.pruning.entry_facts import iso_to_ms as iso_to_ms
from sessionfold.projections.pruning.entry_facts import message_of as message_of
from sessionfold.projections.pruning.entry_facts import occurrence_key as occurrence_key
from sessionfold.projections.pruning.message_facts import path_argument as path_argument
from sessionfold.projections.pruning.records import (
    CallFacts,
    CallIndex,
    DigestHead,
    MessageRow,
    TreeNode,
)
from sessionfold.projections.store import Store, key


class Appended(msgspec.Struct, frozen=True, gc=False):
    """What an entry changed on the branch: the message row that joined it, and/or a switch."""

    row: MessageRow | None
    switched: bool = False


# --- public API ------------------------------------------------------------------------------


def apply_entry(
    store: Store, session_id: str, entry: dict[str, Any], seq: int | None = None
) -> Appended | None:
    """Fold one session entry into the digest and the metrics; see the module docstring."""
    return apply_facts(store, session_id, entry_facts(entry), seq)


def apply_facts(
    store: Store, session_id: str, facts: EntryFacts, seq: int | None = None
) -> Appended | None:
    """`apply_entry` for an entry whose facts are already derived (the fold's one reading)."""
    entry_id = facts.id
    if facts.kind == "session" or entry_id is None:
        return None  # the header is not in the tree; an entry without an id cannot be placed
    # Each key is built once per entry: the head's and the node's are read and written here.
    # Spelled out as `key` builds them (a call per key cost as much as the formatting).
    head_key = f"{session_id}/h"
    node_key = f"{session_id}/t/{entry_id}"
    stored: DigestHead | None = store.get(head_key)
    if stored is None:
        state = metrics.empty_head()
    else:
        # metrics.load_head's private copy, made here: the append enters the metrics once.
        mx = stored["mx"].copy()
        mx["gx"] = list(mx["gx"])
        # dict.copy clones the table in one step; `{**stored, "mx": mx}` inserted key by key.
        state = stored.copy()
        state["mx"] = mx
    known: TreeNode | None = store.get(node_key)
    if known is not None and known["k"] < state["k"]:
        return None  # an id already folded: pi never reuses one (see _folded_before)
    parent = facts.parent
    if parent is None or parent != state["leaf"] or parent == entry_id:
        parent = _parent_of(store, session_id, state, parent, entry_id)
    # else: appended to the leaf (nearly every entry), a node the tree holds: no lookup.
    return _append(store, session_id, state, entry_id, parent, facts, seq, node_key, head_key)


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
    return _append(store, session_id, state, entry_id, parent, None, None)


def is_folded(store: Store, session_id: str, entry_id: Any) -> bool:
    """Whether an entry with this id is already in the session's tree (from an earlier event)."""
    if not isinstance(entry_id, str):
        return False
    known: TreeNode | None = store.get(f"{session_id}/t/{entry_id}")  # key(sid, "t", id)
    if known is None:
        return False
    state: DigestHead | None = store.get(f"{session_id}/h")  # read only: no copy
    return known["k"] < (state["k"] if state is not None else 0)


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
    facts: EntryFacts | None,
    seq: int | None,
    node_key: str | None = None,
    head_key: str | None = None,
) -> Appended | None:
    """Put an entry's node under `parent` (moving the branch there first) and make it the leaf;
    `node_key` and `head_key` are the entry's node's and the head's keys when at hand."""
    if node_key is None:
        node_key = key(session_id, "t", entry_id)
    switched = parent != state["leaf"]
    if switched:
        _move_branch(store, session_id, state, parent)
    node: TreeNode = {"p": parent, "k": state["k"]}
    row: MessageRow | None = None
    if facts is not None and facts.message is not None:
        row = _append_row(store, session_id, state, facts, entry_id, seq)
        node["n"] = row["n"]
    store.put(node_key, node)
    state["leaf"] = entry_id
    state["last"] = entry_id
    state["k"] += 1
    # Last: the commit point of the whole event.
    store.put(head_key if head_key is not None else key(session_id, "h"), state)
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


def tool_calls(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An assistant's toolCall blocks, in content order."""
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == "toolCall"]


# --- rows ------------------------------------------------------------------------------------


def _append_row(
    store: Store,
    session_id: str,
    state: DigestHead,
    facts: EntryFacts,
    entry_id: str,
    seq: int | None,
) -> MessageRow:
    n = state["n"]
    role = facts.role
    row: MessageRow = {
        "n": n,
        "id": entry_id,
        "role": role,
        "chars": facts.chars,
        "ts": facts.ts,
        "ets": facts.ets,
    }
    if seq is not None:
        row["seq"] = seq
    if role == "assistant":
        calls: list[CallFacts] = []
        for fact in facts.calls:
            call: CallFacts = {"id": fact.id, "name": fact.name}
            if fact.path is not None:
                call["path"] = fact.path
            calls.append(call)
        row["turn"] = state["turns"]
        row["textOnly"] = facts.text_only
        row["stop"] = facts.stop
        row["think"] = facts.think
        row["calls"] = calls
    elif role == "toolResult":
        row["callId"] = facts.call_id
        row["tool"] = facts.tool
        row["occ"] = cast(str, facts.occ)
        row["tokens"] = (facts.chars + 2) // 4  # Math.round(chars / 4)
        row["isError"] = facts.is_error
        path = _nearest_call_path(store, session_id, state, facts.call_id, n)
        if path is not None:
            row["path"] = path
    elif role == "user" and facts.passthrough:
        row["pass"] = True
    elif role == "custom" and facts.custom_type is not NO_CUSTOM_TYPE:
        row["customType"] = facts.custom_type
    store.put(f"{session_id}/m/{n}", row)  # key(session_id, "m", n)
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
                store.put(f"{session_id}/c/{call['id']}", value)  # key(sid, "c", id)
    elif role == "toolResult":
        occ_key = f"{session_id}/o/{row['occ']}"  # key(session_id, "o", occ)
        positions = store.get(occ_key)
        if not positions:
            # A new occurrence key (nearly every result): no comprehension to run.
            store.put(occ_key, [row["n"]])
            return
        # Keep only positions still below this row: others belong to an abandoned branch.
        kept = [n for n in positions if n < row["n"]]
        store.put(occ_key, [*kept, row["n"]])


def _nearest_call_path(
    store: Store, session_id: str, state: DigestHead, call_id: str | None, n: int
) -> str | None:
    """The `path` arg of the nearest assistant before position n that has call `call_id`."""
    if call_id is None:
        return None
    found: CallIndex | None = store.get(f"{session_id}/c/{call_id}")  # key(sid, "c", id)
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
