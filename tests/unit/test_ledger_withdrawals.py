"""Withdrawals the offline ledger used to miss (#40 item 6): each left two contradicting rules
in force, or the withdrawn one. The seed's lift rule (the message says it withdraws something
and shares a word with the rule, a flag such as `-x` counting as one) catches them all, in the
span that gave the rule and in a later one; where a rule in force would pass that check against
an earlier rule in force it did not lift, the summary shows the conflict."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.events.envelope import CompactRequestEnvelope, EntryEnvelope, EntryPayload
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.projections.ledger.render import render
from sessionfold.projections.ledger.rules import conflicts, lift_check
from sessionfold.projections.ledger.state import snapshot
from sessionfold.streams.runtime.ledger_loop import EmbeddedLedger

SID = "sess-w"
RULE = "Always run the tests with -x."
WITHDRAWALS = [
    "Stop running the tests with -x from now on.",
    "Don't use -x for the tests anymore.",
    "Ignore what I said about -x",
    # the ones that already worked
    "The -x rule no longer applies.",
    "Forget what I said about -x.",
]


def _user(seq: int, text: str) -> EntryEnvelope:
    content = [{"type": "text", "text": text}]
    entry = {"id": f"e{seq}", "parentId": None, "timestamp": "t", "type": "message"}
    entry["message"] = {"role": "user", "content": content}
    return EntryEnvelope(session_id=SID, seq=seq, payload=EntryPayload(entry=entry))


def _state(messages: list[str], *, passes_between: bool) -> dict[str, Any]:
    ledger = EmbeddedLedger(OfflineModel())
    seq = 0
    for text in messages:
        seq += 1
        ledger.feed(_user(seq, text))
        if passes_between:
            seq += 1
            ledger.feed(CompactRequestEnvelope(session_id=SID, seq=seq))
    ledger.feed(CompactRequestEnvelope(session_id=SID, seq=seq + 1))
    return snapshot(ledger.fold.store, SID)


@pytest.mark.parametrize("passes_between", [False, True], ids=["one-span", "later-span"])
@pytest.mark.parametrize("withdrawal", WITHDRAWALS)
def test_a_withdrawal_lifts_the_rule(withdrawal: str, passes_between: bool) -> None:
    """The rule is lifted by the message; at most the message's own rule stays in force, and
    the rule's words are kept verbatim."""
    state = _state([RULE, withdrawal], passes_between=passes_between)
    first = state["rules"][0]
    assert first["words"] == RULE
    assert first["lifted"] is not None and first["lifted"]["by"] == "u2"
    live = [rule["words"] for rule in state["rules"] if not rule.get("lifted")]
    assert live in ([], [withdrawal])
    assert "may conflict" not in render(state)[0]


@pytest.mark.parametrize(
    "text",
    [
        "Don't forget to run the tests with -x.",
        "Never stop running the tests with -x.",
        "Run the linter on the tests too.",
        "I ran the tests once more.",
    ],
)
def test_what_withdraws_nothing_lifts_nothing(text: str) -> None:
    """A reminder, a reinforcement or an unrelated message leaves the rule in force."""
    state = _state([RULE, text], passes_between=True)
    assert not state["rules"][0].get("lifted")


class Keeping:
    """A diff model that labels every message a rule and answers every question `rule`: a
    model unsure whether a new rule replaced an old one, which keeps both."""

    name = "keeping"

    def diff(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """Every message of the span, or every asked one, a rule."""
        asked = [q["message"] for q in prompt.get("questions") or []]
        ids = asked or [m["id"] for m in prompt["messages"]]
        labels = [{"message": message, "label": "rule"} for message in ids]
        return {"labels": labels, "decisions": [], "deadEnds": [], "narrative": "n", "now": "n"}


def test_a_rule_left_beside_one_it_could_lift_is_shown_as_a_conflict() -> None:
    """When unsure (the model kept both), both rules stay in force and the summary names the
    conflict instead of keeping both silently."""
    ledger = EmbeddedLedger(Keeping())
    ledger.feed(_user(1, RULE))
    ledger.feed(CompactRequestEnvelope(session_id=SID, seq=2))
    ledger.feed(_user(3, WITHDRAWALS[0]))
    ledger.feed(CompactRequestEnvelope(session_id=SID, seq=4))
    state = snapshot(ledger.fold.store, SID)
    assert [(r["id"], r.get("lifted")) for r in state["rules"]] == [("R1", None), ("R2", None)]
    summary = render(state)[0]
    assert "- R2 (u2, entry e3; may conflict with R1, both in force): " in summary
    assert "- R1 (u1, entry e1): " in summary


_WORDS = st.sampled_from(
    ["run", "the", "tests", "with", "-x", "lint", "deploy", "never", "always", "stop", "main"]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_WORDS, min_size=1, max_size=8).map(" ".join), max_size=6))
def test_conflicts_are_the_lift_check_between_rules_in_force(words: list[str]) -> None:
    """Property: a rule conflicts with an earlier rule in force exactly when its words would
    pass the lift check against it; the conflicts name earlier rules only."""
    rules = [(f"R{n}", text) for n, text in enumerate(words, start=1)]
    found = conflicts(rules)
    for n, (rule_id, text) in enumerate(rules):
        expected = [other for other, earlier in rules[:n] if lift_check(text, earlier)]
        assert found.get(rule_id, []) == expected
