"""HttpDiffModel against the fake server: seed 002's "When the diff fails" — the format retry
with a note (a parsed answer kept meanwhile), the output-limit retry with a doubled budget, the
fallback model, a clean exception when everything fails, and the pass closing narrative-less."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fake_openai import FakeOpenAI, answer, cut_off, http_error, json_answer

from sessionfold.events.envelope import EntryEnvelope, EntryPayload
from sessionfold.ports.ledger.model import DiffModel
from sessionfold.ports.ledger.prompt import INSTRUCTIONS
from sessionfold.ports.ledger_http import (
    DiffModelError,
    HttpDiffModel,
    extract_json,
    raised_budget,
)
from sessionfold.ports.model_http import (
    HttpModelClient,
    Price,
    Timeouts,
    resolve_endpoint,
    resolve_fallback,
)
from sessionfold.streams.runtime.ledger_loop import fold_records

FAST = Timeouts(idle_s=0.5, ceiling_s=3.0, connect_s=1.0)
GOOD = {"labels": [{"message": "u1", "label": "rule"}], "narrative": "set a rule", "now": "idle"}
SCHEMA_DEFECT = {"labels": [{"message": "u1", "label": "rule"}], "narrative": "n" * 500}
PROMPT: dict[str, Any] = {
    "instructions": INSTRUCTIONS,
    "span": 1,
    "messages": [
        {
            "id": "u1",
            "entry": "e2",
            "chars": 22,
            "excerpt": "never push to main",
            "text": "never push to main",
        }
    ],
    "rules": [],
    "commands": [],
    "errors": [],
    "world": None,
    "now": None,
}


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    """A running fake server."""
    with FakeOpenAI() as server:
        yield server


def diff_model(
    fake: FakeOpenAI,
    *,
    fallback: str | None = None,
    model_max: int | None = None,
    **options: Any,
) -> HttpDiffModel:
    primary = resolve_endpoint(
        "primary", base_url=fake.base_url, env={}, max_output_tokens=model_max
    )
    client = HttpModelClient(
        primary,
        fallback=resolve_fallback(fallback, primary, env={}) if fallback else None,
        timeouts=FAST,
        retry_wait_s=0.0,
        prices={"primary": Price(1.0, 2.0)},
    )
    return HttpDiffModel(client, **options)


def user_text(fake: FakeOpenAI, n: int) -> str:
    return fake.requests[n].body["messages"][1]["content"]


def test_a_good_answer_is_returned_as_is(fake: FakeOpenAI) -> None:
    """One call: system and user messages, JSON mode, the prompt's text; the answer back."""
    fake.script(json_answer(GOOD, usage=(2_000, 100)))
    model = diff_model(fake, max_tokens=2_000)
    assert isinstance(model, DiffModel)
    assert model.diff(PROMPT) == GOOD
    [request] = fake.requests
    assert request.body["response_format"] == {"type": "json_object"}
    assert request.body["max_tokens"] == 2_000
    assert request.body["messages"][0]["role"] == "system"
    assert "never push to main" in user_text(fake, 0)
    assert [c.outcome for c in model.trace] == ["ok"]
    assert model.name == "primary"
    assert model.cost_total == pytest.approx((2_000 * 1.0 + 100 * 2.0) / 1e6)


def test_json_is_found_inside_fences_prose_and_thinking() -> None:
    """Slips around the object are tolerated; what holds no object is named by code."""
    wrapped = "<think>the user wants {x}</think>\n```json\n" + json.dumps(GOOD) + "\n```"
    assert extract_json(wrapped) == (GOOD, None)
    assert extract_json("Here it is: " + json.dumps(GOOD) + " hope it helps") == (GOOD, None)
    assert extract_json("no object here") == (None, "no-json")
    assert extract_json('{"labels": [') == (None, "broken-json")
    assert extract_json("[1, 2]") == (None, "json-list")
    assert extract_json("  ") == (None, "empty")


def test_a_format_defect_is_retried_once_with_a_note(fake: FakeOpenAI) -> None:
    """Broken JSON: the second call carries a note naming the defect, and its answer stands."""
    fake.script(answer('{"labels": [{"message": "u1",'), json_answer(GOOD))
    model = diff_model(fake)
    assert model.diff(PROMPT) == GOOD
    assert len(fake.requests) == 2
    assert "## Fix these and answer again in full" not in user_text(fake, 0)
    note = user_text(fake, 1).split("## Fix these and answer again in full\n", 1)[1]
    assert note.startswith("- the answer was not one JSON object (broken-json)")
    assert [(c.outcome, c.note) for c in model.trace] == [("broken-json", False), ("ok", True)]


def test_a_note_is_added_to_the_passs_own_retry_note(fake: FakeOpenAI) -> None:
    """A prompt that already carries the pass's note keeps it; ours follows."""
    fake.script(answer("not json"), json_answer(GOOD))
    diff_model(fake).diff({**PROMPT, "retryNote": "- u1 is not labelled"})
    text = user_text(fake, 1)
    assert "- u1 is not labelled\n- the answer was not one JSON object (no-json)" in text


def test_a_parsed_answer_is_kept_while_the_retry_runs(fake: FakeOpenAI) -> None:
    """A schema defect is sent back once; when the retry is worse, the parsed answer stands."""
    fake.script(json_answer(SCHEMA_DEFECT), answer("<html>oops</html>"))
    model = diff_model(fake)
    assert model.diff(PROMPT) == SCHEMA_DEFECT
    assert "narrative: string_too_long" in user_text(fake, 1)
    assert [c.outcome for c in model.trace] == ["schema", "no-json"]


