"""Scenario tests of the ledger pass, driven through the model port: `HttpDiffModel` against the
scripted fake chat-completions server over a real socket (tests/fake_openai.py).

One test (at least) per rule of issue points 3 to 6: verification (verbatim quotes, /goal,
evidence, shape slips, 300/600 characters, lifts and their questions, replacements, quoted
withdrawals, values, unlabeled messages), failure handling (format defects, malformed bodies,
cut-off answers, the fallback model, timeouts, narrative-less closes, a pass that throws),
chunking, and taking over from another compactor. Each runs the real driver on envelopes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fake_openai import FakeOpenAI, Reply, answer, cut_off, http_error, json_answer, malformed
from fake_openai import silent as silent_reply

from sessionfold.events.envelope import (
    CompactRequestEnvelope,
    EntryEnvelope,
    EntryPayload,
    WorldEnvelope,
    WorldPayload,
)
from sessionfold.ports.ledger import pass_
from sessionfold.ports.ledger_http import HttpDiffModel
from sessionfold.ports.model_http import (
    HttpModelClient,
    Timeouts,
    resolve_endpoint,
    resolve_fallback,
)
from sessionfold.projections.ledger.config import LedgerConfig
from sessionfold.projections.ledger.state import load_head, snapshot
from sessionfold.streams.runtime.ledger_loop import LedgerRun, fold_records

SID = "scenario"
FAST = Timeouts(idle_s=0.5, ceiling_s=3.0, connect_s=1.0)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    """A running fake server."""
    with FakeOpenAI() as server:
        yield server


def model_on(fake: FakeOpenAI, fallback: str | None = None, **options: Any) -> HttpDiffModel:
    """An HttpDiffModel on the fake server: model `primary`, an optional fallback."""
    primary = resolve_endpoint("primary", base_url=fake.base_url, env={})
    client = HttpModelClient(
        primary,
        fallback=resolve_fallback(fallback, primary, env={}) if fallback else None,
        timeouts=FAST,
        retry_wait_s=0.0,
    )
    return HttpDiffModel(client, **options)


class Transcript:
    """Envelopes of one session, built entry by entry, then folded with passes."""

    def __init__(self) -> None:
        self.envelopes: list[Any] = []
        self.seq = 0

    def _entry(self, body: dict[str, Any]) -> None:
        self.seq += 1
        entry = {"id": f"e{self.seq}", "parentId": None, "timestamp": "t", **body}
        envelope = EntryEnvelope(session_id=SID, seq=self.seq, payload=EntryPayload(entry=entry))
        self.envelopes.append(envelope)

    def users(self, *texts: str) -> Transcript:
        """User messages."""
        for text in texts:
            content = [{"type": "text", "text": text}]
            self._entry({"type": "message", "message": {"role": "user", "content": content}})
        return self

    def bash(self, command: str, output: str, code: int = 0) -> Transcript:
        """A bash call and its result."""
        call = f"t{self.seq}"
        block = {"type": "toolCall", "id": call, "name": "bash", "arguments": {"command": command}}
        self._entry({"type": "message", "message": {"role": "assistant", "content": [block]}})
        result = {
            "role": "toolResult",
            "toolCallId": call,
            "toolName": "bash",
            "content": [{"type": "text", "text": f"{output}\n\nCommand exited with code {code}"}],
            "isError": code != 0,
        }
        self._entry({"type": "message", "message": result})
        return self

    def pi_compaction(self, summary: str = "pi's summary") -> Transcript:
        """A compaction entry of pi's own."""
        self._entry({"type": "compaction", "summary": summary, "tokensBefore": 1})
        return self

    def world(self, **facts: Any) -> Transcript:
        """A World snapshot."""
        self.seq += 1
        self.envelopes.append(
            WorldEnvelope(session_id=SID, seq=self.seq, payload=WorldPayload(facts=facts))
        )
        return self

    def compact(self) -> Transcript:
        """A compact request: the span ends here."""
        self.seq += 1
        self.envelopes.append(CompactRequestEnvelope(session_id=SID, seq=self.seq))
        return self

    def run(self, model: Any, config: LedgerConfig | None = None) -> LedgerRun:
        """Fold every envelope with passes (no final pass: spans end where the test says)."""
        return fold_records(self.envelopes, model, config=config, final_pass=False)


def labels(*pairs: tuple[str, str], **extra: Any) -> Reply:
    """A JSON answer labeling messages, with a narrative line."""
    items = [{"message": m, "label": label} for m, label in pairs]
    return json_answer({"labels": items, "narrative": "did things", **extra})


