"""Taking over from another compactor (seeds/002): its summary in the prompt, the user's
earlier messages that read as standing rules recorded verbatim unless marked a one-off, and
the earlier summary's values kept only where their turn shows them verbatim."""

from __future__ import annotations

from typing import Any

from test_ledger_verify import SID, Scripted, Session, labels, rules_of

from sessionfold.events.envelope import CompactRequestEnvelope, EntryEnvelope, EntryPayload
from sessionfold.events.ledger import LEDGER_PRODUCER
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.ports.ledger.pass_ import run_pass
from sessionfold.ports.ledger.prompt import prompt_text
from sessionfold.projections.ledger.state import load_head, snapshot
from sessionfold.streams.runtime.ledger_loop import fold_records


def pi_compaction(session: Session, summary: str = "pi's summary of the work") -> list[dict]:
    """Fold a compaction entry of pi's own; return the pass request it raises."""
    return session.feed(
        {"type": "compaction", "summary": summary, "firstKeptEntryId": "e1", "tokensBefore": 9}
    )


def take_over(session: Session, model: Any, summary: str = "pi's summary") -> dict[str, Any]:
    """End the span at pi's own compaction, run the pass with `model` and fold it."""
    [request] = pi_compaction(session, summary)
    payload = run_pass(request, model)
    session.fold.apply_pass(payload)
    return payload


def test_the_foreign_summary_goes_into_the_prompt_head_and_tail() -> None:
    """A long summary is shown as its head and tail; the record names the compaction."""
    session = Session()
    session.users("thanks")
    summary = "HEAD " + "x" * 5_000 + " TAIL"
    [request] = pi_compaction(session, summary)
    assert request["earlier"]["entry"] == "e2" and request["earlier"]["chars"] == len(summary)
    model = Scripted(labels(("u1", "not a rule")))
    payload = run_pass(request, model)
    prompt = model.prompts[0]
    assert prompt["earlier"]["head"].startswith("HEAD ")
    assert prompt["earlier"]["tail"].endswith(" TAIL")
    assert len(prompt["earlier"]["head"]) + len(prompt["earlier"]["tail"]) == 3_000
    text = prompt_text(prompt)
    assert "## The earlier compactor's summary (entry e2" in text and "Carry forward" in text
    assert payload["record"]["takeover"] == "e2"
    assert payload["record"]["counts"]["earlier"] == 1


def test_an_unlabeled_standing_message_is_recorded_verbatim_without_a_retry() -> None:
    """The model leaves the standing message unlabeled: code records it, no retry."""
    session = Session()
    session.users("never deploy on a Friday, not even this time", "how is the build?")
    model = Scripted(labels(("u2", "not a rule")))
    payload = take_over(session, model)
    assert len(model.prompts) == 1
    assert model.prompts[0]["messages"][0]["standing"] is True
    assert "u1 (44 chars) [standing]" in prompt_text(model.prompts[0])
    assert rules_of(session.state()) == [
        ("R1", "u1", "never deploy on a Friday, not even this time", False)
    ]
    counts = payload["record"]["counts"]
    assert (counts["standing"], counts["recorded"], counts["oneOffs"]) == (1, 1, 0)


def test_a_standing_message_marked_a_one_off_is_not_recorded() -> None:
    """`not a rule` on a message that reads as standing is the model's one-off: not recorded."""
    session = Session()
    session.users("don't touch the tests until the build passes, ok?")
    payload = take_over(session, Scripted(labels(("u1", "not a rule"))))
    assert session.state()["rules"] == []
    assert payload["record"]["counts"]["oneOffs"] == 1


def test_other_earlier_messages_must_be_labeled() -> None:
    """An unlabeled message that reads as no rule costs a retry, as in a span."""
    session = Session()
    session.users("always run the linter", "tests go under tests/")
    model = Scripted({"labels": [], "narrative": "n"}, labels(("u2", "rule")))
    take_over(session, model)
    assert "unlabeled: u2" in model.prompts[1]["retryNote"]
    assert [r["words"] for r in session.state()["rules"]] == [
        "always run the linter",
        "tests go under tests/",
    ]


def test_a_withdrawal_among_earlier_messages_lifts_the_rule_by_its_u_id() -> None:
    """'the DRY: prefix rule is lifted', labeled `lifts u1`, lifts the rule u1 gave."""
    session = Session()
    session.users(
        "every dry-run line must start with DRY: from now on", "the DRY: prefix rule is lifted"
    )
    take_over(session, Scripted(labels(("u2", "lifts u1"))))
    [rule] = session.state()["rules"]
    assert rule["u"] == "u1" and rule["lifted"]["by"] == "u2"


