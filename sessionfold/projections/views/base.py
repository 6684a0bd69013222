"""The message list pi hands its `context` event at a point of a session, before any pruning.

pi builds the agent's messages from the branch (reference/pi-session-format.md §1.7-1.8): the
path from the leaf to the root, then, when a `compaction` entry is on it, a compactionSummary
message, the kept entries from `firstKeptEntryId` up to the compaction and everything after it.
pi-condense's per-batch summaries are `custom_message` entries in pi's log; sessionfold keeps
them in the index instead (the log holds only what the agent wrote), so they are put back here
where pi would have appended them, as `custom` messages (`summary_notes`).

Pure: the input is the session's entries (with their sequence numbers) and the fold's store.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from sessionfold.events.envelope import EntryEnvelope, Envelope, PlaceholderEnvelope
from sessionfold.projections.pruning import digest, index
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.records import SummaryRow
from sessionfold.projections.store import Store

SUMMARY_TYPE = "context-prune-summary"


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One session entry as the log holds it, with its per-session sequence number.

    A `placeholder` (a dead-lettered entry's place, see `log_entry`) has only `id`, `parentId`
    and `previous` in `entry`: no type, so it puts no message on the branch.
    """

    seq: int
    entry: dict[str, Any]
    placeholder: bool = False


def entry_at(entries: Sequence[LogEntry], seqs: Sequence[int], seq: int) -> dict[str, Any] | None:
    """The entry with sequence number `seq` among `entries` (whose ascending seqs are `seqs`)."""
    position = bisect_right(seqs, seq) - 1
    if position >= 0 and seqs[position] == seq:
        return entries[position].entry
    return None


def log_entry(envelope: Envelope) -> LogEntry | None:
    """The log entry of an entry or placeholder envelope; None for any other envelope."""
    if isinstance(envelope, EntryEnvelope):
        return LogEntry(envelope.seq, envelope.payload.entry)
    if isinstance(envelope, PlaceholderEnvelope):
        payload = envelope.payload
        place = {"id": payload.id, "parentId": payload.parentId, "previous": payload.previous}
        return LogEntry(envelope.seq, place, placeholder=True)
    return None


@dataclass(frozen=True, slots=True)
class SummaryNote:
    """A per-batch summary as pi would have logged it: where, and the message it adds."""

    number: int
    anchor: int  # sequence number of the event whose flush wrote it
    after: bool  # written after the entry at `anchor` (else before it)
    message: dict[str, Any]
    keys: tuple[str, ...]  # occurrence keys it summarizes
    attempt: int  # 1-based flush attempt that wrote it


@dataclass(slots=True)
class BaseContext:
    """pi's context at a point: with the summaries (the pruner's input) and without them.

    `origin` maps `id(message)` of every message taken from the log to its sequence number: the
    pointer to the original that refs resolve to. Message dicts are the log's own objects
    (never copied, never mutated) so that identity says "unchanged".
    """

    messages: list[dict[str, Any]]
    unpruned: list[dict[str, Any]]
    origin: dict[int, int] = field(default_factory=dict)
    branch: list[LogEntry] = field(default_factory=list)
    notes: list[SummaryNote] = field(default_factory=list)


# --- times -----------------------------------------------------------------------------------

_iso_ms_of = lru_cache(maxsize=16_384)(digest.iso_to_ms)


def iso_ms(value: Any) -> int | None:
    """`digest.iso_to_ms`, remembered for strings: a render reads the same flush and entry
    times at every call, and parsing them was a tenth of a render."""
    return _iso_ms_of(value) if isinstance(value, str) else digest.iso_to_ms(value)


# --- occurrence keys -------------------------------------------------------------------------


def split_occurrence(key: str) -> tuple[str, int | None]:
    """`id@123` -> ("id", 123); a key whose suffix is not all digits is a bare id (§1.1)."""
    bare, sep, suffix = key.rpartition("@")
    if sep and suffix.isdigit() and suffix.isascii():
        return bare, int(suffix)
    return key, None


# --- the branch ------------------------------------------------------------------------------


def branch_of(entries: Sequence[LogEntry], leaf: str | None) -> list[LogEntry]:
    """The entries on the path root -> `leaf` (pi's getBranch); the last entry when `leaf` is
    unknown, nothing when there is no entry with an id.

    Dead-lettered entries follow the digest's tree rule (pruning/digest.py): a placeholder
    is a node, under the entry before it when `previous`; after a gap (a placeholder without
    an id) a parent not seen yet is the entry the gap followed. A second entry with an id is
    not a node (the folds refuse it).
    """
    by_id: dict[str, LogEntry] = {}
    parents: dict[str, str | None] = {}
    last: str | None = None
    gap: str | None = None
    for item in entries:
        entry_id = item.entry.get("id")
        if item.placeholder and entry_id is None:
            gap = last
            continue
        if item.entry.get("type") == "session" or not isinstance(entry_id, str):
            continue
        if entry_id in by_id:
            continue
        parent = item.entry.get("parentId")
        if item.placeholder and item.entry.get("previous"):
            parent = last
        elif gap is not None and isinstance(parent, str) and parent not in by_id:
            parent = gap
        by_id[entry_id] = item
        parents[entry_id] = parent if isinstance(parent, str) and parent != entry_id else None
        last = entry_id
    current = leaf if leaf in by_id else last
    path: list[LogEntry] = []
    seen: set[str] = set()
    while current is not None and current in by_id and current not in seen:
        seen.add(current)
        path.append(by_id[current])
        current = parents[current]
    path.reverse()
    return path