def state(run: LedgerRun) -> dict[str, Any]:
    """The folded state."""
    return snapshot(run.store, SID)


def rules(run: LedgerRun) -> list[tuple[str, str, bool]]:
    """(u, words, lifted) of every rule."""
    return [(r["u"], r["words"], bool(r["lifted"])) for r in state(run)["rules"]]


def prompt(fake: FakeOpenAI, n: int) -> str:
    """The user message of the n-th request the server got."""
    return str(fake.requests[n].body["messages"][1]["content"])


def record(run: LedgerRun, n: int = -1) -> dict[str, Any]:
    """The span record of a pass."""
    return run.payloads[n]["record"]


# --- point 4: verification --------------------------------------------------------------------


def test_quotes_bind_verbatim_and_invented_words_are_refused(fake: FakeOpenAI) -> None:
    """Words cited under the wrong message bind to the message holding them; words no user
    wrote for a long message are sent back, and the retry's exact words are recorded."""
    long_text = "never push to main. " + "context " * 90
    fake.script(
        json_answer(
            {
                "labels": [
                    {"message": "u1", "label": "not a rule"},
                    {"message": "u2", "label": "rule", "words": "always run the tests"},
                    {"message": "u3", "label": "rule", "words": "never push to prod"},
                ],
                "narrative": "n",
            }
        ),
        json_answer(
            {
                "labels": [
                    {"message": "u1", "label": "not a rule"},
                    {"message": "u2", "label": "rule", "words": "always run the tests"},
                    {"message": "u3", "label": "rule", "words": "never push to main."},
                ],
                "narrative": "n",
            }
        ),
    )
    run = Transcript().users("always run the tests", "ok", long_text).compact().run(model_on(fake))
    assert "the words given are in no user message" in prompt(fake, 1)
    assert rules(run) == [
        ("u1", "always run the tests", False),
        ("u3", "never push to main.", False),
    ]
    assert record(run)["dropped"]["quote-rebound"] == 1


def test_only_a_goal_messages_objective_is_quotable(fake: FakeOpenAI) -> None:
    """In a /goal message the rule is the objective inside the goal tags, never the template."""
    goal = "/goal\n<objective>never add dependencies</objective>\nKeep working until done."
    fake.script(labels(("u1", "rule")))
    run = Transcript().users(goal).compact().run(model_on(fake))
    assert rules(run) == [("u1", "never add dependencies", False)]


def test_unknown_evidence_is_dropped_and_the_decision_kept(fake: FakeOpenAI) -> None:
    """A decision citing C1 and C99 keeps C1 only, and the decision stands."""
    decision = {"text": "use ruff", "evidence": ["C1", "C99"]}
    fake.script(labels(("u1", "not a rule"), decisions=[decision]))
    run = Transcript().users("format it").bash("ruff format", "1 file").compact()
    done = run.run(model_on(fake))
    [row] = state(done)["decisions"]
    assert row["evidence"] == ["C1"] and record(done)["dropped"]["evidence-unknown"] == 1


def test_shape_slips_are_normalized_before_the_schema_check(fake: FakeOpenAI) -> None:
    """A label map, `Rule`, nulls and a dead end as a bare string: one call, all accepted."""
    fake.script(
        json_answer(
            {
                "labels": {"U1": "Rule", "u2": {"label": "not a rule", "words": None}},
                "Decisions": None,
                "dead_ends": "tried pip",
                "narrative": "n",
                "now": None,
            }
        )
    )
    run = Transcript().users("never use pip", "thanks").compact().run(model_on(fake))
    assert len(fake.requests) == 1
    assert rules(run) == [("u1", "never use pip", False)]
    assert [x["text"] for x in state(run)["deadEnds"]] == ["tried pip"]