def test_a_standing_replacement_left_unlabeled_is_asked_about() -> None:
    """A code-recorded rule that may replace a rule in force gets the one question."""
    session = Session()
    session.with_rules("indent with tabs")
    session.users("switch to two-space indentation instead of tabs from now on")
    model = Scripted({"labels": [], "narrative": "n"}, labels(("u2", "rule and lifts R1")))
    take_over(session, model)
    [question] = model.prompts[1]["questions"]
    assert "u2 reads as a standing rule and may replace the rule u1 gave" in question["text"]
    first, second = session.state()["rules"]
    assert first["lifted"]["replacedBy"] == "R2" and second["words"].startswith("switch")


def test_values_of_the_earlier_summary_are_kept_only_where_their_turn_shows_them() -> None:
    """A value named with a turn that shows it verbatim is kept; one it does not is dropped."""
    session = Session()
    session.users("start the server")
    session.bash("npm start", "listening on port 8080")
    answer = labels(("u1", "not a rule"))
    answer["values"] = [
        {"value": "8080", "turn": "C1", "what": "port"},
        {"value": "3f9a2c1", "turn": "C1", "what": "commit"},
    ]
    payload = take_over(session, Scripted(answer), "server on port 8080 at commit 3f9a2c1")
    assert [v["value"] for v in session.state()["values"]] == ["8080"]
    assert payload["record"]["dropped"]["value-not-verbatim"] == 1


def test_the_offline_model_records_standing_rules_from_earlier_messages_verbatim() -> None:
    """With no model, a foreign compaction's earlier messages are read by the heuristic."""
    session = Session()
    session.users(
        "never push to main, not even this time",
        "can you stop the server for now?",
        "from now on use ruff for formatting, ok?",
        "forget it",
    )
    take_over(session, OfflineModel())
    assert [r["words"] for r in session.state()["rules"]] == [
        "never push to main, not even this time",
        "from now on use ruff for formatting, ok?",
    ]


def test_only_messages_before_the_foreign_compaction_are_earlier() -> None:
    """After pi's compaction, a compact-request pass still shows its summary; messages since
    are the span's own, carried ones from before it are earlier."""
    session = Session()
    session.users("first", "second")
    take_over(session, Scripted(labels(("u1", "not a rule")), labels(("u1", "not a rule"))))
    session.users("never use tabs")
    request = session.request()
    assert request["earlier"]["entry"] == "e3"
    model = Scripted(labels(("u2", "not a rule"), ("u3", "rule")))
    run_pass(request, model)
    [carried, new] = model.prompts[0]["messages"]
    assert (carried["id"], carried.get("earlier")) == ("u2", True)
    assert (new["id"], new.get("earlier"), new.get("standing")) == ("u3", None, None)


def test_our_own_compaction_ends_the_takeover() -> None:
    """Once our compaction is the newest on the branch, passes show no foreign summary."""
    session = Session()
    session.users("first")
    take_over(session, Scripted(labels(("u1", "not a rule"))))
    assert load_head(session.store, SID)["foreign"]["entry"] == "e2"
    details = {"producer": LEDGER_PRODUCER, "stateFormat": 1, "request": "r"}
    session.feed({"type": "compaction", "summary": "ours", "details": details})
    assert load_head(session.store, SID)["foreign"] is None
    session.users("second")
    assert session.request()["earlier"] is None


def test_a_transcript_with_pi_compactions_records_each_rule_once() -> None:
    """Folding a transcript with the offline model: each pass takes over from pi's newest
    compaction, and each rule is recorded once, quoting its message."""
    bodies: list[dict[str, Any]] = []
    for text in ("never push to main", None, "always run the tests", "thanks"):
        if text is None:
            bodies.append({"type": "compaction", "summary": "pi's", "tokensBefore": 1})
        else:
            content = [{"type": "text", "text": text}]
            bodies.append({"type": "message", "message": {"role": "user", "content": content}})
    envelopes: list[Any] = [
        EntryEnvelope(
            session_id=SID,
            seq=seq,
            payload=EntryPayload(entry={"id": f"e{seq}", "parentId": None, **body}),
        )
        for seq, body in enumerate(bodies, start=1)
    ]
    envelopes.append(CompactRequestEnvelope(session_id=SID, seq=len(bodies) + 1))
    run = fold_records(envelopes, OfflineModel())
    words = [r["words"] for r in snapshot(run.store, SID)["rules"]]
    assert words == ["never push to main", "always run the tests"]
    assert [p["record"]["takeover"] for p in run.payloads] == ["e2", "e2"]
