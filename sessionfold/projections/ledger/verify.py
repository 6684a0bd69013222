"""Code's checks of a diff answer, before any of it is accepted (seeds/002, "The pass").

- Every quoted rule must be a verbatim substring of a user message; a quote cited under the
  wrong message binds to the newest message that does hold it; text no user wrote is rejected.
- In a pi-goal `/goal` message only the objective is quotable (`text.quotable_regions`).
- Code copies a rule's words from the message (start/end offsets), never from the answer.
- A message of at most 300 characters is kept whole even when the model gave words; one over
  600 must come with the rule's exact words; words that start or end inside a word go back.
- A lift is applied only when the message withdraws something and shares a word with the rule
  (`rules.lift_check`, quotes, blockquotes and fences left out); otherwise the model is asked
  again with the rule shown, and a lift it still cannot place is dropped. A rule label whose
  message would pass the lift check against a rule in force is asked about too.
- An evidence id the ledger does not know is dropped and its decision or dead end kept.
- A value is kept only where it stands verbatim in the turn it names.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from sessionfold.projections.ledger.answer import Answer, parse_label
from sessionfold.projections.ledger.context import OfferedMessage, PassContext
from sessionfold.projections.ledger.rules import lift_check
from sessionfold.projections.ledger.text import at_word_boundaries, clip, quotable_text

#: A message up to this long is recorded whole, even when words were given.
WHOLE_CHARS = 300
#: A message over this long is recorded only from the exact words given for it.
WORDS_REQUIRED_CHARS = 600


@dataclass(frozen=True, slots=True)
class AcceptedRule:
    """A rule code cut from a message: words == the message text[start:end]."""

    u: str
    entry: str | None
    start: int
    end: int
    words: str


@dataclass(frozen=True, slots=True)
class AcceptedLift:
    """A withdrawal that passed the lift check: of a state rule (R<n>) or a span rule (u<n>)."""

    target: str
    by: str
    replaces: bool  # the message's own new rule replaces the target


@dataclass(frozen=True, slots=True)
class Question:
    """One question about a lift, asked once the answer is settled."""

    kind: Literal["check", "replaced", "may-replace"]
    message: str
    target: str
    allowed: tuple[str, ...]  # the lift targets a reply may name
    text: str


@dataclass(slots=True)
class Verdict:
    """What code accepted of an answer, what it sends back, and what it dropped (by code)."""

    rules: list[AcceptedRule] = field(default_factory=list)
    lifts: list[AcceptedLift] = field(default_factory=list)
    labeled: set[str] = field(default_factory=set)
    decisions: list[tuple[str, list[str]]] = field(default_factory=list)
    dead_ends: list[tuple[str, list[str]]] = field(default_factory=list)
    values: list[tuple[str, str, str]] = field(default_factory=list)
    narrative: str = ""
    now: str = ""
    defects: list[str] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)

    def rule_of(self, message: str) -> AcceptedRule | None:
        """The first rule recorded from a message."""
        return next((rule for rule in self.rules if rule.u == message), None)

    def lifted(self) -> set[str]:
        """Targets some accepted lift already withdraws."""
        return {lift.target for lift in self.lifts}

    def unlabeled(self, context: PassContext) -> list[str]:
        """Offered messages the answer left without a readable label."""
        return [mid for mid in context.messages if mid not in self.labeled]


def verify(answer: Answer, context: PassContext) -> Verdict:
    """Check a schema-valid answer against the pass context; nothing unverified gets through."""
    return _Verifier(context).run(answer)


class _Verifier:
    def __init__(self, context: PassContext) -> None:
        self.context = context
        self.verdict = Verdict()

    def run(self, answer: Answer) -> Verdict:
        """Verify labels in message order, then notes, values, narrative and Now."""
        context, verdict = self.context, self.verdict
        by_message = {}
        for item in answer.labels:
            if item.message not in context.messages:
                verdict.dropped["label-unknown-message"] += 1
                verdict.defects.append(
                    f"{item.message} is not a message of this span: label only the listed ones"
                )
            elif item.message in by_message:
                verdict.dropped["label-duplicate"] += 1
            else:
                by_message[item.message] = item
        for mid, message in context.messages.items():
            item = by_message.get(mid)
            if item is None:
                continue
            parsed = parse_label(item.label)
            if parsed is None:
                verdict.dropped["label-unreadable"] += 1
                verdict.defects.append(
                    f"{mid}: unreadable label; answer rule, not a rule, lifts R<n> "
                    "or rule and lifts R<n>"
                )
                continue
            verdict.labeled.add(mid)
            rule = self._rule(message, item.words) if parsed.rule else None
            if rule is not None and all(
                (r.u, r.start, r.end) != (rule.u, rule.start, rule.end) for r in verdict.rules
            ):
                verdict.rules.append(rule)
            for target in parsed.lifts:
                self._lift(message, target, item.words, replaces=rule is not None)
        unlabeled = verdict.unlabeled(context)
        if unlabeled:
            verdict.dropped["unlabeled"] += len(unlabeled)
            verdict.defects.append(f"unlabeled: {', '.join(unlabeled)}; label every message")
        self._may_replace()
        verdict.decisions = [self._note(note.text, note.evidence) for note in answer.decisions]
        verdict.dead_ends = [self._note(note.text, note.evidence) for note in answer.deadEnds]
        for value in answer.values:
            turn = context.turns.get(value.turn)
            if turn is not None and value.value in turn:
                verdict.values.append((value.value, value.turn, value.what.strip()))
            else:
                verdict.dropped["value-not-verbatim"] += 1
        verdict.narrative = " ".join(answer.narrative.split())
        verdict.now = answer.now.strip()
        if not verdict.narrative:
            verdict.defects.append("the narrative line is missing")
        return verdict

    # --- rules ------------------------------------------------------------------------

    def _locate(self, words: str, cited: OfferedMessage) -> tuple[OfferedMessage, int, int] | None:
        """Where the words stand: in the cited message, else the newest message holding them.

        Only quotable regions count; an occurrence at word boundaries is preferred.
        """
        others = sorted(
            (m for m in self.context.messages.values() if m.id != cited.id),
            key=lambda m: m.seq,
            reverse=True,
        )
        for message in (cited, *others):
            fallback = None
            for start, end in message.regions:
                index = message.text.find(words, start, end)
                while index != -1:
                    if at_word_boundaries(message.text, index, index + len(words)):
                        return message, index, index + len(words)
                    fallback = fallback or (message, index, index + len(words))
                    index = message.text.find(words, index + 1, end)
            if fallback is not None:
                return fallback
        return None

    def _rule(self, message: OfferedMessage, words: str | None) -> AcceptedRule | None:
        verdict = self.verdict
        bound, position = message, None
        if words:
            located = self._locate(words, message)
            if located is None:
                verdict.dropped["quote-not-verbatim"] += 1
                if message.quotable_chars > WORDS_REQUIRED_CHARS:
                    verdict.defects.append(
                        f"{message.id}: the words given are in no user message; copy the "
                        f"rule's exact words from {message.id}"
                    )
                    return None
            else:
                bound, start, end = located
                if bound.id != message.id:
                    verdict.dropped["quote-rebound"] += 1
                if at_word_boundaries(bound.text, start, end):
                    position = (start, end)
                else:
                    verdict.dropped["quote-inside-word"] += 1
                    if bound.quotable_chars > WORDS_REQUIRED_CHARS:
                        verdict.defects.append(
                            f"{message.id}: the words given start or end inside a word; "
                            "give whole words"
                        )
                        return None
        size = bound.quotable_chars
        if size <= WHOLE_CHARS or (size <= WORDS_REQUIRED_CHARS and position is None):
            # A short message is kept whole: a part can lean on the rest.
            region = bound.region_of(*position) if position else bound.whole()
        elif position is None:
            verdict.dropped["long-without-words"] += 1
            verdict.defects.append(
                f"{message.id} is over {WORDS_REQUIRED_CHARS} characters: give the rule's "
                "exact words"
            )
            return None
        else:
            region = position
        if region is None:
            verdict.dropped["empty-message"] += 1
            return None
        start, end = region
        return AcceptedRule(bound.id, bound.entry, start, end, bound.text[start:end])

    # --- lifts ------------------------------------------------------------------------

    def _target_words(self, target: str) -> str | None:
        """The words of a lift target still in force: a state rule or a rule of this span."""
        if target.startswith("u"):
            rule = self.verdict.rule_of(target)
            return rule.words if rule else None
        rule = self.context.rules.get(target)
        return rule.words if rule and not rule.lifted else None

    def _judged(self, message: OfferedMessage, words: str | None) -> tuple[str, list[str]]:
        given = [words] if words and words in message.text else []
        return quotable_text(message.text), given

    def _lift(
        self, message: OfferedMessage, target: str, words: str | None, *, replaces: bool
    ) -> None:
        verdict, context = self.verdict, self.context
        if target in verdict.lifted() or target == message.id:
            verdict.dropped["lift-duplicate"] += 1
            return
        state_rule = context.rules.get(target)
        if target.startswith("R") and state_rule is None:
            verdict.dropped["lift-unknown-target"] += 1
            verdict.defects.append(f"{message.id}: {target} is no rule of the state")
            return
        if state_rule is not None and state_rule.lifted:
            successor = context.rules.get(state_rule.replaced_by or "")
            if successor is not None and not successor.lifted:
                text = (
                    f"{message.id} is labeled `lifts {target}`, but {successor.id} "
                    f"({successor.u}) already replaced it: {_quote(successor.words)}. Answer "
                    f"`lifts {successor.id}` if {message.id} withdraws that, or `not a rule`."
                )
                verdict.questions.append(
                    Question("replaced", message.id, target, (successor.id,), text)
                )
            else:
                verdict.dropped["lift-already-lifted"] += 1
            return
        rule_words = self._target_words(target)
        if rule_words is None:
            verdict.dropped["lift-unknown-target"] += 1
            verdict.defects.append(f"{message.id}: {target} gave no rule to lift")
            return
        text, given = self._judged(message, words)
        if lift_check(text, rule_words, given):
            verdict.lifts.append(AcceptedLift(target, message.id, replaces))
            return
        allowed = tuple(
            [rule.id for rule in context.in_force() if rule.id not in verdict.lifted()]
            + [rule.u for rule in verdict.rules if rule.u != message.id]
        )
        text = (
            f"{message.id} is labeled `lifts {target}`, but its own words do not withdraw "
            f"{target}: {_quote(rule_words)}. Answer `lifts <id>` naming the rule it "
            "withdraws, or `not a rule`."
        )
        verdict.questions.append(Question("check", message.id, target, allowed, text))

    def _may_replace(self) -> None:
        """Ask about each rule label whose message would pass the lift check on a live rule."""
        verdict, context = self.verdict, self.context
        for rule in list(verdict.rules):
            message = context.messages[rule.u]
            text, given = self._judged(message, rule.words)
            earlier = [(r.id, r.u, r.words) for r in context.in_force()] + [
                (r.u, r.u, r.words)
                for r in verdict.rules
                if context.messages[r.u].seq < message.seq
            ]
            for target, giver, words in earlier:
                if target in verdict.lifted() or not lift_check(text, words, given):
                    continue
                question = (
                    f"{message.id} is labeled `rule` and may replace the rule {giver} gave "
                    f"({_quote(words)}): answer `rule and lifts {target}` or `rule`. Lift only "
                    "when the user's own words withdraw it; quoted or pasted text does not."
                )
                verdict.questions.append(
                    Question("may-replace", message.id, target, (target,), question)
                )

    def _note(self, text: str, evidence: list[str]) -> tuple[str, list[str]]:
        known = [item for item in evidence if item in self.context.known]
        self.verdict.dropped["evidence-unknown"] += len(evidence) - len(known)
        return " ".join(text.split()), list(dict.fromkeys(known))


def apply_replies(verdict: Verdict, reply: Answer, context: PassContext) -> int:
    """Fold a reply to the lift questions into the settled verdict; return lifts added.

    Only the asked messages are read; the only change a reply can make is to add an asked
    target to that label's lifts, and the added lift must still pass the lift check.
    """
    asked: dict[str, list[Question]] = {}
    for question in verdict.questions:
        asked.setdefault(question.message, []).append(question)
    added = 0
    seen: set[str] = set()
    for item in reply.labels:
        questions = asked.get(item.message)
        parsed = parse_label(item.label)
        if not questions or parsed is None or item.message in seen:
            continue
        seen.add(item.message)
        message = context.messages[item.message]
        own_rule = verdict.rule_of(item.message)
        for question in questions:
            if question.kind == "may-replace" and not parsed.rule:
                continue  # `rule` (or anything else) keeps the label as it was
            for target in parsed.lifts:
                if target not in question.allowed or target in verdict.lifted():
                    continue
                words = _words_of(target, verdict, context)
                text = quotable_text(message.text)
                given = [own_rule.words] if own_rule else []
                if words is not None and lift_check(text, words, given):
                    verdict.lifts.append(AcceptedLift(target, item.message, own_rule is not None))
                    added += 1
    return added


def _words_of(target: str, verdict: Verdict, context: PassContext) -> str | None:
    if target.startswith("u"):
        rule = verdict.rule_of(target)
        return rule.words if rule else None
    rule = context.rules.get(target)
    return rule.words if rule and not rule.lifted else None


def _quote(words: str) -> str:
    return '"' + clip(" ".join(words.split()), 200) + '"'
