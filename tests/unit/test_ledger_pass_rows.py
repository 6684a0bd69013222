"""The snapshot a pass renders (`pass_rows.apply_to_state`): what a deep copy of the state with
the pass's rows applied would be, built without copying the rows no pass changes."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sessionfold.events.ledger import (
    LedgerEvent,
    LiftEvent,
    NoteEvent,
    RuleEvent,
    SpanRecord,
    ValueEvent,
)
from sessionfold.projections.ledger.pass_rows import (
    apply_to_state,
    note_row,
    rule_lift,
    rule_row,
    value_row,
)


def _deep_copied(
    state: dict[str, Any], events: list[LedgerEvent], record: SpanRecord
) -> dict[str, Any]:
    """`apply_to_state` as it was: the same rows applied to a deep copy of the whole state."""
    after = copy.deepcopy(state)
    rules = {row["id"]: row for row in after["rules"]}
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
            after[name].append(note_row(event, record.span))
        elif isinstance(event, ValueEvent):
            after["values"].append(value_row(event, record.span))
    after["spans"] = [*after["spans"], record.model_dump(mode="json")]
    after["span"] = record.span
    after["now"] = record.now
    if record.world is not None:
        after["world"] = record.world
    return after


_IDS = st.sampled_from(["R1", "R2", "R3", "R4"])
_WORDS = st.text(max_size=12)
_RULE = st.builds(
    lambda n, rule_id, words, replaces: {
        "id": rule_id,
        "u": f"u{n}",
        "entry": None,
        "words": words,
        "start": 0,
        "end": len(words),
        "span": 1,
        "lifted": None,
        **({"replaces": replaces} if replaces else {}),
    },
    st.integers(0, 9),
    _IDS,
    _WORDS,
    st.lists(_IDS, max_size=2),
)
_NOTE = st.fixed_dictionaries({"id": _WORDS, "text": _WORDS, "evidence": st.lists(_IDS)})
#: The rows no pass changes (commands with their outputs, errors, files): any nested JSON.
_JSON = st.recursive(
    st.none() | st.integers() | _WORDS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_WORDS, inner, max_size=3),
    max_leaves=12,
)
_STATE = st.fixed_dictionaries(
    {
        "rules": st.lists(_RULE, max_size=4),
        "decisions": st.lists(_NOTE, max_size=2),
        "deadEnds": st.lists(_NOTE, max_size=2),
        "values": st.lists(_NOTE, max_size=2),
        "spans": st.lists(_JSON, max_size=2),
        "commands": st.lists(_JSON, max_size=3),
        "span": st.integers(0, 5),
        "now": st.none() | _WORDS,
    },
    optional={"world": _JSON, "errors": _JSON},
)
_EVENT = st.one_of(
    st.builds(
        RuleEvent,
        n=st.integers(0, 9),
        id=_IDS,
        u=st.just("u1"),
        entry=st.none(),
        words=_WORDS,
        start=st.just(0),
        end=st.just(0),
    ),
    st.builds(
        LiftEvent,
        n=st.integers(0, 9),
        rule=_IDS,
        by=st.just("u2"),
        entry=st.none() | _WORDS,
        replacedBy=st.none() | _IDS,
    ),
    st.builds(
        NoteEvent,
        kind=st.sampled_from(["decision", "deadEnd"]),
        n=st.integers(0, 9),
        id=_WORDS,
        text=_WORDS,
        evidence=st.lists(_IDS, max_size=2),
    ),
    st.builds(ValueEvent, n=st.integers(0, 9), id=_WORDS, value=_WORDS, turn=st.just("C1")),
)
_RECORD = st.builds(
    SpanRecord,
    span=st.integers(0, 9),
    request=st.just("r"),
    trigger=st.just("compaction"),
    lastSeq=st.integers(0, 99),
    model=st.just("offline"),
    narrativeKind=st.just("model"),
    narrative=_WORDS,
    now=st.none() | _WORDS,
    world=st.none() | st.dictionaries(_WORDS, _JSON, max_size=2),
)


@given(_STATE, st.lists(_EVENT, max_size=8), _RECORD)
def test_a_pass_applies_to_a_partial_copy_as_to_a_deep_copy(
    state: dict[str, Any], events: list[LedgerEvent], record: SpanRecord
) -> None:
    """Property: for any snapshot and events (new rules, lifts of rules there or not, with or
    without a successor, notes, values), the snapshot after the pass equals the deep-copied
    one, and the snapshot it started from is unchanged."""
    before = copy.deepcopy(state)
    assert apply_to_state(state, events, record) == _deep_copied(before, events, record)
    assert state == before
