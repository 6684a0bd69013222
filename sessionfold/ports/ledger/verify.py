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
- A lift of a rule a narrowing already replaced is asked again with the narrowing shown (by
  its u<n> when its id is new), so the narrowing is lifted only by name; a lift of a
  replacement must also name what it set beyond the rule it replaced.
- Taking over from another compactor: an earlier message that reads as a standing rule and is
  left unlabeled is recorded as code cut it; labeled `not a rule`, it is a one-off.
- An evidence id the ledger does not know is dropped and its decision or dead end kept.
- A value is kept only where it stands verbatim in the turn it names.
- A chunk of a large span is verified on top of what the earlier chunks accepted (`prior`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from sessionfold.ports.ledger.answer import Answer, parse_label
from sessionfold.ports.ledger.context import OfferedMessage, PassContext
from sessionfold.projections.ledger.heuristics import WHOLE_CHARS, WORDS_REQUIRED_CHARS
from sessionfold.projections.ledger.rules import lift_check
from sessionfold.projections.ledger.text import at_word_boundaries, clip, quotable_text


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
    # Taking over: earlier messages code recorded as rules (left unlabeled), and those the
    # model marked a one-off (`not a rule`) although they read as standing.
    recorded: list[str] = field(default_factory=list)
    one_offs: list[str] = field(default_factory=list)

    def rule_of(self, message: str) -> AcceptedRule | None:
        """The first rule recorded from a message."""
        return next((rule for rule in self.rules if rule.u == message), None)

    def lifted(self) -> set[str]:
        """Targets some accepted lift already withdraws."""
        return {lift.target for lift in self.lifts}

    def unlabeled(self, context: PassContext) -> list[str]:
        """Offered messages the answer left without a readable label."""
        return [mid for mid in context.messages if mid not in self.labeled]

    def carry(self) -> Verdict:
        """A new verdict that starts from everything this one accepted (the next chunk's)."""
        return Verdict(
            rules=list(self.rules),
            lifts=list(self.lifts),
            labeled=set(self.labeled),
            decisions=list(self.decisions),
            dead_ends=list(self.dead_ends),
            values=list(self.values),
            now=self.now,
            dropped=Counter(self.dropped),
            recorded=list(self.recorded),
            one_offs=list(self.one_offs),
        )


def verify(answer: Answer, context: PassContext, prior: Verdict | None = None) -> Verdict:
    """Check a schema-valid answer against the pass context; nothing unverified gets through.

    With `prior` (the verdict of the span's earlier chunks) the result holds what the
    earlier chunks accepted too, so a chunk may lift a rule an earlier chunk's message gave.
    """
    return _Verifier(context, prior).run(answer)


class _Verifier:
    def __init__(self, context: PassContext, prior: Verdict | None = None) -> None:
        self.context = context
        self.verdict = prior.carry() if prior is not None else Verdict()
        self.first_new_rule = len(self.verdict.rules)

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
                # Taking over: in message order, so a later message may lift it by its u<n>.
                self._record_standing(message)
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
            if mid in context.standing and not parsed.rule and not parsed.lifts:
                verdict.one_offs.append(mid)
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
        verdict.decisions += [self._note(note.text, note.evidence) for note in answer.decisions]
        verdict.dead_ends += [self._note(note.text, note.evidence) for note in answer.deadEnds]
        for value in answer.values:
            turn = context.turns.get(value.turn)
            if turn is not None and value.value in turn:
                verdict.values.append((value.value, value.turn, value.what.strip()))
            else:
                verdict.dropped["value-not-verbatim"] += 1
        verdict.narrative = " ".join(answer.narrative.split())
        verdict.now = answer.now.strip() or verdict.now
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

    def _record_standing(self, message: OfferedMessage) -> None:
        """Taking over: an earlier message that reads as a standing rule and was left unlabeled
        is recorded as code cut it (a summary paraphrases; the user's words are what holds).
        A message the model labeled is judged by its label instead."""
        verdict = self.verdict
        region = self.context.standing.get(message.id)
        if region is None:
            return
        verdict.labeled.add(message.id)
        start, end = region
        rule = AcceptedRule(message.id, message.entry, start, end, message.text[start:end])
        if all((r.u, r.start, r.end) != (rule.u, rule.start, rule.end) for r in verdict.rules):
            verdict.rules.append(rule)
            verdict.recorded.append(message.id)

    # --- lifts ------------------------------------------------------------------------

    def _judged(self, message: OfferedMessage, words: str | None) -> tuple[str, list[str]]:
        given = [words] if words and words in message.text else []
        return quotable_text(message.text), given

    def _lift(
        self, message: OfferedMessage, target: str, words: str | None, *, replaces: bool
    ) -> None:
        verdict, context = self.verdict, self.context
        if target == message.id:
            verdict.dropped["lift-duplicate"] += 1
            return
        state_rule = context.rules.get(target)
        if target.startswith("R") and state_rule is None:
            verdict.dropped["lift-unknown-target"] += 1
            verdict.defects.append(f"{message.id}: {target} is no rule of the state")
            return
        if target in verdict.lifted() or (state_rule is not None and state_rule.lifted):
            self._replaced(message, target)
            return
        rule_words = live_words(target, verdict, context)
        if rule_words is None:
            verdict.dropped["lift-unknown-target"] += 1
            verdict.defects.append(f"{message.id}: {target} gave no rule to lift")
            return
        text, given = self._judged(message, words)
        replaced = replaced_words(target, verdict, context)
        if lift_check(text, rule_words, given, replaced):
            verdict.lifts.append(AcceptedLift(target, message.id, replaces))
            return
        lifted = verdict.lifted()
        allowed = tuple(
            [rule.id for rule in context.in_force() if rule.id not in lifted]
            + [rule.u for rule in verdict.rules if rule.u != message.id and rule.u not in lifted]
        )
        text = (
            f"{message.id} is labeled `lifts {target}`, but its own words do not withdraw "
            f"{target}: {_quote(rule_words)}"
            + (
                ". A lift of a replacement must name what it set beyond the rule it replaced"
                if replaced
                else ""
            )
            + ". Answer `lifts <id>` naming the rule it withdraws, or `not a rule`."
        )
        verdict.questions.append(Question("check", message.id, target, allowed, text))

    def _replaced(self, message: OfferedMessage, target: str) -> None:
        """A lift of a rule already withdrawn: when a narrowing replaced it, ask about that one
        (by its u<n> when its id is new), so the narrowing is lifted only by name."""
        verdict, context = self.verdict, self.context
        successor = successor_of(target, verdict, context)
        if successor is None or successor == message.id:
            verdict.dropped["lift-already-lifted"] += 1
            return
        words = live_words(successor, verdict, context) or ""
        state_rule = context.rules.get(successor)
        named = f"{successor} ({state_rule.u})" if state_rule else successor
        text = (
            f"{message.id} is labeled `lifts {target}`, but {named} already replaced it: "
            f"{_quote(words)}. Answer `lifts {successor}` if {message.id} withdraws that, or "
            f"`not a rule`; a lift of {successor} must name what it set beyond {target}."
        )
        verdict.questions.append(Question("replaced", message.id, target, (successor,), text))

    def _may_replace(self) -> None:
        """Ask about each rule label whose message would pass the lift check on a live rule."""
        verdict, context = self.verdict, self.context
        for rule in verdict.rules[self.first_new_rule :]:
            message = context.messages[rule.u]
            text, given = self._judged(message, rule.words)
            # Rules of earlier chunks came before every message of this one.
            earlier = [(r.id, r.u, r.words) for r in context.in_force()] + [
                (r.u, r.u, r.words)
                for r in verdict.rules
                if r.u not in context.messages or context.messages[r.u].seq < message.seq
            ]
            for target, giver, words in earlier:
                if target in verdict.lifted():
                    continue
                if not lift_check(text, words, given, replaced_words(target, verdict, context)):
                    continue
                how = (
                    "reads as a standing rule"
                    if rule.u in verdict.recorded
                    else "is labeled `rule`"
                )
                question = (
                    f"{message.id} {how} and may replace the rule {giver} gave "
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
                words = live_words(target, verdict, context)
                text = quotable_text(message.text)
                given = [own_rule.words] if own_rule else []
                replaced = replaced_words(target, verdict, context)
                if words is not None and lift_check(text, words, given, replaced):
                    verdict.lifts.append(AcceptedLift(target, item.message, own_rule is not None))
                    added += 1
    return added


def live_words(target: str, verdict: Verdict, context: PassContext) -> str | None:
    """The words of a lift target still in force: a rule of the state or of this span that
    neither the state nor this answer withdrew."""
    if target in verdict.lifted():
        return None
    if target.startswith("u"):
        rule = verdict.rule_of(target)
        return rule.words if rule else None
    state_rule = context.rules.get(target)
    return state_rule.words if state_rule and not state_rule.lifted else None


def _words(target: str, verdict: Verdict, context: PassContext) -> str | None:
    """The words of a rule of the state or of this span, lifted or not."""
    if target.startswith("u"):
        rule = verdict.rule_of(target)
        return rule.words if rule else None
    state_rule = context.rules.get(target)
    return state_rule.words if state_rule else None


def replaced_words(target: str, verdict: Verdict, context: PassContext) -> list[str]:
    """The words of the rules `target` replaced: in the state (their `replacedBy`), or in this
    span (a `rule and lifts` label of the target's message)."""
    found = [rule.words for rule in context.rules.values() if rule.replaced_by == target]
    for lift in verdict.lifts:
        if lift.by == target and lift.replaces:
            words = _words(lift.target, verdict, context)
            if words is not None:
                found.append(words)
    return found


def successor_of(target: str, verdict: Verdict, context: PassContext) -> str | None:
    """The live rule that replaced `target`, following replacements in the state and in this
    span (a span's replacement is named by its u<n>), or None when nothing live replaced it."""
    current, seen = target, {target}
    while True:
        following = next(
            (lift.by for lift in verdict.lifts if lift.target == current and lift.replaces), None
        )
        if following is None:
            state_rule = context.rules.get(current)
            following = state_rule.replaced_by if state_rule and state_rule.lifted else None
        if following is None or following in seen:
            break
        seen.add(following)
        current = following
    if current == target or live_words(current, verdict, context) is None:
        return None
    return current


def _quote(words: str) -> str:
    return '"' + clip(" ".join(words.split()), 200) + '"'
