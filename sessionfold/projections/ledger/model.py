"""The model port of the ledger's diff call, and the offline model that needs no network.

A `DiffModel` gets one call's prompt data (`prompt.build_prompt`) and returns the parsed JSON
answer, or raises. The offline model is deterministic: it labels with the seed's heuristic
reading of standing rules (`heuristics`), recognises withdrawals (`rules.withdraws`), and
writes its narrative line and Now from the ledger. Whatever any model answers, code verifies.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from sessionfold.projections.ledger.heuristics import rule_sentences
from sessionfold.projections.ledger.rules import (
    judged_text,
    removed_spans,
    shared_words,
    withdraws,
)
from sessionfold.projections.ledger.text import Region, clip, quotable_regions


@runtime_checkable
class DiffModel(Protocol):
    """One diff call: prompt data in, the parsed JSON answer out (or an exception)."""

    name: str

    def diff(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """Answer one diff call."""
        ...


def standing_sentences(text: str) -> list[Region]:
    """Offsets in `text` of the user's own sentences that read as standing rules.

    Only quotable regions count; a sentence that touches a code fence, a blockquoted line or
    a quoted passage of six words or more is not the user's own and is not read.
    """
    found: list[Region] = []
    for start, end in quotable_regions(text):
        region = text[start:end]
        removed = removed_spans(region)
        for a, b in rule_sentences(region):
            if any(r0 < b and a < r1 for r0, r1 in removed):
                continue
            found.append((start + a, start + b))
    return found


class OfflineModel:
    """The deterministic default: heuristic labels, a narrative line from the ledger."""

    name = "offline"

    def __init__(self, whole_chars: int = 300, words_chars: int = 600) -> None:
        self.whole_chars = whole_chars
        self.words_chars = words_chars

    def diff(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """Label every message of the prompt (or answer its questions) and narrate the span."""
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
        if prompt["messages"]:
            last = prompt["messages"][-1]
            own = " ".join(last["excerpt"].split())
            answer["now"] = f"Last user request ({last['id']}): {clip(own, 240)}"
        return answer

    def _labels(self, prompt: dict[str, Any]) -> list[dict[str, Any]]:
        candidates: list[tuple[str, str]] = [(r["id"], r["words"]) for r in prompt["rules"]]
        labels = []
        for message in prompt["messages"]:
            text = message["text"]
            own = "\n\n".join(text[a:b] for a, b in quotable_regions(text))
            judged = judged_text(own)
            standing = standing_sentences(text)
            words = self._words(text, standing, message["chars"]) if standing else None
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

    def _words(self, text: str, standing: list[Region], chars: int) -> str | None:
        """The exact words of a long message's rule: its rule sentences, or the first alone."""
        if chars <= self.whole_chars:
            return None
        start, end = standing[0][0], standing[-1][1]
        if end - start > self.words_chars:
            end = standing[0][1]
        return text[start:end]

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
