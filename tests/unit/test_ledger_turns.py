"""Turns mode (seeds/002, opt-in `narrative_mode = "turns"`): one conversation, a section per
turn, the digest, the read-only show(ref) tool, integrity and expectation checks, and the time
budget; with the offline model, a scripted fake, and HttpDiffModel over a real socket."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fake_openai import FakeOpenAI, json_answer
from test_ledger_verify import Session

from sessionfold.ports.ledger.context import PassContext
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.ports.ledger.pass_ import run_pass
from sessionfold.ports.ledger.turns import SECTIONS, digest, show
from sessionfold.ports.ledger_http import HttpDiffModel
from sessionfold.ports.model_http import HttpModelClient, Timeouts, resolve_endpoint
from sessionfold.projections.ledger.config import LedgerConfig

TURNS = LedgerConfig(narrative_mode="turns")
GOOD: dict[str, dict[str, Any]] = {
    "narrative": {"narrative": "fixed the parser in parser.py"},
    "objective": {"objective": "a parser that never crashes"},
    "labels": {"labels": [{"message": "u1", "label": "rule"}]},
    "notes": {"decisions": [{"text": "keep ruff", "evidence": ["C1"]}], "openErrors": ["E1"]},
    "now": {"now": "parser fixed, tests red", "resume": "run the tests"},
}


class Sections:
    """A fake turns model: answers per section from queues (then the good answer), recording
    every prompt it got."""

    name = "sections"

    def __init__(self, **queues: list[Any]) -> None:
        self.queues = {k: list(v) for k, v in queues.items()}
        self.prompts: list[dict[str, Any]] = []

    def diff(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """The next answer for the prompt's section."""
        self.prompts.append(prompt)
        section = prompt["turns"]["section"]
        queue = self.queues.get(section)
        answer = queue.pop(0) if queue else GOOD[section]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def sections(self) -> list[str]:
        """The section of every call, in order."""
        return [p["turns"]["section"] for p in self.prompts]

    def said(self, n: int) -> str:
        """The last user turn of the n-th call."""
        return next(
            m["content"]
            for m in reversed(self.prompts[n]["turns"]["conversation"])
            if m["role"] == "user"
        )


def span(session: Session) -> None:
    """A rule, a failing command, a modified file."""
    session.users("never add dependencies")
    session.bash("ruff check", "parser.py:3:1: error E999", code=1)
    call = f"f{session.seq}"
    block = {"type": "toolCall", "id": call, "name": "edit", "arguments": {"path": "/w/parser.py"}}
    session.feed({"type": "message", "message": {"role": "assistant", "content": [block]}})
    result = {"role": "toolResult", "toolCallId": call, "toolName": "edit", "content": "ok"}
    session.feed({"type": "message", "message": result})


def run(session: Session, model: Any, config: LedgerConfig = TURNS, clock: Any = None) -> dict:
    """Run a turns pass and fold it."""
    payload = run_pass(session.request(), model, config, clock)
    session.fold.apply_pass(payload)
    return payload


def test_five_sections_in_order_settle_the_span() -> None:
    """Narrative, objective, labels, notes, Now: one call each; all of it reaches the state."""
    session = Session()
    span(session)
    model = Sections()
    payload = run(session, model)
    assert model.sections() == list(SECTIONS)
    record = payload["record"]
    assert record["narrativeKind"] == "turns" and record["calls"] == 5
    assert record["sections"] == dict.fromkeys(SECTIONS, "ok")
    assert record["objective"] == "a parser that never crashes"
    assert record["now"] == "parser fixed, tests red Resume: run the tests Open errors: E1."
    state = session.state()
    assert [r["words"] for r in state["rules"]] == ["never add dependencies"]
    assert [d["text"] for d in state["decisions"]] == ["keep ruff"]
    assert [v["value"] for v in state["values"]] == ["parser.py:3:1"]  # code's, not the model's
    assert "Objective: a parser that never crashes" in payload["summary"]


def test_the_first_turn_carries_the_digest() -> None:
    """State, messages whole, ledger, files, World and a condensed transcript, once."""
    session = Session()
    span(session)
    model = Sections()
    run(session, model)
    first = model.prompts[0]["turns"]["conversation"][0]["content"]
    assert first.startswith("# Digest of span 1")
    for part in (
        "## State so far",
        "### u1\nnever add dependencies",
        "C1 exit 1: ruff check -> parser.py:3:1: error E999",
        "E1 error (bash, C1)",
        "F1 modified: /w/parser.py",
        "Section 1 of 5, narrative",
    ):
        assert part in first
    later = model.prompts[1]["turns"]["conversation"]
    assert [m["role"] for m in later] == ["user", "assistant", "user"]
    assert "# Digest" not in later[-1]["content"]


