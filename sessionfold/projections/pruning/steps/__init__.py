"""The pruning fold of one session event, as its steps in order, one module each.

`guard` (the sequence guard, the flush barrier and the duplicate id), `close_turn` (a non-result
message ends the previous assistant's turn), `message_end` (a final reply flushes before it is
folded), `append` (the branch digest and its metrics), `tool_windows` (the tool windows, turn
gates and pending turns) and `turn_end` (the turn end the entry completes). Each entry step is
`run(step) -> bool`, handed the entry's `EntryStep` (the session, the entry's facts, the
envelope, the outputs so far); True stops the entry there (held by the barrier, refused, or
nothing more to fold). `pruning/fold.py` runs them in this order. The flush barrier's buffer is
here too: `hold` keeps an event a step stopped at, `take_held` gives it back once answered.
"""

from __future__ import annotations

from bisect import insort
from typing import Any

import msgspec

from sessionfold.events.envelope import (
    SCHEMA_VERSION,
    EntryEnvelope,
    Envelope,
    FactsCell,
    Kind,
    entry_envelope,
    from_dict,
)
from sessionfold.projections.pruning.digest import Appended
from sessionfold.projections.pruning.entry_facts import EntryFacts
from sessionfold.projections.pruning.session import Session, row_key

__all__ = [
    "EntryStep",
    "append",
    "close_turn",
    "guard",
    "hold",
    "message_end",
    "take_held",
    "tool_windows",
    "turn_end",
]


class EntryStep(msgspec.Struct, gc=False):
    """One entry on its way through the steps: what each step is handed and leaves for the
    next (`appended` by `append`, `ended` by `tool_windows`)."""

    # A msgspec struct (one per entry, built in C); nothing it holds refers back to it.

    session: Session
    facts: EntryFacts
    envelope: EntryEnvelope
    outputs: list[Envelope]
    appended: Appended | None = None
    ended: bool = False


# --- the flush barrier's buffer: the steps hold an event, the fold takes it back ---------------


#: The facts of each entry this process held, with the entry dict they were read from: the
#: entry taken back finds them when the store hands back that very dict (the embedded store
#: does) instead of reading the entry again; any other dict (a restored state) is read anew.
_HELD_FACTS: dict[str, tuple[dict[str, Any], EntryFacts]] = {}


def hold(session: Session, envelope: Envelope) -> None:
    """Keep a session event until the outstanding compaction is applied."""
    held_key = row_key(session.session_id, "held", envelope.seq)
    session.store.put(held_key, _held_row(envelope))
    insort(session.head["held"], envelope.seq)
    if isinstance(envelope, EntryEnvelope):
        # The cell `entry_facts.facts_of` keeps its facts in, read here: a call into that
        # module per held entry would enter it a third time (bench/call_trace.py).
        cell: FactsCell = envelope.payload.__pydantic_private__["_facts"]  # type: ignore[index]
        if cell.entry is envelope.payload.entry:
            if len(_HELD_FACTS) >= 256:
                _HELD_FACTS.clear()  # held entries never taken back (a dropped runtime)
            _HELD_FACTS[held_key] = (cell.entry, cell.facts)


def take_held(session: Session) -> Envelope | None:
    """The earliest held event, removed from the buffer; None when nothing is held."""
    if not session.head["held"]:
        return None
    seq = session.head["held"].pop(0)
    held_key = row_key(session.session_id, "held", seq)
    raw = session.store.get(held_key)
    session.store.delete(held_key)
    if raw is None:
        return None
    if raw.get("kind") == Kind.ENTRY.value and raw.get("schema_version") == SCHEMA_VERSION:
        # An entry was checked when it was first folded: rebuilt without validating its
        # (often long) message again, equal to what `from_dict` builds.
        payload = raw["payload"]
        envelope = entry_envelope(
            raw["session_id"],
            raw["seq"],
            raw["producer"],
            raw["time"],
            payload["entry"],
            payload["line"],
        )
        found = _HELD_FACTS.pop(held_key, None)
        if found is not None and found[0] is payload["entry"]:
            cell: FactsCell = envelope.payload.__pydantic_private__["_facts"]  # type: ignore[index]
            cell.entry, cell.facts = found
        return envelope
    return from_dict(raw)


def _held_row(envelope: Envelope) -> dict[str, Any]:
    """`envelope.model_dump(mode="json")`; an entry's written out, its JSON entry as it is
    (pydantic would copy the whole message only for the row to hold the same JSON)."""
    if not isinstance(envelope, EntryEnvelope):
        return envelope.model_dump(mode="json")
    return {
        "schema_version": envelope.schema_version,
        "session_id": envelope.session_id,
        "seq": envelope.seq,
        "producer": envelope.producer,
        "time": envelope.time,
        "kind": Kind.ENTRY.value,
        "payload": {"entry": envelope.payload.entry, "line": envelope.payload.line},
    }