def test_a_format_defect_twice_raises(fake: FakeOpenAI) -> None:
    """Two answers with no JSON: exactly two calls, then DiffModelError naming the defect."""
    fake.script(answer("I cannot do that"), answer('{"labels": ['), answer("unused"))
    with pytest.raises(DiffModelError, match="unusable:broken-json"):
        diff_model(fake).diff(PROMPT)
    assert len(fake.requests) == 2


@pytest.mark.parametrize(
    ("budget", "model_max", "raised"),
    [(1_000, None, 8_192), (6_000, None, 12_000), (6_000, 10_000, 10_000)],
)
def test_a_cut_off_answer_is_retried_with_a_doubled_budget(
    fake: FakeOpenAI, budget: int, model_max: int | None, raised: int
) -> None:
    """Cut off with nothing usable: twice the budget, at least 8,192, never past the model's
    maximum; the recorded request and the trace show the raised budget; no note is sent."""
    fake.script(cut_off('{"labels": [{"message": "u1", "lab'), json_answer(GOOD))
    model = diff_model(fake, max_tokens=budget, model_max=model_max)
    assert model.diff(PROMPT) == GOOD
    assert [r.max_tokens for r in fake.requests] == [budget, raised]
    assert [(c.max_tokens, c.outcome) for c in model.trace] == [(budget, "cut-off"), (raised, "ok")]
    assert "## Fix these" not in user_text(fake, 1)
    assert raised_budget(budget, model_max) == raised


def test_a_cut_off_answer_at_the_models_maximum_gets_a_note_instead(fake: FakeOpenAI) -> None:
    """No room to raise the budget: the one retry asks for a shorter answer instead."""
    fake.script(cut_off('{"labels": ['), cut_off('{"labels": ['))
    model = diff_model(fake, max_tokens=9_000, model_max=9_000)
    with pytest.raises(DiffModelError, match="unusable:cut-off"):
        model.diff(PROMPT)
    assert [r.max_tokens for r in fake.requests] == [9_000, 9_000]
    assert "cut off at the output limit" in user_text(fake, 1)


def test_a_cut_off_answer_that_parses_is_used(fake: FakeOpenAI) -> None:
    """finish_reason "length" with a complete object: usable, no retry."""
    fake.script(cut_off(json.dumps(GOOD)))
    assert diff_model(fake).diff(PROMPT) == GOOD
    assert len(fake.requests) == 1


def test_the_fallback_model_answers_when_the_primary_is_unavailable(fake: FakeOpenAI) -> None:
    """Primary 503: the fallback answers and is named as the model that made the span."""
    fake.script(http_error(503), model="primary")
    fake.script(json_answer(GOOD), model="backup")
    model = diff_model(fake, fallback="backup")
    assert model.diff(PROMPT) == GOOD
    assert fake.models() == ["primary", "backup"]
    assert model.name == "backup"


def test_everything_failing_raises_a_clean_exception(fake: FakeOpenAI) -> None:
    """Primary and fallback both down: DiffModelError with a code, no text; the cause kept."""
    fake.script(http_error(500), model="primary")
    fake.script(http_error(503), model="backup")
    with pytest.raises(DiffModelError) as caught:
        diff_model(fake, fallback="backup").diff(PROMPT)
    assert str(caught.value) == "diff call failed: model-unavailable:http-status:503"
    assert "never push" not in str(caught.value)
    assert fake.models() == ["primary", "backup"]


# --- through the pass ----------------------------------------------------------------------------


def session(sid: str) -> list[EntryEnvelope]:
    """A header, one user rule and an assistant reply."""

    def entry(seq: int, body: dict[str, Any]) -> EntryEnvelope:
        full = {"id": f"e{seq}", "parentId": None, "timestamp": "2025-01-01T00:00:00Z", **body}
        return EntryEnvelope(session_id=sid, seq=seq, payload=EntryPayload(entry=full))

    said = [{"type": "text", "text": "never push to main"}]
    reply = [{"type": "text", "text": "understood"}]
    return [
        entry(1, {"type": "session", "version": 3}),
        entry(2, {"type": "message", "message": {"role": "user", "content": said}}),
        entry(3, {"type": "message", "message": {"role": "assistant", "content": reply}}),
    ]


def test_the_pass_records_the_models_rule(fake: FakeOpenAI) -> None:
    """A pass over a session with HttpDiffModel: the rule is recorded, the model named."""
    fake.script(json_answer(GOOD))
    run = fold_records(session("s-ok"), diff_model(fake))
    [payload] = run.payloads
    assert payload["record"]["narrativeKind"] == "model"
    assert payload["record"]["model"] == "primary"
    assert [e["words"] for e in payload["events"] if e.get("id", "").startswith("R")] == [
        "never push to main"
    ]


def test_the_pass_closes_narrative_less_when_the_model_fails(fake: FakeOpenAI) -> None:
    """Every call fails: the pass still closes, narrative-less, its message carried."""
    fake.default = http_error(500)
    run = fold_records(session("s-down"), diff_model(fake))
    [payload] = run.payloads
    record = payload["record"]
    assert record["narrativeKind"] == "narrative-less"
    assert record["carried"] == ["u1"]
    assert record["reason"].startswith("model-error:DiffModelError")
