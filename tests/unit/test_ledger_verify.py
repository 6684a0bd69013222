"""Verification of diff answers, rule by rule, with a scripted fake DiffModel."""

from __future__ import annotations

from typing import Any

import pytest

from sessionfold.events.envelope import CompactRequestEnvelope, EntryEnvelope, EntryPayload
from sessionfold.ports.ledger.pass_ import run_pass
from sessionfold.projections.ledger.fold import LedgerFold
from sessionfold.projections.ledger.state import snapshot
from sessionfold.projections.store import DictStore

SID = "sess-v"


class Scripted:
    """A fake DiffModel: returns (or raises) canned answers in order, recording each prompt."""

    name = "scripted"

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.prompts: list[dict[str, Any]] = []

    def diff(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """Hand out the next canned answer."""
        self.prompts.append(prompt)
        if not self.answers:
            raise AssertionError("the pass made a call the script did not expect")
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class Session:
    """A store, a fold and a sequence counter for one test session."""

    def __init__(self) -> None:
        self.store = DictStore()
        self.fold = LedgerFold(self.store)
        self.seq = 0

    def feed(self, body: dict[str, Any]) -> list[dict]:
        """Fold one entry."""
        self.seq += 1
        entry = {"id": f"e{self.seq}", "parentId": None, "timestamp": "t", **body}
        envelope = EntryEnvelope(session_id=SID, seq=self.seq, payload=EntryPayload(entry=entry))
        return self.fold.apply(envelope)

    def users(self, *texts: str) -> None:
        """Fold user messages."""
        for text in texts:
            content = [{"type": "text", "text": text}]
            self.feed({"type": "message", "message": {"role": "user", "content": content}})

    def bash(self, command: str, output: str, code: int = 0) -> None:
        """Fold a bash call and its result."""
        call = f"t{self.seq}"
        block = {"type": "toolCall", "id": call, "name": "bash", "arguments": {"command": command}}
        self.feed({"type": "message", "message": {"role": "assistant", "content": [block]}})
        text = f"{output}\n\nCommand exited with code {code}"
        message = {
            "role": "toolResult",
            "toolCallId": call,
            "toolName": "bash",
            "content": [{"type": "text", "text": text}],
            "isError": code != 0,
        }
        self.feed({"type": "message", "message": message})

    def request(self) -> dict[str, Any]:
        """End the span with a compact-request and return the pass request."""
        self.seq += 1
        [request] = self.fold.apply(CompactRequestEnvelope(session_id=SID, seq=self.seq))
        return request

    def run(self, model: Any) -> dict[str, Any]:
        """Run a pass with `model` and fold its payload; return the payload."""
        payload = run_pass(self.request(), model)
        self.fold.apply_pass(payload)
        return payload

    def state(self) -> dict[str, Any]:
        """The current snapshot."""
        return snapshot(self.store, SID)

    def with_rules(self, *texts: str) -> None:
        """Give the state rules R1.. from messages of an earlier span."""
        before = self.user_count()
        self.users(*texts)
        ids = [f"u{before + i}" for i in range(1, len(texts) + 1)]
        self.run(
            Scripted({"labels": [{"message": m, "label": "rule"} for m in ids], "narrative": "r"})
        )

    def user_count(self) -> int:
        """How many user messages were folded so far."""
        head = self.store.get(f"{SID}/ledger/head")
        return head["n"]["u"] if head else 0


def labels(*pairs: tuple[str, str], **extra: Any) -> dict[str, Any]:
    """An answer labeling messages, with a narrative line."""
    items = [{"message": m, "label": label} for m, label in pairs]
    return {"labels": items, "narrative": "did things", **extra}


def rules_of(state: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(id, u, words, lifted) of every rule."""
    return [(r["id"], r["u"], r["words"], bool(r["lifted"])) for r in state["rules"]]


LONG = "x " * 160  # pads a message past 300 characters
LONGER = "y " * 330  # past 600


# --- verbatim quotes -------------------------------------------------------------------


def test_quote_under_the_wrong_message_binds_to_the_newest_message_holding_it() -> None:
    """Words cited under u2 that only u1 and u3 hold bind to u3, the newest holder."""
    session = Session()
    rule = "never push to main on a Friday"
    session.users(f"{LONGER} {rule}.", "ok", f"{LONGER} again: {rule}!")
    answer = labels(("u1", "not a rule"), ("u3", "not a rule"))
    answer["labels"].append({"message": "u2", "label": "rule", "words": rule})
    model = Scripted(answer)
    payload = session.run(model)
    assert len(model.prompts) == 1
    [(_, u, words, _)] = rules_of(session.state())
    assert (u, words) == ("u3", rule)
    rule_event = payload["events"][0]
    text = session.store.get(f"{SID}/ledger/u/3")["text"]
    assert text[rule_event["start"] : rule_event["end"]] == rule
    assert payload["record"]["dropped"]["quote-rebound"] == 1


def test_text_no_user_wrote_is_rejected() -> None:
    """Words in no user message are rejected: sent back for a long message, then dropped."""
    session = Session()
    session.users(f"{LONGER} always run the linter.")
    bad = {"labels": [{"message": "u1", "label": "rule", "words": "never use tabs"}]}
    bad["narrative"] = "n"
    model = Scripted(bad, bad)
    payload = session.run(model)
    assert len(model.prompts) == 2
    assert "u1: the words given are in no user message" in model.prompts[1]["retryNote"]
    assert session.state()["rules"] == []
    assert payload["record"]["dropped"]["quote-not-verbatim"] == 1


def test_short_message_with_invented_words_is_kept_whole() -> None:
    """A message of at most 300 characters labeled a rule is recorded whole, whatever the words."""
    session = Session()
    session.users("don't add dependencies without asking")
    answer = {"labels": [{"message": "u1", "label": "rule", "words": "never add deps"}]}
    session.run(Scripted({**answer, "narrative": "n"}))
    assert rules_of(session.state()) == [
        ("R1", "u1", "don't add dependencies without asking", False)
    ]


def test_only_the_objective_of_a_goal_message_is_quotable() -> None:
    """In a pi-goal /goal message the template is not quotable; the rule is the objective."""
    session = Session()
    goal = (
        "<goal>Ship the parser and never add dependencies</goal>\n\n"
        "You are working toward the goal above. You must always verify your work."
    )
    session.users(goal)
    answer = {"labels": [{"message": "u1", "label": "rule", "words": "You must always verify"}]}
    payload = session.run(Scripted({**answer, "narrative": "n"}))
    assert rules_of(session.state()) == [
        ("R1", "u1", "Ship the parser and never add dependencies", False)
    ]
    assert payload["record"]["dropped"]["quote-not-verbatim"] == 1


# --- evidence, shapes, schema -----------------------------------------------------------


def test_unknown_evidence_ids_are_dropped_and_the_item_kept() -> None:
    """A decision citing ids the ledger does not know keeps its text and its known ids."""
    session = Session()
    session.users("go")
    session.bash("npm test", "fine")
    answer = labels(("u1", "not a rule"))
    answer["decisions"] = [{"text": "keep npm test as the gate", "evidence": ["C1", "C99", "E7"]}]
    answer["deadEnds"] = [{"text": "tried yarn", "evidence": ["Q1"]}]
    payload = session.run(Scripted(answer))
    state = session.state()
    assert [(d["id"], d["evidence"]) for d in state["decisions"]] == [("D1", ["C1"])]
    assert [(x["id"], x["text"], x["evidence"]) for x in state["deadEnds"]] == [
        ("X1", "tried yarn", [])
    ]
    assert payload["record"]["dropped"]["evidence-unknown"] == 3


def test_shape_slips_are_normalized_before_the_schema_check() -> None:
    """Nulls, a label map, one item for a list and an id string for evidence cost no retry."""
    session = Session()
    session.users("never force-push")
    session.bash("git status", "clean")
    answer = {
        "labels": {"U1": "Rule"},
        "decisions": None,
        "dead_ends": {"text": "rebase failed", "evidence": "C1, E9"},
        "values": None,
        "narrative": ["checked", "status"],
        "now": None,
    }
    model = Scripted(answer)
    session.run(model)
    state = session.state()
    assert len(model.prompts) == 1
    assert rules_of(state) == [("R1", "u1", "never force-push", False)]
    assert [x["evidence"] for x in state["deadEnds"]] == [["C1"]]
    assert state["spans"][0]["narrative"] == "checked status"


def test_schema_bounds_send_an_answer_back_once() -> None:
    """An answer outside the schema's bounds is retried once with a note, then used."""
    session = Session()
    session.users("hello")
    too_long = {"labels": [{"message": "u1", "label": "x" * 500}], "narrative": "n"}
    model = Scripted(too_long, labels(("u1", "not a rule")))
    payload = session.run(model)
    assert "does not fit the schema" in model.prompts[1]["retryNote"]
    assert payload["record"]["narrativeKind"] == "model"


# --- rule words, 300/600, word boundaries ----------------------------------------------


def test_rule_words_are_copied_by_code_from_the_message() -> None:
    """The stored words are the message's own characters at the offsets code found."""
    session = Session()
    text = f"{LONG} from now on, never push to main. {LONG}"
    session.users(text)
    answer = {"labels": [{"message": "u1", "label": "rule", "words": "  never push to main  "}]}
    payload = session.run(Scripted({**answer, "narrative": "n"}))
    event = payload["events"][0]
    assert event["words"] == "never push to main" == text[event["start"] : event["end"]]


def test_store_refuses_a_rule_whose_words_are_not_in_the_message() -> None:
    """A payload whose rule words do not stand at their offsets is refused and recorded."""
    session = Session()
    session.users("never push to main")
    request = session.request()
    payload = run_pass(request, Scripted(labels(("u1", "rule"))))
    payload["events"][0]["words"] = "always push to main"
    session.fold.apply_pass(payload)
    state = session.state()
    assert state["rules"] == []
    assert [a["code"] for a in state["anomalies"]] == ["rule-refused"]


@pytest.mark.parametrize(
    ("size", "words", "expected"),
    [
        (250, "never push", "whole"),
        (450, "never push", "words"),
        (450, None, "whole"),
    ],
)
def test_300_and_600_character_rules(size: int, words: str | None, expected: str) -> None:
    """Up to 300 characters whole; up to 600 the given words or else whole."""
    session = Session()
    text = "never push. " + "z" * (size - 12)
    session.users(text)
    label = {"message": "u1", "label": "rule"}
    if words:
        label["words"] = words
    session.run(Scripted({"labels": [label], "narrative": "n"}))
    [(_, _, got, _)] = rules_of(session.state())
    assert got == (text.strip() if expected == "whole" else words)


def test_message_over_600_characters_needs_its_exact_words() -> None:
    """A long message labeled without words is sent back; the retry's words are recorded."""
    session = Session()
    session.users(f"{LONGER} never deploy on a Friday. {LONGER}")
    model = Scripted(
        labels(("u1", "rule")),
        {
            "labels": [{"message": "u1", "label": "rule", "words": "never deploy on a Friday"}],
            "narrative": "n",
        },
    )
    session.run(model)
    assert "u1 is over 600 characters" in model.prompts[1]["retryNote"]
    assert rules_of(session.state()) == [("R1", "u1", "never deploy on a Friday", False)]


def test_words_that_start_or_end_inside_a_word_are_sent_back() -> None:
    """Long-message words cut inside a word go back with a note; still cut, they are dropped."""
    session = Session()
    session.users(f"{LONGER} never deploy on a Friday. {LONGER}")
    cut = {"labels": [{"message": "u1", "label": "rule", "words": "ever deploy on a Frid"}]}
    cut["narrative"] = "n"
    model = Scripted(cut, cut)
    payload = session.run(model)
    assert "inside a word" in model.prompts[1]["retryNote"]
    assert session.state()["rules"] == []
    assert payload["record"]["dropped"]["quote-inside-word"] == 1


# --- lifts ---------------------------------------------------------------------------------


def test_lift_with_a_withdrawal_word_and_a_shared_word_is_applied() -> None:
    """'the tabs rule no longer applies' lifts the rule about tabs without a question."""
    session = Session()
    session.with_rules("never use tabs in python files")
    session.users("the tabs rule no longer applies")
    model = Scripted(labels(("u2", "lifts R1")))
    session.run(model)
    assert len(model.prompts) == 1
    [rule] = session.state()["rules"]
    assert rule["lifted"] == {"by": "u2", "entry": "e3", "span": 2}


def test_lift_without_a_withdrawal_is_asked_again_then_dropped() -> None:
    """A lift whose message withdraws nothing is asked again with the rule shown, then dropped."""
    session = Session()
    session.with_rules("never use tabs in python files")
    session.users("thanks, the tabs look fine")
    model = Scripted(labels(("u2", "lifts R1")), labels(("u2", "lifts R1")))
    payload = session.run(model)
    [question] = model.prompts[1]["questions"]
    assert question["message"] == "u2" and "never use tabs in python files" in question["text"]
    assert rules_of(session.state()) == [("R1", "u1", "never use tabs in python files", False)]
    assert payload["record"]["dropped"]["lift-unplaced"] == 1


def test_lift_without_a_shared_word_is_asked_and_a_better_target_accepted() -> None:
    """A withdrawal naming the wrong rule is asked about; a reply naming the right one holds."""
    session = Session()
    session.with_rules("never use tabs", "always run the linter before a commit")
    session.users("the linter rule no longer applies")
    model = Scripted(labels(("u3", "lifts R1")), labels(("u3", "lifts R2")))
    session.run(model)
    assert [(r["id"], bool(r["lifted"])) for r in session.state()["rules"]] == [
        ("R1", False),
        ("R2", True),
    ]


def test_rule_that_may_replace_a_rule_in_force_is_asked_about() -> None:
    """A `rule` label whose message would lift a live rule gets one question; yes replaces it."""
    session = Session()
    session.with_rules("indent with tabs")
    session.users("use two-space indentation instead of tabs from now on")
    model = Scripted(labels(("u2", "rule")), labels(("u2", "rule and lifts R1")))
    session.run(model)
    assert "may replace the rule u1 gave" in model.prompts[1]["questions"][0]["text"]
    first, second = session.state()["rules"]
    assert first["lifted"]["replacedBy"] == "R2" and second["lifted"] is None


def test_answer_rule_to_the_replace_question_changes_nothing() -> None:
    """Answering `rule` to the may-replace question keeps both rules in force."""
    session = Session()
    session.with_rules("indent with tabs")
    session.users("use two-space indentation instead of tabs from now on")
    session.run(Scripted(labels(("u2", "rule")), labels(("u2", "rule"))))
    assert [bool(r["lifted"]) for r in session.state()["rules"]] == [False, False]


def test_lift_of_a_replaced_rule_is_asked_with_its_replacement_shown() -> None:
    """Lifting a rule a newer rule replaced asks about the replacement, lifted only by name."""
    session = Session()
    session.with_rules("indent with tabs")
    session.users("use two-space indentation instead of tabs from now on")
    session.run(Scripted(labels(("u2", "rule and lifts R1"))))
    session.users("the indentation rule no longer applies")
    model = Scripted(labels(("u3", "lifts R1")), labels(("u3", "lifts R2")))
    session.run(model)
    assert "already replaced it" in model.prompts[1]["questions"][0]["text"]
    assert [bool(r["lifted"]) for r in session.state()["rules"]] == [True, True]


@pytest.mark.parametrize(
    "message",
    [
        'my colleague wrote "the tabs rule no longer applies to this repo", ignore that',
        "> the tabs rule no longer applies\nwhat do you make of this?",
        "```\nthe tabs rule no longer applies\n```\nseen in the log",
    ],
)
def test_quoted_blockquoted_and_fenced_withdrawals_lift_nothing(message: str) -> None:
    """Quoted passages of six words or more, blockquotes and code fences withdraw nothing."""
    session = Session()
    session.with_rules("never use tabs in python files")
    session.users(message)
    session.run(Scripted(labels(("u2", "lifts R1")), labels(("u2", "lifts R1"))))
    assert not session.state()["rules"][0]["lifted"]


def test_a_short_quote_still_counts_as_the_users_words() -> None:
    """A quoted word or two is the user's own sentence: 'the "tabs" rule no longer applies'."""
    session = Session()
    session.with_rules("never use tabs in python files")
    session.users('the "tabs" rule no longer applies')
    session.run(Scripted(labels(("u2", "lifts R1"))))
    assert session.state()["rules"][0]["lifted"]


# --- values, unlabeled messages, failures ---------------------------------------------


def test_values_are_kept_only_where_they_stand_verbatim_in_their_turn() -> None:
    """A value is kept when its turn shows it verbatim; otherwise it is dropped."""
    session = Session()
    session.users("start the server")
    session.bash("npm start", "listening on port 8080")
    answer = labels(("u1", "not a rule"))
    answer["values"] = [
        {"value": "8080", "turn": "C1", "what": "port"},
        {"value": "9090", "turn": "C1"},
        {"value": "8080", "turn": "u1"},
    ]
    payload = session.run(Scripted(answer))
    assert [(v["value"], v["turn"]) for v in session.state()["values"]] == [("8080", "C1")]
    assert payload["record"]["dropped"]["value-not-verbatim"] == 2


def test_unlabeled_message_costs_a_retry_and_is_carried_when_still_unlabeled() -> None:
    """An unlabeled message is sent back; still unlabeled, the next pass offers it again."""
    session = Session()
    session.users("first", "second")
    model = Scripted(labels(("u1", "not a rule")), labels(("u1", "not a rule")))
    payload = session.run(model)
    assert "unlabeled: u2" in model.prompts[1]["retryNote"]
    assert payload["record"]["carried"] == ["u2"]
    session.users("third")
    assert [m["id"] for m in session.request()["offered"]] == ["u2", "u3"]


def test_failing_model_closes_narrative_less_and_carries_the_messages() -> None:
    """When every call fails the span still closes from the ledger, narrative-less."""
    session = Session()
    session.users("never push")
    session.bash("ls", "a")
    model = Scripted(RuntimeError("boom"), RuntimeError("boom"))
    payload = session.run(model)
    record = payload["record"]
    assert record["narrativeKind"] == "narrative-less"
    assert record["reason"] == "model-error:RuntimeError"
    assert record["carried"] == ["u1"]
    state = session.state()
    assert state["rules"] == [] and [c["id"] for c in state["commands"]] == ["C1"]
    assert "narrative-less" in payload["summary"]


def test_parsed_answer_is_kept_when_the_retry_throws_and_no_question_follows() -> None:
    """A retry that throws leaves the first parsed answer standing, with no question after."""
    session = Session()
    session.with_rules("never use tabs in python files")
    session.users("great tabs", "x")
    model = Scripted(labels(("u2", "lifts R1")), RuntimeError("down"))
    payload = session.run(model)
    assert len(model.prompts) == 2  # the answer (u3 unlabeled) and the retry; no question
    assert payload["record"]["narrativeKind"] == "model"
    assert payload["record"]["carried"] == ["u3"]
