"""Replacements (seeds/002): a lift of a replaced rule is asked about with the narrowing shown
(by its u<n> when its id is new), and a lift of a replacement must also name what it set
beyond the rule it replaced, in verification and in the store's own check."""

from __future__ import annotations

from test_ledger_verify import Scripted, Session, labels

from sessionfold.ports.ledger.pass_ import run_pass
from sessionfold.projections.ledger.rules import beyond_words, lift_check

RULE = "never push to main"
NARROWING = "pushing to main is no longer forbidden, but never push to main on a Friday"


def lifted(session: Session) -> list[tuple[str, bool]]:
    """(id, lifted) of every rule."""
    return [(r["id"], bool(r["lifted"])) for r in session.state()["rules"]]


def narrowed(session: Session) -> None:
    """R1 from u1, replaced in a second span by R2 (u2's narrowing)."""
    session.with_rules(RULE)
    session.users(NARROWING)
    session.run(Scripted(labels(("u2", "rule and lifts R1"))))
    assert session.state()["rules"][0]["lifted"]["replacedBy"] == "R2"
    assert session.state()["rules"][1]["replaces"] == ["R1"]


def test_beyond_words_are_what_the_replacement_added() -> None:
    """The lift check of a replacement wants one of the words it set beyond the old rule."""
    assert beyond_words(NARROWING, [RULE]) == {"pushing", "forbidden", "friday"}
    assert lift_check("the main push rule no longer applies", NARROWING)
    assert not lift_check("the main push rule no longer applies", NARROWING, (), [RULE])
    assert lift_check("the Friday rule no longer applies", NARROWING, (), [RULE])


def test_a_lift_of_a_replacement_worded_after_the_old_rule_is_asked_then_dropped() -> None:
    """'the main push rule no longer applies' names only R1's words: R2 stays in view."""
    session = Session()
    narrowed(session)
    session.users("the main push rule no longer applies")
    model = Scripted(labels(("u3", "lifts R2")), labels(("u3", "lifts R2")))
    payload = session.run(model)
    [question] = model.prompts[1]["questions"]
    assert question["kind"] == "check" and "must name what it set beyond" in question["text"]
    assert lifted(session) == [("R1", True), ("R2", False)]
    assert payload["record"]["dropped"]["lift-unplaced"] == 1


def test_a_lift_naming_what_the_replacement_added_is_applied() -> None:
    """'the Friday rule no longer applies' names R2's own words: lifted without a question."""
    session = Session()
    narrowed(session)
    session.users("the Friday rule no longer applies")
    model = Scripted(labels(("u3", "lifts R2")))
    session.run(model)
    assert len(model.prompts) == 1
    assert lifted(session) == [("R1", True), ("R2", True)]


def test_a_lift_of_the_old_rule_is_asked_about_its_narrowing() -> None:
    """`lifts R1` after R2 replaced it: one question shows R2; the reply lifts it by name."""
    session = Session()
    narrowed(session)
    session.users("the Friday push rule no longer applies")
    model = Scripted(labels(("u3", "lifts R1")), labels(("u3", "lifts R2")))
    session.run(model)
    [question] = model.prompts[1]["questions"]
    assert question["kind"] == "replaced" and question["allowed"] == ["R2"]
    assert "R2 (u2) already replaced it" in question["text"]
    assert lifted(session) == [("R1", True), ("R2", True)]


def test_a_narrowing_of_this_span_is_shown_by_its_u_id() -> None:
    """R1 narrowed by u2 in the same span that u3 lifts R1: asked with u2, lifted by name."""
    session = Session()
    session.with_rules(RULE)
    session.users(NARROWING, "the Friday push rule no longer applies")
    model = Scripted(
        labels(("u2", "rule and lifts R1"), ("u3", "lifts R1")),
        labels(("u3", "lifts u2")),
    )
    session.run(model)
    [question] = model.prompts[1]["questions"]
    assert question["allowed"] == ["u2"] and "but u2 already replaced it" in question["text"]
    assert lifted(session) == [("R1", True), ("R2", True)]
    assert session.state()["rules"][1]["lifted"]["by"] == "u3"


def test_a_chain_of_replacements_asks_about_the_live_one() -> None:
    """R1 replaced by R2 in the state, R2 by u3 in this span: `lifts R1` asks about u3."""
    session = Session()
    narrowed(session)
    session.users(
        "the Friday rule no longer applies, instead never push to main after 6pm",
        "the 6pm rule no longer applies",
    )
    model = Scripted(
        labels(("u3", "rule and lifts R2"), ("u4", "lifts R1")),
        labels(("u4", "lifts u3")),
    )
    session.run(model)
    assert model.prompts[1]["questions"][0]["allowed"] == ["u3"]
    assert lifted(session) == [("R1", True), ("R2", True), ("R3", True)]


def test_the_store_refuses_a_lift_of_a_replacement_that_names_only_the_old_words() -> None:
    """A pass result that lifts R2 with R1's words alone is refused by the fold, by name."""
    session = Session()
    narrowed(session)
    session.users("the main push rule no longer applies")
    payload = run_pass(session.request(), Scripted(labels(("u3", "not a rule"))))
    payload["events"].append(
        {"kind": "lift", "n": 99, "rule": "R2", "by": "u3", "entry": "e4", "replacedBy": None}
    )
    session.fold.apply_pass(payload)
    state = session.state()
    assert [(r["id"], bool(r["lifted"])) for r in state["rules"]] == [("R1", True), ("R2", False)]
    assert state["anomalies"][-1]["code"] == "lift-refused"
