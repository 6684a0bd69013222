"""The index projection (reference §1.3): what is summarized, its ref, where the original is.

Rows under `key(session_id, "pr", ...)`:
- `i/<occurrence key>`: one record per indexed call: bare id `id`, `tool`, `seq` (sequence
  number of the toolResult entry: the pointer to the original in session-events), `aseq` (the
  assistant entry holding the call and its arguments), `turn`, `ts` (batch timestamp), `err`,
  `raw` (result chars), `hash`, and `ref` (its `tN`), `sum` (summary number), `spill`
  ({`bytes`, `preview`}) or `alias` (the occurrence key of the original it duplicates).
- `ref/<tN>`: the occurrence key a short ref names.
- `b/<bare id>`: the indexed occurrence key of that tool call id with the newest result
  timestamp (a bare id in a recall names it: views/recall.py).
- `hash/<content hash>`: the canonical occurrence key of that content (first seen wins).
- `s/<n>`: summary n: its text, refs, occurrence keys, turn and request id.
Nothing here holds a tool output beyond a spilled result's capped head preview.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sessionfold.projections.pruning import context_metrics as metrics
from sessionfold.projections.pruning.capture import Call
from sessionfold.projections.pruning.records import IndexRecord, Spill, SummaryRow
from sessionfold.projections.store import Store, key_in

_k = key_in("pr")


def record(store: Store, session_id: str, occ: str) -> IndexRecord | None:
    """The index record of an occurrence key, or None."""
    return store.get(_k(session_id, "i", occ))


def is_summarized(store: Store, session_id: str, occ: str) -> bool:
    """Strict: the occurrence key itself is indexed or dedup-aliased (never a bare-id lookup)."""
    return store.get(_k(session_id, "i", occ)) is not None


def summarized_check(store: Store, session_id: str) -> Callable[[str], bool]:
    """`is_summarized` bound to one session, for the frontier's trim."""
    return lambda occ: store.get(f"{session_id}/pr/i/{occ}") is not None


def canonical_of(store: Store, session_id: str, content_hash: str) -> str | None:
    """The occurrence key first indexed with this content hash, or None."""
    return store.get(f"{session_id}/pr/hash/{content_hash}")


def canonical_check(store: Store, session_id: str) -> Callable[[str], str | None]:
    """`canonical_of` bound to one session, for the flush's dedup pass."""
    return lambda content_hash: store.get(f"{session_id}/pr/hash/{content_hash}")


def resolve_ref(store: Store, session_id: str, ref: str) -> str | None:
    """The occurrence key a short ref `tN` names, or None."""
    return store.get(_k(session_id, "ref", ref))


def newest_occurrence(store: Store, session_id: str, call_id: str) -> str | None:
    """The indexed occurrence key of a bare tool call id with the newest timestamp, or None."""
    return store.get(_k(session_id, "b", call_id))


def _timestamp(occ: str) -> int:
    """An occurrence key's result timestamp (`id@123`); -1 for a key without one."""
    _, sep, suffix = occ.rpartition("@")
    return int(suffix) if sep and suffix.isdigit() and suffix.isascii() else -1


def _note_occurrence(store: Store, session_id: str, call: Call) -> None:
    """Point the call's bare id at its occurrence when none newer is indexed."""
    bare_key = f"{session_id}/pr/b/{call.tool_call_id}"  # _k(session_id, "b", id)
    known = store.get(bare_key)
    if known is None or (known != call.key and _timestamp(call.key) >= _timestamp(known)):
        store.put(bare_key, call.key)


def summary(store: Store, session_id: str, number: int) -> SummaryRow | None:
    """Summary number `number` (1-based), or None."""
    return store.get(_k(session_id, "s", number))


def _base_record(call: Call, turn: int, timestamp: int) -> IndexRecord:
    return {
        "id": call.tool_call_id,
        "tool": call.tool_name,
        "seq": call.seq,
        "aseq": call.assistant_seq,
        "turn": turn,
        "ts": timestamp,
        "err": call.is_error,
        "raw": call.raw_chars,
        "hash": call.content_hash,
    }


def add_batch(
    store: Store,
    session_id: str,
    calls: Sequence[Call],
    *,
    turn: int,
    timestamp: int,
    refs: Sequence[str] = (),
    summary_number: int | None = None,
    spills: Sequence[Spill] = (),
) -> None:
    """Index a batch's calls (pi-condense's addBatch): records, refs, canonical hashes."""
    for position, call in enumerate(calls):
        row = _base_record(call, turn, timestamp)
        if refs:
            row["ref"] = refs[position]
            store.put(f"{session_id}/pr/ref/{refs[position]}", call.key)
        if summary_number is not None:
            row["sum"] = summary_number
        if spills:
            row["spill"] = spills[position]
        store.put(f"{session_id}/pr/i/{call.key}", row)
        _note_occurrence(store, session_id, call)
        hash_key = f"{session_id}/pr/hash/{call.content_hash}"
        if store.get(hash_key) is None:
            store.put(hash_key, call.key)
    metrics.on_summarized(store, session_id, [call.key for call in calls])


def add_alias(
    store: Store, session_id: str, call: Call, original: str, *, turn: int, timestamp: int
) -> None:
    """Register a dedup alias: the call resolves to the original's record and inherits its ref."""
    row = _base_record(call, turn, timestamp)
    row["alias"] = original
    found = record(store, session_id, original)
    if found is not None and found.get("ref") is not None:
        row["ref"] = found["ref"]
    store.put(_k(session_id, "i", call.key), row)
    _note_occurrence(store, session_id, call)
    metrics.on_summarized(store, session_id, [call.key])


def add_summary(
    store: Store,
    session_id: str,
    number: int,
    *,
    text: str,
    refs: Sequence[str],
    keys: Sequence[str],
    turn: int,
    request_id: str,
) -> None:
    """Store summary `number`: the text that replaces its calls in context."""
    row: SummaryRow = {
        "text": text,
        "refs": list(refs),
        "keys": list(keys),
        "turn": turn,
        "req": request_id,
    }
    store.put(_k(session_id, "s", number), row)
