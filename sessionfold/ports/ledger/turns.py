"""Turns mode (seeds/002, "Turns mode"; opt-in `narrative_mode = "turns"`).

Instead of one diff call, one continuing conversation asks for one section per turn, in a fixed
order: narrative, objective, labels, decisions and dead ends, Now. The first turn carries the
**digest**: the state so far (rendered), the span's user messages whole, the ledger (commands
with their output's head and tail, errors), the files read and modified, the World, a
condensed transcript (one line per command, error and file, in order) and, taking over, the
earlier compactor's summary. The only tool is a read-only `show(ref)` for a message, rule,
command, error or tool-call id (`{"show": ["C12"]}`), capped per turn.

Each answer passes a gate written in code:
- **integrity checks** (it parses, every id exists, every message is labelled, every quote
  verifies, the narrative is within its cap) are never excused: a failing section is sent back
  with its failures, at most `repair_turns` times, then what still fails is dropped;
- **expectation checks** (each file the span modified is named in the narrative; each error
  the span did not fix is a dead end's evidence or an open error; `resume` is set) may be
  excused by the model with a one-sentence reason, which the span record keeps.
Lift questions get one more turn once the labels are settled, as in the single call.

The pass has a time budget (`pass_budget_s`, `turn_budget_s`) read from the clock it is handed
(none: no budget, as in tests and replays); a section it cannot reach carries from the previous
state (Now, the objective) or is carried to the next pass (unlabeled messages). Taking over,
an earlier message that reads as a standing rule cannot carry a label in this mode: code
records it, and one that replaced an earlier rule stands beside it until a later message lifts
one. The model names no values in this mode; the ones code read from command output are kept.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from sessionfold.ports.ledger.answer import AnswerError, parse_answer
from sessionfold.ports.ledger.context import PassContext
from sessionfold.ports.ledger.model import DiffModel
from sessionfold.ports.ledger.prompt import build_prompt, fit_whole
from sessionfold.ports.ledger.verify import Verdict, apply_replies, verify
from sessionfold.projections.ledger.commands import unfixed_errors
from sessionfold.projections.ledger.config import LedgerConfig
from sessionfold.projections.ledger.render import render
from sessionfold.projections.ledger.text import clip
from sessionfold.projections.ledger.values import span_values

SECTIONS = ("narrative", "objective", "labels", "notes", "now")
NARRATIVE_CHARS = 400
OBJECTIVE_CHARS = 400
NOW_CHARS = 800
EXCUSE_CHARS = 300

_ASKS = {
    "narrative": (
        'Section 1 of 5, narrative. Answer {"narrative": "one line of at most 400 characters: '
        'what this span did"}, naming every file it modified.'
    ),
    "objective": (
        'Section 2 of 5, objective. Answer {"objective": "what the user is working towards, '
        'in one line"}.'
    ),
    "labels": (
        'Section 3 of 5, labels. Answer {"labels": [{"message": "u<n>", "label": "...", '
        '"words": "..."}]} with a label for every message under "Messages to label": `rule`, '
        "`not a rule`, `lifts R<n>` (`lifts u<n>` for a rule given earlier in this span) or "
        "`rule and lifts R<n>`. Code copies the rule's words from the message; for a message "
        "over 600 characters give its exact words."
    ),
    "notes": (
        'Section 4 of 5, decisions and dead ends. Answer {"decisions": [{"text": "...", '
        '"evidence": ["C<n>", "E<n>", "u<n>"]}], "deadEnds": [...], "openErrors": ["E<n>"]}: '
        "every error this span did not fix is a dead end's evidence or an open error."
    ),
    "now": (
        'Section 5 of 5, Now. Answer {"now": "where the work stands", "resume": "what to do '
        'first when the work resumes"}.'
    ),
}


@dataclass(slots=True)
class TurnsOutcome:
    """What a turns-mode pass settled, section by section."""

    verdict: Verdict | None = None
    narrative: str | None = None
    objective: str | None = None
    now: str | None = None
    open_errors: list[str] = field(default_factory=list)
    sections: dict[str, str] = field(default_factory=dict)
    excuses: dict[str, str] = field(default_factory=dict)
    calls: int = 0
    problem: str | None = None


# --- the digest and show(ref) -------------------------------------------------------------------


def _span_files(context: PassContext) -> list[dict[str, Any]]:
    after, upto = context.window
    return [
        row
        for row in context.state.get("files", [])
        if int(row.get("span", 0)) == context.span and after < int(row.get("seq", 0)) <= upto
    ]


def digest(context: PassContext, config: LedgerConfig) -> str:
    """The first turn's digest of the span (see the module docstring)."""
    state_text, _ = render(context.state, config.summary_chars, config.render_command_chars)
    parts = [f"# Digest of span {context.span}", "## State so far", state_text.strip()]
    parts.append("## User messages of the span, whole")
    for message in context.messages.values():
        mark = (
            " [standing: recorded by code, do not label]" if message.id in context.standing else ""
        )
        parts.append(f"### {message.id}{mark}\n{message.text}")
    rows: list[tuple[int, str]] = []
    width = config.digest_line_chars
    for row in context.span_rows("C"):
        outcome = f"exit {row['exit']}" if row.get("exit") is not None else row.get("status")
        output = " ".join(str(row.get("excerpt") or "").split())
        line = f"{row['id']} {outcome}: {clip(row.get('command') or '', width)}"
        if output:
            line += f" -> {clip(output, width)}"
        rows.append((int(row.get("seq", 0)), line))
    for row in context.span_rows("E"):
        origin = ", ".join(x for x in (row.get("tool"), row.get("command")) if x)
        rows.append((int(row.get("seq", 0)), f"{row['id']} error ({origin}): {row.get('head')}"))
    for row in _span_files(context):
        rows.append((int(row.get("seq", 0)), f"{row['id']} {row['op']}: {row['path']}"))
    parts.append("## Condensed transcript (commands, errors and files, in order)")
    parts += [line for _, line in sorted(rows)] or ["(nothing ran)"]
    if context.state.get("world"):
        parts += ["## World", json.dumps(context.state["world"], sort_keys=True)]
    if context.earlier is not None:
        earlier = context.earlier
        parts.append(f"## The earlier compactor's summary (entry {earlier.get('entry')})")
        parts.append(str(earlier.get("head") or ""))
        if earlier.get("tail"):
            parts += ["…", str(earlier["tail"])]
    return "\n".join(parts)


