"""The ledger's diff call over OpenAI-compatible HTTP (seed 002, "When the diff fails").

`HttpDiffModel.diff(prompt)` sends the prompt's text form (`prompt.prompt_text`), or in turns mode
the conversation so far (`prompt["turns"]`), and returns the answer's JSON object, handling what
goes wrong before the pass ever sees it:

- a format defect the model can fix (no JSON object in the answer, or one that does not fit the
  answer schema) is retried once with a note naming the defect; an answer that parsed is kept
  while the retry runs and returned when the retry does no better;
- an answer cut off at the output limit with nothing usable is retried with twice the output
  budget, at least 8,192 tokens and never past the model's own maximum; the call's trace
  records the raised budget;
- a model that is unavailable (timeouts, HTTP errors, a dropped connection) falls back to the
  fallback model through the HTTP core's retry;
- when everything fails, `diff` raises `DiffModelError` (its message holds codes, never text),
  and the pass closes narrative-less.

The pass verifies whatever comes back; this module only gets it into shape.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from sessionfold.ports.ledger.answer import AnswerError, parse_answer
from sessionfold.ports.ledger.prompt import prompt_text
from sessionfold.ports.model_http import Completion, HttpModelClient, ModelError

log = logging.getLogger(__name__)

#: Output budget of one diff call before any raise.
DEFAULT_DIFF_MAX_TOKENS = 4_096
#: The seed's floor for a raised budget.
RAISED_BUDGET_FLOOR = 8_192

SYSTEM_PROMPT = "You keep a coding session's ledger. Answer with one JSON object and nothing else."

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"^```[\w-]*\s*\n(.*?)\n?```\s*$", re.DOTALL)


class DiffModelError(RuntimeError):
    """No usable diff answer from any model. `reason` is a code, never message text."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"diff call failed: {reason}")


@dataclass(frozen=True, slots=True)
class DiffCall:
    """One HTTP call of a diff, as the trace records it (codes and counts only)."""

    model: str
    max_tokens: int
    outcome: str  # ok, no-json, broken-json, schema, cut-off, or the ModelError code
    answered: bool = True
    finish_reason: str | None = None
    note: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None


def raised_budget(budget: int, model_max: int | None, floor: int = RAISED_BUDGET_FLOOR) -> int:
    """Twice `budget`, at least `floor`, never past `model_max` (the seed's output-limit rule)."""
    raised = max(2 * budget, floor)
    return min(raised, model_max) if model_max is not None else raised


def extract_json(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """The JSON object an answer holds, or None and a defect code.

    Inline thinking (`<think>...</think>`), a code fence around the object and prose before
    or after it are tolerated; the first object that decodes wins.
    """
    body = _THINK.sub("", text).strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    if not body:
        return None, "empty"
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, RecursionError):  # the json module recurses per level
        value = None
    else:
        if isinstance(value, dict):
            return value, None
        return None, f"json-{type(value).__name__}"
    decoder = json.JSONDecoder()
    start = body.find("{")
    if start < 0:
        return None, "no-json"
    tries = 0
    while start >= 0 and tries < 20:
        try:
            value, _ = decoder.raw_decode(body, start)
        except (json.JSONDecodeError, RecursionError):
            value = None
        if isinstance(value, dict):
            return value, None
        start = body.find("{", start + 1)
        tries += 1
    return None, "broken-json"


def _note(problem: str, cut: bool) -> str:
    """The retry note: what was wrong, in codes and schema paths only."""
    if cut:
        return (
            "- the answer was cut off at the output limit: "
            "answer again, shorter, as one JSON object"
        )
    if problem in ("empty", "no-json", "broken-json") or problem.startswith("json-"):
        return (
            f"- the answer was not one JSON object ({problem}): answer again with one JSON object"
        )
    return f"- {problem}: answer again with one JSON object that fits the schema"


