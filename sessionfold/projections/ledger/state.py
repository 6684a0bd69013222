"""The ledger's rows in the Store, its head record, and the snapshot every reader works from.

Layout, all under `key(session, "ledger", ...)`:
  head            counters, sequence, open span bounds, World, Now, barrier (small)
  C/<n> E/<n>     commands and errors with ids C<n>, E<n>
  u/<n>           user messages (text capped): rules quote them, the pass labels them
  call/<id>       a bash call waiting for its result (deleted when it arrives)
  exec/<session>  a unified exec process still running: its C row (deleted when it ends)
  R/<n> D/<n> X/<n> V/<n>   rules (with their lift), decisions, dead ends, values
  F/<n>           files read or modified by pi's file tools (once per path and kind)
  file/<op>/<h>   which F row holds a path (h: its digest), so a file is kept once
  S/<n>           span records
  A/<n>           anomalies (codes and ids, no text)
  foreign         the newest compaction not ours: entry, seq, its summary's head and tail
  buf/<seq>       envelopes held by the flush barrier (buf/w<seq>: a held World snapshot)
  answered/<req>  pass results already applied
  id/<entry id>   the seq of the entry that took the id (a second entry with it is refused)
One event writes the head and a row or two, so a write never grows with the session.
"""

from __future__ import annotations

from typing import Any, cast

import orjson

from sessionfold.events.ledger import STATE_FORMAT
from sessionfold.projections.ledger.records import LedgerHead
from sessionfold.projections.store import Store, key_in

#: Counters in the head, one per kind of numbered row, plus `ev` for accepted pass events.
COUNTERS = ("C", "E", "u", "R", "D", "X", "V", "S", "A", "F", "ev")
#: Kinds whose rows belong to the open span until a pass closes it.
SPAN_KINDS = ("C", "E", "u")


#: The store key of one of a session's ledger rows: key(session_id, "ledger", *parts).
ledger_key = key_in("ledger")


def new_head(session_id: str) -> LedgerHead:
    """The head of an empty ledger."""
    return {
        "stateFormat": STATE_FORMAT,
        "session": session_id,
        "seq": 0,
        "span": 0,
        "n": dict.fromkeys(COUNTERS, 0),
        "first": dict.fromkeys(SPAN_KINDS, 1),
        "world": None,
        "now": None,
        "pending": None,
        "buffer": [],
        "carried": [],
        "ours": None,
        "foreign": None,  # {entry, seq} of the newest compaction when it is not ours
    }


def load_head(store: Store, session_id: str) -> LedgerHead | None:
    """The stored head, or None when the session has no ledger yet."""
    head = store.get(ledger_key(session_id, "head"))
    return cast(LedgerHead, head) if isinstance(head, dict) else None


def rows(store: Store, session_id: str, kind: str, first: int, last: int) -> list[dict[str, Any]]:
    """Rows kind/first..kind/last that exist, in order."""
    found = []
    for number in range(first, last + 1):
        row = store.get(ledger_key(session_id, kind, number))
        if isinstance(row, dict):
            found.append(row)
    return found


def all_rows(store: Store, head: LedgerHead, kind: str) -> list[dict[str, Any]]:
    """Every row of a kind the head counts."""
    return rows(store, head["session"], kind, 1, head["n"].get(kind, 0))


def span_has_content(head: LedgerHead) -> bool:
    """True when the open span holds a user message, a command or an error."""
    return any(head["n"][kind] >= head["first"][kind] for kind in SPAN_KINDS)


def open_rows(store: Store, head: LedgerHead, kind: str) -> list[dict[str, Any]]:
    """The rows of a kind that belong to the open span."""
    return rows(store, head["session"], kind, head["first"][kind], head["n"][kind])


def snapshot(store: Store, session_id: str, at_span: int | None = None) -> dict[str, Any]:
    """The whole ledger state as one JSON-ready value (what render and `--json` read).

    With `at_span`, the state as it stood when span `at_span` closed: rows of later spans and
    lifts made later are left out, and Now and the World are that span's.
    """
    head = load_head(store, session_id) or new_head(session_id)
    last = head["span"] if at_span is None else max(0, min(at_span, head["span"]))

    def within(row: dict[str, Any]) -> bool:
        return at_span is None or int(row.get("span", 0)) <= last

    rules = []
    for row in all_rows(store, head, "R"):
        if not within(row):
            continue
        lifted = row.get("lifted")
        if lifted and at_span is not None and int(lifted.get("span", 0)) > last:
            row = {**row, "lifted": None}
        rules.append(row)
    spans = rows(store, session_id, "S", 1, last)
    record = spans[-1] if spans else None
    state: dict[str, Any] = {
        "stateFormat": STATE_FORMAT,
        "session": session_id,
        "seq": head["seq"] if at_span is None else (record["lastSeq"] if record else 0),
        "span": last,
        "rules": rules,
        "decisions": [r for r in all_rows(store, head, "D") if within(r)],
        "deadEnds": [r for r in all_rows(store, head, "X") if within(r)],
        "values": [r for r in all_rows(store, head, "V") if within(r)],
        "commands": [r for r in all_rows(store, head, "C") if within(r)],
        "files": [r for r in all_rows(store, head, "F") if within(r)],
        "errors": [r for r in all_rows(store, head, "E") if within(r)],
        "spans": spans,
        "now": head["now"] if at_span is None else (record or {}).get("now"),
        "world": head["world"] if at_span is None else (record or {}).get("world"),
        "anomalies": all_rows(store, head, "A") if at_span is None else [],
    }
    return state


def canonical_json(value: Any) -> bytes:
    """Sorted-key JSON bytes: the byte-for-byte form states are compared in."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