def show(ref: str, context: PassContext, limit: int) -> str:
    """What `show(ref)` returns: a message, rule, command, error or tool call, read-only."""
    ref = ref.strip()
    message = context.messages.get(ref)
    if message is not None:
        return f"{ref}:\n{clip(message.text, limit)}"
    rule = context.rules.get(ref)
    if rule is not None:
        return f"{ref} (from {rule.u}): {clip(rule.words, limit)}"
    for row in context.state.get("commands", []):
        if ref in (row["id"], row.get("call")):
            values = "; ".join(f"{v} ({w})" for v, w in row.get("values") or [])
            text = (
                f"{row['id']} exit {row.get('exit')} ({row.get('status')}): {row.get('command')}"
                f"\noutput (head and tail): {row.get('excerpt')}"
                + (f"\nvalues: {values}" if values else "")
            )
            return clip(text, limit)
    for row in context.state.get("errors", []):
        if ref == row["id"]:
            return clip(
                f"{ref} ({row.get('tool')}, {row.get('command')}): {row.get('head')}", limit
            )
    return f"{ref}: no such id"


# --- the conversation ----------------------------------------------------------------------------


class _Budget:
    def __init__(self, clock: Callable[[], float] | None, config: LedgerConfig) -> None:
        self.clock = clock
        self.config = config
        self.pass_end = clock() + config.pass_budget_s if clock else None
        self.turn_end: float | None = None

    def start_turn(self) -> None:
        if self.clock is not None:
            self.turn_end = self.clock() + self.config.turn_budget_s

    def left(self) -> bool:
        """True while the pass and the turn have time for another call."""
        if self.clock is None:
            return True
        now = self.clock()
        return now < (self.pass_end or now + 1) and now < (self.turn_end or now + 1)