def test_show_answers_read_only_and_is_capped_per_turn() -> None:
    """`{"show": [...]}` gets the items whole; past the cap the model must answer."""
    session = Session()
    span(session)
    request = session.request()
    model = Sections(narrative=[{"show": ["C1", "u1", "nope"]}, {"show": ["E1"]}])
    run_pass(request, model, LedgerConfig(narrative_mode="turns", shows_per_turn=3))
    shown = model.said(1)
    assert "C1 exit 1 (failed): ruff check" in shown and "u1:\nnever add dependencies" in shown
    assert "nope: no such id" in shown
    assert "No more show()" in model.said(2)
    context = PassContext.from_request(request)
    assert show("t1", context, 500).startswith("C1 exit 1")  # by its tool-call id
    assert show("E1", context, 500) == "E1 (bash, C1): parser.py:3:1: error E999"


def test_integrity_failures_are_repaired_twice_then_dropped() -> None:
    """A narrative over its cap is sent back twice; still over, it is dropped and said so."""
    session = Session()
    span(session)
    long = {"narrative": "x " * 300}
    model = Sections(narrative=[long, long, long])
    payload = run(session, model)
    assert model.sections()[:3] == ["narrative"] * 3
    assert "narrative: over 400 characters" in model.said(1)
    assert payload["record"]["sections"]["narrative"] == "items-dropped"
    assert payload["record"]["narrative"].startswith("(turns mode: the narrative section")


def test_labels_must_cover_every_message_and_quote_verbatim() -> None:
    """An unlabeled message and invented words cost a repair turn with the failures named."""
    session = Session()
    session.users("never add dependencies", "x " * 400 + "never push to main")
    bad = {
        "labels": [
            {"message": "u2", "label": "rule", "words": "never push to prod"},
        ]
    }
    good = {
        "labels": [
            {"message": "u1", "label": "rule"},
            {"message": "u2", "label": "rule", "words": "never push to main"},
        ]
    }
    model = Sections(labels=[bad, good])
    payload = run(session, model)
    note = model.said(model.sections().index("labels") + 1)
    assert "unlabeled: u1" in note and "the words given are in no user message" in note
    assert payload["record"]["sections"]["labels"] == "repaired"
    assert [r["words"] for r in session.state()["rules"]] == [
        "never add dependencies",
        "never push to main",
    ]


def test_expectations_can_be_excused_with_a_reason() -> None:
    """A narrative that names no modified file is asked once; an excuse is kept."""
    session = Session()
    span(session)
    model = Sections(narrative=[{"narrative": "worked"}, {"excuse": "only a typo fix"}])
    payload = run(session, model)
    assert "files-named: name the modified file /w/parser.py" in model.said(1)
    assert payload["record"]["excuses"] == {"files-named": "only a typo fix"}
    assert payload["record"]["narrative"] == "worked"


def test_an_unmet_expectation_without_an_excuse_is_recorded() -> None:
    """An unfixed error neither a dead end nor open, twice: the section says so."""
    session = Session()
    span(session)
    notes = {"decisions": [], "deadEnds": []}
    model = Sections(notes=[notes, notes])
    payload = run(session, model)
    assert payload["record"]["sections"]["notes"] == "ok; unmet errors-accounted"


def test_unknown_evidence_is_an_integrity_failure() -> None:
    """A dead end citing an id the ledger does not know is repaired, not excused."""
    session = Session()
    span(session)
    model = Sections(
        notes=[{"deadEnds": [{"text": "tried pip", "evidence": ["C9"]}], "openErrors": ["E1"]}]
    )
    run(session, model)
    assert "deadEnds[0]: C9 is no id listed here" in model.said(model.sections().index("notes") + 1)