# --- summaries -------------------------------------------------------------------------------


def summary_notes(
    store: Store, session_id: str, branch: Sequence[LogEntry], all_seqs: Iterable[int]
) -> list[SummaryNote]:
    """Every kept per-batch summary of the session that lies on `branch`, in summary order.

    A flush triggered by a final reply (message-end) or by the tool result that completed a
    turn writes its summaries after that entry; any other flush runs before the entry at its
    sequence number is folded (turn end closed by the next message, manual, rearmed), so its
    summaries precede it. A summary written while another branch was current is left out.
    """
    count = pruning.load_head(store, session_id)["summaries"]
    if count == 0:
        return []
    records = pruning.flush_records(store, session_id)
    attempts = {record["request_id"]: (n, record) for n, record in enumerate(records, start=1)}
    on_branch = {item.seq: item for item in branch}
    entry_seqs = sorted(set(all_seqs))
    entry_set = set(entry_seqs)
    notes = []
    for number in range(1, count + 1):
        row = index.summary(store, session_id, number)
        found = attempts.get(row["req"]) if row is not None else None
        if row is None or found is None:
            continue
        attempt, record = found
        anchor = int(record["seq"])
        here = on_branch.get(anchor)
        if here is None and anchor in entry_set:
            continue  # the flush ran at an entry of another branch
        if here is None and not _previous_on_branch(entry_seqs, anchor, on_branch):
            continue  # a command or reload while another branch was current
        after = record["trigger"] == "message-end" or (
            here is not None and _role(here.entry) == "toolResult"
        )
        at_ms = iso_ms(record.get("time"))
        if at_ms is None and here is not None:
            stamp = (digest.message_of(here.entry) or {}).get("timestamp")
            at_ms = stamp if isinstance(stamp, int) else None
        notes.append(
            SummaryNote(
                number=number,
                anchor=anchor,
                after=after,
                message=_summary_message(store, session_id, row, at_ms),
                keys=tuple(row["keys"]),
                attempt=attempt,
            )
        )
    return notes


def _previous_on_branch(entry_seqs: list[int], anchor: int, on_branch: dict[int, Any]) -> bool:
    """Whether the latest entry before `anchor` (the leaf at that moment) is on the branch."""
    position = bisect_left(entry_seqs, anchor)
    return position == 0 or entry_seqs[position - 1] in on_branch


def _role(entry: dict[str, Any]) -> str | None:
    message = digest.message_of(entry)
    return message.get("role") if message is not None else None


def _summary_message(
    store: Store, session_id: str, row: SummaryRow, at_ms: int | None
) -> dict[str, Any]:
    """The `custom` message pi-condense's session delivery logs for one batch summary."""
    refs = []
    names = []
    for ref, key in zip(row["refs"], row["keys"], strict=False):
        bare, stamp = split_occurrence(key)
        item: dict[str, Any] = {"shortId": ref, "toolCallId": bare}
        if stamp is not None:
            item["resultTimestamp"] = stamp
        refs.append(item)
        record = index.record(store, session_id, key)
        names.append(record["tool"] if record is not None else None)
    details: dict[str, Any] = {"toolCallRefs": refs, "toolNames": names, "turnIndex": row["turn"]}
    message: dict[str, Any] = {
        "role": "custom",
        "customType": SUMMARY_TYPE,
        "content": row["text"],
        "display": False,
        "details": details,
    }
    if at_ms is not None:
        details["timestamp"] = at_ms
        message["timestamp"] = at_ms
    return message


# --- pi's buildSessionContext ----------------------------------------------------------------


def _interleave(
    branch: Sequence[LogEntry], notes: Sequence[SummaryNote]
) -> list[LogEntry | SummaryNote]:
    """Branch entries with the summary notes placed where pi would have logged them."""
    ordered = sorted(notes, key=lambda n: (n.anchor, n.after, n.number))
    items: list[LogEntry | SummaryNote] = []
    k = 0
    for item in branch:
        while k < len(ordered) and (
            ordered[k].anchor < item.seq or (ordered[k].anchor == item.seq and not ordered[k].after)
        ):
            items.append(ordered[k])
            k += 1
        items.append(item)
        while k < len(ordered) and ordered[k].anchor == item.seq:
            items.append(ordered[k])
            k += 1
    items.extend(ordered[k:])
    return items