class _Conversation:
    """One continuing conversation through the model port (`prompt["turns"]`)."""

    def __init__(
        self,
        model: DiffModel,
        context: PassContext,
        config: LedgerConfig,
        budget: _Budget,
    ) -> None:
        self.model = model
        self.context = context
        self.config = config
        self.budget = budget
        self.messages: list[dict[str, str]] = []
        self.calls = 0
        self.base = build_prompt(context, excerpt_chars=config.prompt_message_chars)
        self.base["files"] = [{"path": r["path"], "op": r["op"]} for r in _span_files(context)]
        self.base["standing"] = sorted(context.standing)
        self.base["unfixedErrors"] = unfixed_errors(context.span_rows("C"), context.span_rows("E"))

    def say(self, text: str) -> None:
        """Add a user turn."""
        self.messages.append({"role": "user", "content": text})

    def ask(self, section: str, extra: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """One call for `section`: the answer as a JSON object, or None (threw, no object)."""
        if not self.budget.left():
            raise TimeoutError(section)
        prompt = {
            **self.base,
            **(extra or {}),
            "turns": {"section": section, "conversation": list(self.messages)},
        }
        self.calls += 1
        try:
            answer = self.model.diff(prompt)
        except Exception:  # the model port may fail in any way; the section is repaired
            return None
        if not isinstance(answer, dict):
            return None
        self.messages.append({"role": "assistant", "content": json.dumps(answer)})
        return answer


def _text(answer: dict[str, Any], name: str) -> str:
    value = answer.get(name)
    return " ".join(value.split()) if isinstance(value, str) else ""


class _Turns:
    def __init__(
        self,
        model: DiffModel,
        context: PassContext,
        config: LedgerConfig,
        clock: Callable[[], float] | None,
    ) -> None:
        self.context = context
        self.config = config
        self.talk = _Conversation(model, context, config, _Budget(clock, config))
        self.outcome = TurnsOutcome()

    def run(self) -> TurnsOutcome:
        outcome = self.outcome
        first = True
        for section in SECTIONS:
            ask = _ASKS[section]
            if first:
                ask = (
                    f"{digest(self.context, self.config)}\n\n"
                    f'You may answer {{"show": ["<id>", ...]}} at any turn to read a '
                    f"message, rule, command, error or tool call whole (at most "
                    f"{self.config.shows_per_turn} per section).\n\n{ask}"
                )
                first = False
            try:
                self.talk.budget.start_turn()
                self.talk.say(ask)
                getattr(self, f"_{section}")()
            except TimeoutError:
                outcome.sections[section] = "out-of-time"
                for later in SECTIONS[SECTIONS.index(section) + 1 :]:
                    outcome.sections[later] = "carried"
                break
        outcome.calls = self.talk.calls
        return outcome

    # --- one section ------------------------------------------------------------------

    def _settle(
        self,
        section: str,
        check: Callable[[dict[str, Any]], tuple[list[str], list[tuple[str, str]]]],
    ) -> dict[str, Any] | None:
        """Ask until the section passes its integrity checks (or repairs run out), answering
        shows on the way, then give one chance to meet or excuse its expectations."""
        repairs = shows = 0
        kept: dict[str, Any] | None = None
        while True:
            answer = self.talk.ask(section)
            if answer is None:
                repairs += 1
                if repairs > self.config.repair_turns:
                    break
                self.talk.say(f"Answer the {section} section with one JSON object.")
                continue
            refs = answer.get("show")
            if refs and not any(k in answer for k in ("narrative", "labels", "now", "objective")):
                refs = [str(r) for r in (refs if isinstance(refs, list) else [refs])]
                room = self.config.shows_per_turn - shows
                if room <= 0:
                    self.talk.say(f"No more show() in this section: answer the {section} section.")
                    repairs += 1
                    if repairs > self.config.repair_turns:
                        break
                    continue
                shown = [show(r, self.context, self.config.show_chars) for r in refs[:room]]
                shows += len(shown)
                self.talk.say("\n\n".join(shown) + f"\n\nNow answer the {section} section.")
                continue
            failures, unmet = check(answer)
            kept = answer
            if not failures:
                break
            repairs += 1
            if repairs > self.config.repair_turns:
                break  # what still fails is dropped by the section's reader
            self.talk.say(
                "Fix these and answer the section again in full:\n"
                + "\n".join(fit_whole([f"- {f}" for f in failures], self.config.retry_note_chars))
            )
        if kept is None:
            self.outcome.sections[section] = "carried"
            return None
        self.outcome.sections[section] = "repaired" if repairs else "ok"
        failures, unmet = check(kept)
        if failures:
            self.outcome.sections[section] = "items-dropped"
        if unmet and not failures:
            kept = self._expect(section, kept, check, unmet)
        return kept

    def _expect(
        self,
        section: str,
        kept: dict[str, Any],
        check: Callable[[dict[str, Any]], tuple[list[str], list[tuple[str, str]]]],
        unmet: list[tuple[str, str]],
    ) -> dict[str, Any]:
        """Expectation checks: one turn to meet them or excuse them in one sentence."""
        self.talk.say(
            "Expected, not met:\n"
            + "\n".join(f"- {code}: {text}" for code, text in unmet)
            + f'\nAnswer the {section} section again in full, or {{"excuse": "one sentence: '
            'why it does not apply"}.'
        )
        answer = self.talk.ask(section)
        excuse = _text(answer, "excuse") if answer is not None else ""
        if excuse:
            for code, _ in unmet:
                self.outcome.excuses[code] = clip(excuse, EXCUSE_CHARS)
            return kept
        if answer is not None and not check(answer)[0]:
            kept, unmet = answer, check(answer)[1]
        if unmet:  # neither met nor excused: the record says so
            codes = ", ".join(sorted({code for code, _ in unmet}))
            self.outcome.sections[section] += f"; unmet {codes}"
        return kept

    # --- the sections -----------------------------------------------------------------

    def _narrative(self) -> None:
        modified = sorted({r["path"] for r in _span_files(self.context) if r["op"] == "modified"})

        def check(answer: dict[str, Any]) -> tuple[list[str], list[tuple[str, str]]]:
            text = _text(answer, "narrative")
            if not text:
                return ["narrative: missing"], []
            if len(text) > NARRATIVE_CHARS:
                return [f"narrative: over {NARRATIVE_CHARS} characters"], []
            missing = [p for p in modified if PurePosixPath(p).name not in text]
            return [], [("files-named", f"name the modified file {p}") for p in missing[:5]]

        answer = self._settle("narrative", check)
        if answer is not None and not check(answer)[0]:
            self.outcome.narrative = _text(answer, "narrative")

    def _objective(self) -> None:
        def check(answer: dict[str, Any]) -> tuple[list[str], list[tuple[str, str]]]:
            text = _text(answer, "objective")
            if not text:
                return ["objective: missing"], []
            if len(text) > OBJECTIVE_CHARS:
                return [f"objective: over {OBJECTIVE_CHARS} characters"], []
            return [], []

        answer = self._settle("objective", check)
        if answer is not None and not check(answer)[0]:
            self.outcome.objective = _text(answer, "objective")

    def _verdict(self, answer: dict[str, Any]) -> tuple[Verdict | None, list[str]]:
        """Labels (not the standing messages': code records those) verified, plus the values
        code read from the span's commands."""
        context = self.context
        labels = answer.get("labels")
        if isinstance(labels, dict):
            labels = [{"message": k, "label": v} for k, v in labels.items()]
        if isinstance(labels, list):
            labels = [
                item
                for item in labels
                if not (isinstance(item, dict) and str(item.get("message")) in context.standing)
            ]
        values = span_values(self.talk.base["commands"])
        try:
            parsed = parse_answer({"labels": labels, "values": values, "narrative": "-"})
        except AnswerError as exc:
            return None, [str(exc)]
        verdict = verify(parsed, context)
        # Turns mode: a standing message's replacement is not asked about (it cannot carry a
        # label); it stands beside the rule until a later message lifts one.
        verdict.questions = [
            q
            for q in verdict.questions
            if not (q.kind == "may-replace" and q.message in verdict.recorded)
        ]
        return verdict, list(verdict.defects)

    def _labels(self) -> None:
        def check(answer: dict[str, Any]) -> tuple[list[str], list[tuple[str, str]]]:
            _, failures = self._verdict(answer)
            return failures, []

        answer = self._settle("labels", check)
        if answer is None:
            return
        verdict, _ = self._verdict(answer)
        if verdict is None:
            self.outcome.sections["labels"] = "carried"
            return
        if verdict.questions:
            texts = fit_whole([q.text for q in verdict.questions], self.config.retry_note_chars)
            self.talk.say(
                "Questions (answer only these messages' labels, as "
                '{"labels": [...]}):\n' + "\n".join(f"- {t}" for t in texts)
            )
            reply = self.talk.ask("labels")
            if reply is not None:
                # A reply that does not parse changes nothing.
                with contextlib.suppress(AnswerError):
                    apply_replies(verdict, parse_answer({**reply, "narrative": "-"}), self.context)
            placed = {lift.by for lift in verdict.lifts}
            unplaced = {q.message for q in verdict.questions if q.kind != "may-replace"} - placed
            verdict.dropped["lift-unplaced"] += len(unplaced)
        self.outcome.verdict = verdict

    def _notes(self) -> None:
        context = self.context
        unfixed = unfixed_errors(context.span_rows("C"), context.span_rows("E"))

        def check(answer: dict[str, Any]) -> tuple[list[str], list[tuple[str, str]]]:
            failures = []
            cited: set[str] = set()
            for name in ("decisions", "deadEnds"):
                items = answer.get(name) or []
                for index, item in enumerate(items if isinstance(items, list) else [items]):
                    if not isinstance(item, dict) or not _text(item, "text"):
                        failures.append(f"{name}[{index}]: needs a text")
                        continue
                    for ref in item.get("evidence") or []:
                        if str(ref) not in context.known:
                            failures.append(f"{name}[{index}]: {ref} is no id listed here")
                        elif name == "deadEnds":
                            cited.add(str(ref))
            open_errors = answer.get("openErrors") or []
            for ref in open_errors if isinstance(open_errors, list) else [open_errors]:
                if not str(ref).startswith("E") or str(ref) not in context.known:
                    failures.append(f"openErrors: {ref} is no error listed here")
                else:
                    cited.add(str(ref))
            unmet = [
                ("errors-accounted", f"{e} was not fixed: a dead end's evidence or an open error")
                for e in unfixed
                if e not in cited
            ]
            return failures, unmet

        answer = self._settle("notes", check)
        if answer is None:
            return
        try:
            parsed = parse_answer(
                {
                    "decisions": answer.get("decisions"),
                    "deadEnds": answer.get("deadEnds"),
                    "narrative": "-",
                }
            )
        except AnswerError:
            self.outcome.sections["notes"] = "items-dropped"
            return
        notes = verify(parsed, context)  # unknown evidence dropped, the note kept
        target = self.outcome.verdict
        if target is None:
            target = self.outcome.verdict = Verdict(labeled=set())
        target.decisions += notes.decisions
        target.dead_ends += notes.dead_ends
        target.dropped["evidence-unknown"] += notes.dropped["evidence-unknown"]
        opened = answer.get("openErrors") or []
        self.outcome.open_errors = [
            str(e)
            for e in (opened if isinstance(opened, list) else [opened])
            if str(e) in context.known and str(e).startswith("E")
        ]

    def _now(self) -> None:
        def check(answer: dict[str, Any]) -> tuple[list[str], list[tuple[str, str]]]:
            text = _text(answer, "now")
            if not text:
                return ["now: missing"], []
            if len(text) > NOW_CHARS:
                return [f"now: over {NOW_CHARS} characters"], []
            if not _text(answer, "resume"):
                return [], [("resume-set", "say what to do first when the work resumes")]
            return [], []

        answer = self._settle("now", check)
        if answer is None or check(answer)[0]:
            return
        now = _text(answer, "now")
        resume = _text(answer, "resume")
        if resume:
            now += f" Resume: {resume}"
        if self.outcome.open_errors:
            now += f" Open errors: {', '.join(self.outcome.open_errors)}."
        self.outcome.now = clip(now, NOW_CHARS)


def run_turns(
    context: PassContext,
    model: DiffModel,
    config: LedgerConfig,
    clock: Callable[[], float] | None = None,
) -> TurnsOutcome:
    """Run a pass's conversation, section by section (see the module docstring)."""
    outcome = _Turns(model, context, config, clock).run()
    if not any(
        status in ("ok", "repaired", "items-dropped") for status in outcome.sections.values()
    ):
        outcome.problem = "turns: no section settled"
    return outcome