class HttpDiffModel:
    """The ledger's `DiffModel` over an `HttpModelClient`.

    `max_tokens` is the first call's output budget; `model_max_tokens` caps a raised budget
    (default: the primary endpoint's `max_output_tokens`); `json_mode` asks the server for a
    JSON object (`response_format`), which OpenAI, vLLM, llama.cpp, Ollama and most OpenRouter
    routes honour. `name` is the label of the model that answered last; `trace` holds the
    calls of the last `diff`, `usage_total` the tokens and cost of every call made.
    """

    def __init__(
        self,
        client: HttpModelClient,
        *,
        max_tokens: int = DEFAULT_DIFF_MAX_TOKENS,
        model_max_tokens: int | None = None,
        raised_floor: int = RAISED_BUDGET_FLOOR,
        json_mode: bool = True,
        system_prompt: str = SYSTEM_PROMPT,
    ) -> None:
        if max_tokens < 1:
            raise ValueError("max_tokens must be positive")
        self.client = client
        self.max_tokens = max_tokens
        self.model_max_tokens = (
            model_max_tokens if model_max_tokens is not None else client.primary.max_output_tokens
        )
        self.raised_floor = raised_floor
        self.json_mode = json_mode
        self.system_prompt = system_prompt
        self.name = client.label
        self.trace: list[DiffCall] = []
        self.calls_total = 0
        self.prompt_tokens_total = 0
        self.completion_tokens_total = 0
        self.cost_total: float | None = 0.0

    @classmethod
    def from_env(cls, model: str | None = None, **options: Any) -> HttpDiffModel:
        """A diff model on `HttpModelClient.from_env(model)`; `options` go to the constructor."""
        return cls(HttpModelClient.from_env(model), **options)

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()

    def diff(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """Answer one diff call with a JSON object, or raise `DiffModelError`."""
        self.trace = []
        budget = self.max_tokens
        if self.model_max_tokens is not None:
            budget = min(budget, self.model_max_tokens)
        note: str | None = None
        raised = False
        kept: dict[str, Any] | None = None
        problem: str | None = "no-answer"
        cut = False
        while True:
            try:
                completion = self.client.complete(
                    self._messages(prompt, note),
                    budget,
                    response_format={"type": "json_object"} if self.json_mode else None,
                )
            except ModelError as exc:
                failed = DiffCall(
                    exc.model, budget, exc.code, answered=False, note=note is not None
                )
                self._record(failed)
                if kept is not None:
                    return kept  # the answer that parsed stands
                raise DiffModelError(f"model-unavailable:{exc.code}") from exc
            self.name = completion.model
            value, problem = extract_json(completion.text)
            if value is not None:
                try:
                    parse_answer(value)
                except AnswerError as exc:
                    problem, kept = str(exc), value
                else:
                    self._record(_call(completion, budget, "ok", note))
                    return value
            cut = completion.finish_reason == "length" and value is None
            self._record(_call(completion, budget, "cut-off" if cut else _code(problem), note))
            if cut and not raised:
                more = raised_budget(budget, self.model_max_tokens, self.raised_floor)
                if more > budget:
                    budget, raised = more, True
                    continue
            if note is None:
                note = _note(problem or "no-json", cut)
                continue
            break
        if kept is not None:
            return kept
        raise DiffModelError(f"unusable:{'cut-off' if cut else _code(problem)}")

    def _messages(self, prompt: dict[str, Any], note: str | None) -> list[dict[str, str]]:
        turns = prompt.get("turns")
        if turns:
            # Turns mode: the conversation so far, as chat messages; a format note is one
            # more user message.
            conversation = [
                {"role": str(m["role"]), "content": str(m["content"])}
                for m in turns["conversation"]
            ]
            if note is not None:
                conversation.append({"role": "user", "content": note})
            return [{"role": "system", "content": self.system_prompt}, *conversation]
        if note is not None:
            earlier = prompt.get("retryNote")
            prompt = {**prompt, "retryNote": f"{earlier}\n{note}" if earlier else note}
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": prompt_text(prompt)},
        ]

    def _record(self, call: DiffCall) -> None:
        self.trace.append(call)
        self.calls_total += 1
        self.prompt_tokens_total += call.prompt_tokens
        self.completion_tokens_total += call.completion_tokens
        if call.answered and call.cost is None:
            self.cost_total = None  # one unknown price makes the total unknown
        elif call.cost is not None and self.cost_total is not None:
            self.cost_total += call.cost
        log.info(
            "diff call",
            extra={
                "ledger_model": {
                    "model": call.model,
                    "max_tokens": call.max_tokens,
                    "outcome": call.outcome,
                    "finish_reason": call.finish_reason,
                    "note": call.note,
                    "prompt_tokens": call.prompt_tokens,
                    "completion_tokens": call.completion_tokens,
                }
            },
        )


def _code(problem: str | None) -> str:
    """A defect as a trace code: the schema message becomes `schema`."""
    if problem is None:
        return "ok"
    return "schema" if problem.startswith("the answer") else problem


def _call(completion: Completion, budget: int, outcome: str, note: str | None) -> DiffCall:
    return DiffCall(
        model=completion.model,
        max_tokens=completion.max_tokens or budget,
        outcome=outcome,
        finish_reason=completion.finish_reason,
        note=note is not None,
        prompt_tokens=completion.usage.prompt_tokens,
        completion_tokens=completion.usage.completion_tokens,
        cost=completion.cost,
    )