def _context_message(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The AgentMessage an entry contributes to pi's context (§1.8 step 6), or None."""
    kind = entry.get("type")
    if kind in ("message", "custom_message"):
        return digest.message_of(entry)  # the same message the branch digest folds
    if kind == "compaction":
        # pi 0.83 (the version the live loop runs) turns every compaction entry in the context
        # into its summary message: an older one inside the kept range too, where §1.8 (0.58)
        # dropped it.
        return _compaction_message(entry)
    if kind == "branch_summary" and entry.get("summary"):
        return {
            "role": "branchSummary",
            "summary": entry["summary"],
            "fromId": entry.get("fromId"),
            "timestamp": iso_ms(entry.get("timestamp")),
        }
    return None


def _compaction_message(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "compactionSummary",
        "summary": entry.get("summary"),
        "tokensBefore": entry.get("tokensBefore"),
        "timestamp": iso_ms(entry.get("timestamp")),
    }


def _visible(items: Sequence[LogEntry | SummaryNote]) -> list[LogEntry | SummaryNote]:
    """What the last compaction on the path keeps: from its first kept entry on (§1.8 step 4)."""
    last = None
    for position, item in enumerate(items):
        if isinstance(item, LogEntry) and item.entry.get("type") == "compaction":
            last = position
    if last is None:
        return list(items)
    compaction = items[last]
    assert isinstance(compaction, LogEntry)
    kept_id = compaction.entry.get("firstKeptEntryId")
    first = next(
        (
            i
            for i in range(last)
            if isinstance(items[i], LogEntry) and items[i].entry.get("id") == kept_id  # type: ignore[union-attr]
        ),
        None,
    )
    kept = list(items[first:last]) if first is not None else []
    return [compaction, *kept, *items[last + 1 :]]


def _messages(
    items: Sequence[LogEntry | SummaryNote], origin: dict[int, int] | None
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for position, item in enumerate(items):
        if isinstance(item, SummaryNote):
            out.append(item.message)
            continue
        if position == 0 and item.entry.get("type") == "compaction":
            out.append(_compaction_message(item.entry))
            continue
        message = _context_message(item.entry)
        if message is None:
            continue
        out.append(message)
        if origin is not None and item.entry.get("type") == "message":
            origin[id(message)] = item.seq
    return out


#: Entries that reshape pi's context rather than add to it, or that are on no branch.
_RESHAPING = frozenset({"compaction", "branch_summary", "session"})


def grown_base(
    base: BaseContext, new: Sequence[LogEntry], leaf: str | None, known: Collection[str]
) -> BaseContext | None:
    """`base` (built from some entries, of which `known` are the ids) with the entries `new`,
    logged since, put on: when they only extend its branch to `leaf`, each the child of the
    one before, none a placeholder, a compaction or a branch summary, none with an id seen
    before. The summaries stay where they are (no flush may have run since: the caller's
    part). None when the entries do anything else: build the context again."""
    if not base.branch:
        return None
    parent = base.branch[-1].entry.get("id")
    branch = list(base.branch)
    seen: set[str] = set()
    added: list[dict[str, Any]] = []
    origin = dict(base.origin)
    for item in new:
        entry = item.entry
        entry_id = entry.get("id")
        if (
            item.placeholder
            or entry.get("type") in _RESHAPING
            or not isinstance(entry_id, str)
            or entry_id in known
            or entry_id in seen
            or entry.get("parentId") != parent
        ):
            return None
        seen.add(entry_id)
        parent = entry_id
        branch.append(item)
        message = _context_message(entry)
        if message is not None:
            added.append(message)
            if entry.get("type") == "message":
                origin[id(message)] = item.seq
    if parent != leaf:
        return None
    unpruned = base.unpruned + added
    messages = unpruned if base.messages is base.unpruned else base.messages + added
    return BaseContext(messages, unpruned, origin, branch, base.notes)


def base_context(
    entries: Sequence[LogEntry], store: Store, session_id: str, notes: bool = True
) -> BaseContext:
    """pi's context of the branch the fold is on, with and without the per-batch summaries."""
    leaf = digest.head(store, session_id)["leaf"]
    branch = branch_of(entries, leaf)
    found = (
        summary_notes(store, session_id, branch, (e.seq for e in entries if "id" in e.entry))
        if notes
        else []
    )
    origin: dict[int, int] = {}
    unpruned = _messages(_visible(list(branch)), origin)
    messages = _messages(_visible(_interleave(branch, found)), origin) if found else unpruned
    return BaseContext(messages, unpruned, origin, branch, found)
