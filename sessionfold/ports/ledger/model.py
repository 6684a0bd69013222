"""The model port of the ledger's diff call, and the offline model that needs no network.

A `DiffModel` gets one call's prompt data (`prompt.build_prompt`) and returns the parsed JSON
answer, or raises. The offline model is deterministic: it labels with the seed's heuristic
reading of standing rules (`heuristics`), recognises withdrawals (`rules.withdraws`), names the
values the span's command outputs show, ranked by what the span's commands, errors and user
messages show of each, as many as an answer may hold (`values.span_values`), and writes its
narrative line and Now from the ledger. It names no value from an earlier compactor's
summary: it cannot read one. Whatever any model answers, code verifies.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, Protocol, runtime_checkable

from sessionfold.ports.ledger.answer import Answer
from sessionfold.ports.ledger.reading import standing_region_of
from sessionfold.projections.ledger.heuristics import WHOLE_CHARS, WORDS_REQUIRED_CHARS
from sessionfold.projections.ledger.rules import judged_text, shared_words, withdraws
from sessionfold.projections.ledger.text import Region, clip, quotable_regions
from sessionfold.projections.ledger.values import span_values

#: How many values one answer may name (the answer schema's bound: more fails the schema).
VALUES_PER_ANSWER = next(
    (m.max_length for m in Answer.model_fields["values"].metadata if hasattr(m, "max_length")), 20
)


@runtime_checkable
class DiffModel(Protocol):
    """One diff call: prompt data in, the parsed JSON answer out (or an exception)."""

    name: str

    def diff(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """Answer one diff call."""
        ...


class OfflineModel:
    """The deterministic default: heuristic labels, a narrative line from the ledger."""

    name = "offline"

    def __init__(
        self,
        whole_chars: int = WHOLE_CHARS,
        words_chars: int = WORDS_REQUIRED_CHARS,
        values_per_span: int = VALUES_PER_ANSWER,
        values_per_command: int = 4,
    ) -> None:
        self.whole_chars = whole_chars
        self.words_chars = words_chars
        self.values_per_span = values_per_span
        self.values_per_command = values_per_command

    def diff(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """Label every message of the prompt (or answer its questions) and narrate the span."""
        if prompt.get("turns"):
            return self._turn(prompt)
        if prompt.get("questions"):
            return {"labels": self._answer_questions(prompt), "narrative": "questions"}
        labels = self._labels(prompt)
        commands = prompt.get("commands", [])
        failed = sum(1 for c in commands if c.get("status") not in ("ok", "unknown"))
        rules = sum(1 for item in labels if item["label"].startswith("rule"))
        lifts = sum(1 for item in labels if "lifts" in item["label"])
        narrative = (
            f"{len(prompt['messages'])} user messages, {len(commands)} commands "
            f"({failed} failed), {len(prompt.get('errors', []))} errors; "
            f"rule labels {rules}, lift labels {lifts} (offline reading)."
        )
        answer: dict[str, Any] = {"labels": labels, "narrative": narrative}
        values = span_values(
            commands,
            self.values_per_command,
            min(self.values_per_span, VALUES_PER_ANSWER),
            messages=prompt["messages"],
            errors=prompt.get("errors", []),
        )
        if values:
            answer["values"] = values
        if prompt["messages"]:
            last = prompt["messages"][-1]
            own = " ".join(last["excerpt"].split())
            answer["now"] = f"Last user request ({last['id']}): {clip(own, 240)}"
        return answer

    def _turn(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """Turns mode: one section's answer, written from the ledger as the single call is."""
        turns = prompt["turns"]
        section = turns["section"]
        asked = next(
            (m["content"] for m in reversed(turns["conversation"]) if m["role"] == "user"), ""
        )
        if asked.startswith("Questions"):
            return {"labels": []}  # stay with the labels given: no silent withdrawal
        if asked.startswith("Expected, not met"):
            return {"excuse": "The offline model writes this section from the ledger alone."}
        whole = self.diff({**prompt, "turns": None})
        messages = prompt["messages"]
        if section == "narrative":
            modified = [
                PurePosixPath(f["path"]).name
                for f in prompt.get("files", [])
                if f["op"] == "modified"
            ]
            narrative = whole["narrative"]
            if modified:
                narrative += " Modified: " + ", ".join(dict.fromkeys(modified)) + "."
            return {"narrative": clip(narrative, 400)}
        if section == "objective":
            if not messages:
                return {"objective": "(no user message in this span)"}
            first = messages[0]
            return {"objective": clip(f"As {first['id']} put it: {first['excerpt']}", 400)}
        if section == "labels":
            standing = set(prompt.get("standing", []))
            return {"labels": [i for i in whole["labels"] if i["message"] not in standing]}
        if section == "notes":
            return {"decisions": [], "deadEnds": [], "openErrors": prompt.get("unfixedErrors", [])}
        now = whole.get("now") or "No user request in this span."
        resume = f"continue with {messages[-1]['id']}'s request" if messages else "continue"
        return {"now": now, "resume": resume}

    def _labels(self, prompt: dict[str, Any]) -> list[dict[str, Any]]:
        candidates: list[tuple[str, str]] = [(r["id"], r["words"]) for r in prompt["rules"]]
        labels = []
        for message in prompt["messages"]:
            text = message["text"]
            own = "\n\n".join(text[a:b] for a, b in quotable_regions(text))
            judged = judged_text(own)
            # The region is None exactly when no sentence reads as a standing rule.
            region = standing_region_of(text, self.whole_chars, self.words_chars)
            standing = region is not None
            words = self._words(text, region) if region is not None else None
            target = self._target(judged, words, candidates)
            item: dict[str, Any] = {"message": message["id"]}
            if target and standing:
                item["label"] = f"rule and lifts {target}"
            elif target:
                item["label"] = f"lifts {target}"
            elif standing:
                item["label"] = "rule"
            else:
                item["label"] = "not a rule"
            if words is not None:
                item["words"] = words
            if target:
                candidates = [c for c in candidates if c[0] != target]
            if standing:
                candidates.append((message["id"], words or own))
            labels.append(item)
        return labels

    @staticmethod
    def _target(judged: str, words: str | None, candidates: list[tuple[str, str]]) -> str | None:
        """The rule a withdrawing message lifts: the one sharing the most words, newest first."""
        if not withdraws(judged):
            return None
        scored = [
            (len(shared_words(judged, rule_words)), index, target_id)
            for index, (target_id, rule_words) in enumerate(candidates)
        ]
        best = max(scored, default=(0, 0, None))
        target = best[2] if best[0] > 0 else None
        if target is not None and words is not None:
            # A long message's rule is its words: they must withdraw the target too.
            judged_words = judged_text(words)
            target_words = dict(candidates)[target]
            if not (withdraws(judged_words) and shared_words(judged_words, target_words)):
                return None
        return target

    def _words(self, text: str, region: Region) -> str | None:
        """The exact words of a long message's rule (its rule sentences, or the first alone:
        its standing `region`); None for a message short enough to be its rule whole."""
        whole = sum(end - start for start, end in quotable_regions(text)) <= self.whole_chars
        return None if whole else text[region[0] : region[1]]

    def _answer_questions(self, prompt: dict[str, Any]) -> list[dict[str, Any]]:
        texts = {m["id"]: m["text"] for m in prompt["messages"]}
        rules = {r["id"]: r["words"] for r in prompt["rules"]}
        rules.update({m["id"]: m["text"] for m in prompt["messages"]})
        labels = []
        for question in prompt["questions"]:
            message = question["message"]
            judged = judged_text(texts.get(message, ""))
            if question["kind"] == "may-replace":
                # Stay with the label given: a stale rule in view beats a silent withdrawal.
                labels.append({"message": message, "label": "rule"})
                continue
            scored = [
                (len(shared_words(judged, rules.get(target, ""))), target)
                for target in question.get("allowed", [])
            ]
            best = max(scored, default=(0, ""))
            if best[0] > 0 and withdraws(judged):
                labels.append({"message": message, "label": f"lifts {best[1]}"})
            else:
                labels.append({"message": message, "label": "not a rule"})
        return labels