class Slow(Sections):
    """Each call takes `seconds` of the clock it shares with the pass."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.now = 0.0
        self.seconds = seconds

    def clock(self) -> float:
        """The shared clock."""
        return self.now

    def diff(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """Answer, then let the time pass."""
        self.now += self.seconds
        return super().diff(prompt)


def test_the_time_budget_carries_what_it_cannot_reach() -> None:
    """Each call takes 100 s of a 150 s pass: labels run out of time; the message is carried,
    Now carries from the previous state, and the sections after are carried."""
    session = Session()
    session.users("hello")
    run(session, Sections(labels=[{"labels": [{"message": "u1", "label": "not a rule"}]}]))
    span(session)
    model = Slow(100)
    config = LedgerConfig(narrative_mode="turns", pass_budget_s=150)
    payload = run(session, model, config, clock=model.clock)
    record = payload["record"]
    assert model.sections() == ["narrative", "objective"]
    assert record["sections"]["labels"] == "out-of-time"
    assert record["sections"]["notes"] == record["sections"]["now"] == "carried"
    assert record["now"] == "parser fixed, tests red Resume: run the tests"  # the first pass's
    assert record["carried"] == ["u2"]


def test_a_turn_over_its_own_budget_stops_that_section() -> None:
    """A section whose repairs outlast `turn_budget_s` stops there."""
    session = Session()
    span(session)
    model = Slow(100)
    model.queues["narrative"] = [{"narrative": ""}] * 3
    config = LedgerConfig(narrative_mode="turns", turn_budget_s=150)
    payload = run(session, model, config, clock=model.clock)
    assert model.sections()[:2] == ["narrative", "narrative"]
    assert payload["record"]["sections"]["narrative"] == "out-of-time"


def test_a_model_that_always_fails_closes_narrative_less() -> None:
    """No section settles: the span closes narrative-less and its messages are carried."""
    session = Session()
    span(session)
    failing = {s: [RuntimeError("down")] * 9 for s in SECTIONS}
    payload = run(session, Sections(**failing))
    assert payload["record"]["narrativeKind"] == "narrative-less"
    assert payload["record"]["carried"] == ["u1"]


def test_taking_over_standing_messages_are_recorded_by_code_whatever_the_label() -> None:
    """In turns mode an earlier standing message cannot carry a label: code records it."""
    session = Session()
    session.users("never deploy on a Friday, not even this time", "thanks")
    [request] = session.feed({"type": "compaction", "summary": "pi's", "tokensBefore": 1})
    model = Sections(labels=[{"labels": [{"message": "u2", "label": "not a rule"}]}])
    payload = run_pass(request, model, TURNS)
    session.fold.apply_pass(payload)
    assert "[standing: recorded by code" in model.prompts[0]["turns"]["conversation"][0]["content"]
    assert [r["words"] for r in session.state()["rules"]] == [
        "never deploy on a Friday, not even this time"
    ]
    assert payload["record"]["counts"]["recorded"] == 1


def test_the_offline_model_answers_every_section_and_meets_the_expectations() -> None:
    """Offline: five calls, no repair, modified files named, errors open, resume set."""
    session = Session()
    span(session)
    payload = run(session, OfflineModel())
    record = payload["record"]
    assert record["calls"] == 5 and record["sections"] == dict.fromkeys(SECTIONS, "ok")
    assert "Modified: parser.py." in record["narrative"]
    assert record["excuses"] == {}
    assert [r["words"] for r in session.state()["rules"]] == ["never add dependencies"]


def test_digest_of_an_empty_span_still_renders() -> None:
    """No command ran: the transcript says so."""
    session = Session()
    session.users("hi")
    assert "(nothing ran)" in digest(PassContext.from_request(session.request()), TURNS)


@pytest.mark.parametrize("stream", [False, True])
def test_turns_over_http_send_the_conversation(stream: bool) -> None:
    """Through HttpDiffModel: each call sends the system prompt and the conversation so far,
    alternating user and assistant turns; the pass settles from the fake server's answers."""
    with FakeOpenAI() as fake:
        fake.script(*[json_answer(GOOD[s]) for s in SECTIONS])
        primary = resolve_endpoint("primary", base_url=fake.base_url, env={})
        client = HttpModelClient(
            primary, timeouts=Timeouts(idle_s=0.5, ceiling_s=3.0), stream=stream, retry_wait_s=0
        )
        session = Session()
        span(session)
        payload = run(session, HttpDiffModel(client))
        roles = [[m["role"] for m in r.body["messages"]] for r in fake.requests]
    assert roles[0] == ["system", "user"]
    assert roles[4] == ["system"] + ["user", "assistant"] * 4 + ["user"]
    assert json.loads(fake.requests[4].body["messages"][2]["content"]) == GOOD["narrative"]
    assert payload["record"]["narrativeKind"] == "turns"
    assert [r["words"] for r in session.state()["rules"]] == ["never add dependencies"]
