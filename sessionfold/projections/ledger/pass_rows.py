"""The rows a ledger pass's accepted events become: one definition for the fold and the pass.

The fold writes them to the Store (`fold.py`, after its own checks); the pass applies them to a
copy of the snapshot to render the summary it answers with (`apply_to_state`). Both must say
the same thing, so both build the rows here.
"""

from __future__ import annotations

from typing import Any, cast

from sessionfold.events.ledger import (
    LedgerEvent,
    LiftEvent,
    NoteEvent,
    RuleEvent,
    SpanRecord,
    ValueEvent,
)
from sessionfold.projections.ledger.records import NoteRow, RuleLift, RuleRow, ValueRow


def _fields(event: RuleEvent | NoteEvent | ValueEvent, span: int) -> dict[str, Any]:
    """The event's own fields (all but `kind` and `n`, in model order) and the span."""
    return {**event.model_dump(exclude={"kind", "n"}), "span": span}


def rule_row(event: RuleEvent, span: int) -> RuleRow:
    """The `R/<n>` row of a new rule, not lifted."""
    return cast(RuleRow, {**_fields(event, span), "lifted": None})


def rule_lift(event: LiftEvent, span: int) -> RuleLift:
    """A rule's `lifted` record: who withdrew it, where, and what replaces it."""
    lifted: RuleLift = {"by": event.by, "entry": event.entry, "span": span}
    if event.replacedBy:
        lifted["replacedBy"] = event.replacedBy
    return lifted


def note_row(event: NoteEvent, span: int) -> NoteRow:
    """The `D/<n>` or `X/<n>` row of a decision or a dead end."""
    return cast(NoteRow, _fields(event, span))


def value_row(event: ValueEvent, span: int) -> ValueRow:
    """The `V/<n>` row of a kept value."""
    return cast(ValueRow, _fields(event, span))


def apply_to_state(
    state: dict[str, Any], events: list[LedgerEvent], record: SpanRecord
) -> dict[str, Any]:
    """The snapshot after a pass: what the fold's `apply_pass` writes, applied to a copy.

    The copy is new where the pass changes it (the snapshot, its lists of rules, notes, values
    and spans, each rule row) and shares every other row with `state`, which is left as it
    was: a deep copy spent most of its time on the commands' outputs, which no pass changes.
    """
    after = dict(state)
    after["rules"] = [dict(row) for row in state["rules"]]
    rules = {row["id"]: row for row in after["rules"]}
    grown: set[str] = set()

    def grow(name: str) -> list[Any]:
        """`after[name]`, a list of the copy's own from its first append on."""
        if name not in grown:
            grown.add(name)
            after[name] = list(after[name])
        rows: list[Any] = after[name]
        return rows

    for event in events:
        if isinstance(event, RuleEvent):
            row = rule_row(event, record.span)
            after["rules"].append(row)
            rules[event.id] = row
        elif isinstance(event, LiftEvent) and event.rule in rules:
            if event.replacedBy:
                successor = rules.get(event.replacedBy)
                if successor is not None:
                    successor["replaces"] = [*successor.get("replaces", []), event.rule]
            rules[event.rule]["lifted"] = rule_lift(event, record.span)
        elif isinstance(event, NoteEvent):
            name = "decisions" if event.kind == "decision" else "deadEnds"
            grow(name).append(note_row(event, record.span))
        elif isinstance(event, ValueEvent):
            grow("values").append(value_row(event, record.span))
    after["spans"] = [*after["spans"], record.model_dump(mode="json")]
    after["span"] = record.span
    after["now"] = record.now
    if record.world is not None:
        after["world"] = record.world
    return after