@pytest.mark.parametrize(
    ("pad", "words", "recorded"),
    [(150, "never push", "whole"), (400, None, "whole"), (700, "never push to main", "words")],
)
def test_300_and_600_characters(
    fake: FakeOpenAI, pad: int, words: str | None, recorded: str
) -> None:
    """Up to 300 kept whole even with words; up to 600 whole without; over 600 only words."""
    text = "never push to main. " + "x " * (pad // 2)
    item: dict[str, Any] = {"message": "u1", "label": "rule"}
    if words:
        item["words"] = words
    fake.script(json_answer({"labels": [item], "narrative": "n"}))
    run = Transcript().users(text).compact().run(model_on(fake))
    [(_, kept, _)] = rules(run)
    assert kept == (text.strip() if recorded == "whole" else words)


def test_words_inside_a_word_and_long_messages_without_words_go_back(fake: FakeOpenAI) -> None:
    """Over 600 characters: no words is a defect, words cut inside a word another."""
    text = "never push to main. " + "padding " * 90
    fake.script(
        labels(("u1", "rule")),
        json_answer(
            {
                "labels": [{"message": "u1", "label": "rule", "words": "ever push to main"}],
                "narrative": "n",
            }
        ),
    )
    run = Transcript().users(text).compact().run(model_on(fake))
    assert "give the rule's exact words" in prompt(fake, 1)
    assert rules(run) == []
    assert record(run)["dropped"]["quote-inside-word"] == 1


def test_a_lift_needs_a_withdrawal_and_a_shared_word_else_it_is_asked(fake: FakeOpenAI) -> None:
    """'the tabs rule no longer applies' lifts at once; 'tabs look fine' is asked, then dropped."""
    fake.script(
        labels(("u1", "rule"), ("u2", "rule")),
        labels(("u3", "lifts R1"), ("u4", "lifts R2")),
        labels(("u4", "lifts R2")),
    )
    transcript = Transcript().users("never use tabs", "always use black").compact()
    transcript.users("the tabs rule no longer applies", "black looks fine").compact()
    run = transcript.run(model_on(fake))
    assert "## Questions" in prompt(fake, 2) and "do not withdraw R2" in prompt(fake, 2)
    assert rules(run) == [("u1", "never use tabs", True), ("u2", "always use black", False)]
    assert record(run)["dropped"]["lift-unplaced"] == 1


def test_a_rule_that_may_replace_a_rule_in_force_is_asked_once(fake: FakeOpenAI) -> None:
    """A `rule` whose words would lift a live rule gets one question; yes replaces it."""
    fake.script(
        labels(("u1", "rule")),
        labels(("u2", "rule")),
        labels(("u2", "rule and lifts R1")),
    )
    transcript = Transcript().users("indent with tabs").compact()
    transcript.users("use two-space indentation instead of tabs from now on").compact()
    run = transcript.run(model_on(fake))
    assert "may replace the rule u1 gave" in prompt(fake, 2)
    assert state(run)["rules"][0]["lifted"]["replacedBy"] == "R2"


def test_a_replaced_rules_lift_is_asked_and_the_replacement_must_be_named(
    fake: FakeOpenAI,
) -> None:
    """`lifts R1` after R2 replaced it asks about R2; a reply naming only R1's words is refused
    because a lift of a replacement must name what it set beyond the rule it replaced."""
    fake.script(
        labels(("u1", "rule")),
        labels(("u2", "rule and lifts R1")),
        labels(("u3", "lifts R1")),
        labels(("u3", "lifts R2")),
    )
    transcript = Transcript().users("never push to main").compact()
    transcript.users("pushing to main is no longer forbidden, but never on a Friday").compact()
    transcript.users("the main push rule no longer applies").compact()
    run = transcript.run(model_on(fake))
    assert "R2 (u2) already replaced it" in prompt(fake, 3)
    assert [lifted for _, _, lifted in rules(run)] == [True, False]


def test_a_quoted_withdrawal_lifts_nothing(fake: FakeOpenAI) -> None:
    """A pasted withdrawal of six words or more is not the user's: asked, then dropped."""
    fake.script(
        labels(("u1", "rule")),
        labels(("u2", "lifts R1")),
        labels(("u2", "lifts R1")),
    )
    transcript = Transcript().users("never use tabs in python files").compact()
    transcript.users('my colleague wrote "the tabs rule no longer applies to this repo"').compact()
    run = transcript.run(model_on(fake))
    assert rules(run)[0][2] is False


def test_values_are_kept_only_where_their_turn_shows_them(fake: FakeOpenAI) -> None:
    """A port the command's output shows is kept with its turn; an invented one is dropped."""
    values = [{"value": "8080", "turn": "C1", "what": "port"}, {"value": "9090", "turn": "C1"}]
    fake.script(labels(("u1", "not a rule"), values=values))
    run = Transcript().users("start it").bash("npm start", "listening on port 8080").compact()
    done = run.run(model_on(fake))
    assert [(v["value"], v["turn"]) for v in state(done)["values"]] == [("8080", "C1")]
    assert "V1 8080 (port) [C1]" in done.payloads[-1]["summary"]


def test_an_unlabeled_message_costs_a_retry_and_is_carried(fake: FakeOpenAI) -> None:
    """Left unlabeled twice, a message is carried and the next pass must label it."""
    fake.script(
        labels(("u1", "not a rule")),
        labels(("u1", "not a rule")),
        labels(("u2", "rule"), ("u3", "not a rule")),
    )
    transcript = Transcript().users("hello", "never commit secrets").compact()
    run = transcript.users("thanks").compact().run(model_on(fake))
    assert "unlabeled: u2" in prompt(fake, 1)
    assert record(run, 0)["carried"] == ["u2"]
    assert "- u2 (20 chars): never commit secrets" in prompt(fake, 2)
    assert rules(run) == [("u2", "never commit secrets", False)]


# --- point 5: failure handling ----------------------------------------------------------------


def test_a_format_defect_is_retried_once_with_a_note(fake: FakeOpenAI) -> None:
    """Prose instead of JSON: the retry carries a note naming the defect and its answer stands."""
    fake.script(answer("Sure! The user set a rule."), labels(("u1", "rule")))
    run = Transcript().users("never push to main").compact().run(model_on(fake))
    assert "not one JSON object (no-json)" in prompt(fake, 1)
    assert rules(run) == [("u1", "never push to main", False)]
    assert record(run)["narrativeKind"] == "model"


def test_a_malformed_body_is_retried_by_the_port(fake: FakeOpenAI) -> None:
    """A 200 that is no chat completion is a transient failure: the port tries once more."""
    fake.script(malformed("<html>gateway</html>"), labels(("u1", "rule")))
    run = Transcript().users("never push to main").compact().run(model_on(fake))
    assert len(fake.requests) == 2
    assert rules(run) == [("u1", "never push to main", False)]


def test_a_cut_off_answer_gets_twice_the_output_budget(fake: FakeOpenAI) -> None:
    """Cut off with nothing usable: the retry asks for 8,192 tokens (twice 1,000, floored)."""
    fake.script(cut_off('{"labels": [{"message": "u1", "la'), labels(("u1", "rule")))
    run = Transcript().users("never push to main").compact().run(model_on(fake, max_tokens=1_000))
    assert [r.max_tokens for r in fake.requests] == [1_000, 8_192]
    assert rules(run) == [("u1", "never push to main", False)]


def test_the_fallback_model_makes_the_span_when_the_primary_is_down(fake: FakeOpenAI) -> None:
    """Primary 503: the fallback answers and the span record names it."""
    fake.script(http_error(503), model="primary")
    fake.script(labels(("u1", "rule")), model="backup")
    run = Transcript().users("never push to main").compact().run(model_on(fake, "backup"))
    assert fake.models() == ["primary", "backup"]
    assert record(run)["model"] == "backup"


def test_a_timeout_falls_back_and_then_closes_narrative_less(fake: FakeOpenAI) -> None:
    """A silent primary times out (idle 0.5 s) and the fallback answers; when the fallback is
    silent too, the span closes narrative-less from the ledger and the World."""
    fake.script(silent_reply(2.0), model="primary")
    fake.script(labels(("u1", "rule")), model="backup")
    run = Transcript().users("never push to main").compact().run(model_on(fake, "backup"))
    assert rules(run) == [("u1", "never push to main", False)]
    fake.default = silent_reply(2.0)
    transcript = Transcript().world(branch="main").users("never push").bash("ls", "a").compact()
    down = transcript.run(model_on(fake))
    rec = record(down)
    assert rec["narrativeKind"] == "narrative-less"
    assert rec["reason"] == "model-error:DiffModelError"
    assert rec["carried"] == ["u1"] and rec["world"] == {"branch": "main"}
    assert [c["id"] for c in state(down)["commands"]] == ["C1"]
    assert "narrative-less" in down.payloads[-1]["summary"]


def test_a_narrative_less_close_carries_at_most_thirty_messages(fake: FakeOpenAI) -> None:
    """Everything fails: the newest 30 messages are carried and offered whole next pass."""
    fake.default = http_error(500)
    transcript = Transcript().users(*[f"message {n}" for n in range(35)]).compact()
    run = transcript.run(model_on(fake))
    carried = record(run)["carried"]
    assert len(carried) == 30 and carried[0] == "u6" and carried[-1] == "u35"
    assert load_head(run.store, SID)["carried"] == carried


def test_a_pass_that_throws_records_a_fallback_and_changes_nothing(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model answers, but the pass itself throws: a fallback payload, no span closed."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("render failed")

    monkeypatch.setattr(pass_, "render", broken)
    fake.script(labels(("u1", "rule")))
    transcript = Transcript().users("never push to main").compact().users("next")
    run = transcript.run(model_on(fake))
    [payload] = run.payloads
    assert payload["fallback"] == "pass-error:RuntimeError" and payload["record"] is None
    head = load_head(run.store, SID)
    assert head["span"] == 0 and head["pending"] is None and head["n"]["u"] == 2
    assert state(run)["rules"] == []


# --- point 3: chunks --------------------------------------------------------------------------


def test_a_large_span_is_asked_in_chunks(fake: FakeOpenAI) -> None:
    """Four chunks of one big span, one call each; each prompt says which part it is."""
    texts = [f"never touch module {n}, " + "it is fragile " * 8 for n in range(8)]
    fake.default = lambda request: labels(*[(m, "rule") for m in sorted(set(_ids(request.prompt)))])
    config = LedgerConfig(chunk_chars=200)
    run = Transcript().users(*texts).compact().run(model_on(fake), config)
    assert len(fake.requests) == 4
    assert [f"part {n} of 4" in prompt(fake, n - 1) for n in range(1, 5)] == [True] * 4
    assert record(run)["chunks"] == 4 and len(rules(run)) == 8


def _ids(text: str) -> list[str]:
    """The ids of the "Messages to label" list of a prompt text."""
    section = text.split("## Messages to label", 1)[1].split("##", 1)[0]
    return [line.split(" ", 2)[1] for line in section.splitlines() if line.startswith("- u")]


def test_a_chunk_that_fails_is_carried_whole(fake: FakeOpenAI) -> None:
    """The second of two chunks never answers: the first's rules stand, the second's messages
    are carried whole, and the record says which chunk is missing."""
    texts = [f"never touch module {n}, " + "it is fragile " * 8 for n in range(4)]
    fake.script(labels(("u1", "rule"), ("u2", "rule")), http_error(400), http_error(400))
    config = LedgerConfig(chunk_chars=450)
    run = Transcript().users(*texts).compact().run(model_on(fake), config)
    rec = record(run)
    assert (rec["chunks"], rec["missing"], rec["carried"]) == (2, [2], ["u3", "u4"])
    assert [u for u, _, _ in rules(run)] == ["u1", "u2"]


# --- point 6: taking over from another compactor ---------------------------------------------


def test_taking_over_shows_the_summary_and_records_standing_rules(fake: FakeOpenAI) -> None:
    """At pi's compaction: its summary is in the prompt, head and tail; the standing message
    left unlabeled is recorded verbatim; the one marked `not a rule` is a one-off; a value of
    the earlier summary is kept only where its turn shows it."""
    summary = "## Goal\nShip it. Server on port 8080. " + "detail " * 500 + "\n## Next\nDeploy."
    values = [{"value": "8080", "turn": "C1"}, {"value": "3f9a2c1", "turn": "C1"}]
    fake.script(labels(("u2", "not a rule"), ("u3", "not a rule"), values=values))
    transcript = Transcript().users(
        "never deploy on a Friday, not even this time",
        "don't stop the server yet, ok?",
        "stop the server for now",
    )
    transcript.bash("npm start", "listening on port 8080").pi_compaction(summary)
    run = transcript.run(model_on(fake))
    text = prompt(fake, 0)
    assert "## The earlier compactor's summary (entry e6" in text
    assert "Ship it. Server on port 8080." in text and "## Next\nDeploy." in text
    assert "u1 (44 chars) [standing]" in text
    assert rules(run) == [("u1", "never deploy on a Friday, not even this time", False)]
    assert [v["value"] for v in state(run)["values"]] == ["8080"]
    rec = record(run)
    assert rec["takeover"] == "e6"
    assert (rec["counts"]["recorded"], rec["counts"]["oneOffs"]) == (1, 0)


def test_taking_over_a_one_off_and_a_withdrawal(fake: FakeOpenAI) -> None:
    """A standing message marked `not a rule` is not recorded; a withdrawal of an earlier
    message's rule, `lifts u<n>`, lifts what code recorded for it."""
    fake.script(labels(("u2", "not a rule"), ("u3", "lifts u1")))
    transcript = Transcript().users(
        "every dry-run line must start with DRY: from now on",
        "only push after the review this week",
        "the DRY: prefix rule is lifted",
    )
    run = transcript.pi_compaction().run(model_on(fake))
    assert rules(run) == [("u1", "every dry-run line must start with DRY: from now on", True)]
    assert record(run)["counts"]["oneOffs"] == 1


def test_the_call_is_json_mode_with_the_prompt_text(fake: FakeOpenAI) -> None:
    """What goes over the socket is the system prompt and the prompt text, in JSON mode."""
    fake.script(labels(("u1", "rule")))
    Transcript().users("never push to main").compact().run(model_on(fake))
    [request] = fake.requests
    assert request.body["response_format"] == {"type": "json_object"}
    assert json.dumps("never push to main")[1:-1] in request.prompt
