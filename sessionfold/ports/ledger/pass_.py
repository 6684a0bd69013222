"""One ledger pass: diff (with one retry and one round of lift questions), verify, close.

`run_pass(request, model)` answers a pass request the fold emitted with a compaction payload:
the accepted events with their ids and sequence numbers, the span record (its work-log line,
the World, the model that made it), and the rendered state, which is the compaction summary.
It does no I/O but through the model it is handed. A defect the model can fix is sent back
once with a note (a parsed answer is kept while the retry runs); if no answer is usable the
span closes narrative-less and its messages are offered again by the next pass.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from sessionfold.events.ledger import (
    IdRange,
    LedgerEvent,
    LedgerPassPayload,
    LiftEvent,
    NoteEvent,
    RuleEvent,
    SpanRecord,
    ValueEvent,
)
from sessionfold.ports.ledger import reading
from sessionfold.ports.ledger.answer import Answer, AnswerError, parse_answer
from sessionfold.ports.ledger.context import PassContext
from sessionfold.ports.ledger.model import DiffModel
from sessionfold.ports.ledger.prompt import build_prompt, fit_whole
from sessionfold.ports.ledger.turns import TurnsOutcome, run_turns
from sessionfold.ports.ledger.verify import Verdict, apply_replies, verify
from sessionfold.projections.ledger.config import LedgerConfig
from sessionfold.projections.ledger.pass_rows import apply_to_state
from sessionfold.projections.ledger.render import render
from sessionfold.projections.ledger.text import clip

log = logging.getLogger(__name__)

#: A span's narrative line (chunk lines joined) is cut to this.
NARRATIVE_CHARS = 600


class _Calls:
    """Counts the model calls of a pass and remembers whether the last one threw."""

    def __init__(self, model: DiffModel, config: LedgerConfig) -> None:
        self.model = model
        self.config = config
        self.count = 0
        self.last_threw = False

    def ask(
        self, context: PassContext, prior: Verdict | None, **prompt_options: Any
    ) -> tuple[Answer | None, str | None]:
        """One call: the parsed answer, or None and a defect note (no message text)."""
        prompt = build_prompt(
            context,
            excerpt_chars=self.config.prompt_message_chars,
            span_rules=_span_rules(prior),
            **prompt_options,
        )
        self.count += 1
        try:
            raw = self.model.diff(prompt)
        except Exception as exc:  # the model port may fail in any way; the pass must not
            self.last_threw = True
            return None, f"model-error:{type(exc).__name__}"
        self.last_threw = False
        try:
            return parse_answer(raw), None
        except AnswerError as exc:
            return None, str(exc)


def _span_rules(prior: Verdict | None) -> list[tuple[str, str]]:
    """(u<n>, words) of the rules earlier chunks accepted and no lift withdrew."""
    if prior is None:
        return []
    lifted = prior.lifted()
    return [(rule.u, rule.words) for rule in prior.rules if rule.u not in lifted]


def _diff_chunk(
    calls: _Calls, context: PassContext, prior: Verdict | None, config: LedgerConfig
) -> tuple[Verdict | None, str | None]:
    """One chunk's diff: an answer, one retry with a note, one round of lift questions.

    Returns the settled verdict (holding what earlier chunks accepted too), or None and the
    reason no answer was usable.
    """
    answer, problem = calls.ask(context, prior)
    verdict = verify(answer, context, prior) if answer is not None else None
    if verdict is None or verdict.defects:
        notes = [problem] if verdict is None and problem else (verdict.defects if verdict else [])
        note = "\n".join(fit_whole([f"- {n}" for n in notes], config.retry_note_chars))
        retry, retry_problem = calls.ask(
            context, prior, note=note or "- answer again with one JSON object"
        )
        if retry is not None:
            verdict, problem = verify(retry, context, prior), None
        elif verdict is None:
            problem = retry_problem or problem
    if verdict is None:
        return None, problem
    # A question raised by the settled answer gets one more call (once per chunk); none
    # follows a call that threw.
    if verdict.questions and not calls.last_threw:
        texts = fit_whole([q.text for q in verdict.questions], config.retry_note_chars)
        asked = [q for q in verdict.questions if q.text in texts]
        reply, _ = calls.ask(context, prior, questions=asked)
        if reply is not None:
            apply_replies(verdict, reply, context)
    placed = {lift.by for lift in verdict.lifts}
    unplaced = {q.message for q in verdict.questions if q.kind != "may-replace"} - placed
    verdict.dropped["lift-unplaced"] += len(unplaced)
    return verdict, None


def run_pass(
    request: dict[str, Any],
    model: DiffModel,
    config: LedgerConfig | None = None,
    clock: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """Answer one pass request with a compaction payload (a JSON-ready dict).

    With `narrative_mode = "turns"` the pass is a conversation (`turns.run_turns`) whose time
    budget reads `clock` (monotonic seconds; None: no budget).

    A span too large for one call is asked in chunks (`PassContext.chunks`), each verified
    on top of what the earlier ones accepted. A chunk that never verifies leaves its
    messages unlabeled, so they are carried whole to the next pass; when no chunk verifies
    the span closes narrative-less.
    """
    config = config or LedgerConfig()
    reading.forget()  # the standing regions read are this pass's
    context = PassContext.from_request(request)
    if config.narrative_mode == "turns":
        outcome = run_turns(context, model, config, clock)
        payload = _close(
            context, None, outcome.problem, model.name, outcome.calls, config, turns=outcome
        )
        return payload.model_dump(mode="json")
    calls = _Calls(model, config)
    chunks = context.chunks(config.chunk_chars, config.max_chunks)
    verdict: Verdict | None = None
    narratives: list[str] = []
    missing: list[int] = []
    problems: list[str] = []
    for view in chunks:
        settled, problem = _diff_chunk(calls, view, verdict, config)
        if settled is None:
            missing.append(view.chunk[0])
            problems.append(problem or "no answer")
            continue
        verdict = settled
        narratives.append(settled.narrative)
    if verdict is not None:
        verdict.narrative = clip(" | ".join(n for n in narratives if n), NARRATIVE_CHARS)
    problem = problems[0] if problems else None
    payload = _close(
        context, verdict, problem, model.name, calls.count, config, (len(chunks), missing)
    )
    return payload.model_dump(mode="json")


def fallback_payload(request: dict[str, Any], reason: str) -> dict[str, Any]:
    """The answer when the pass itself threw: it closes nothing and releases the barrier."""
    payload = LedgerPassPayload(
        request=request["request"],
        session=request["session"],
        span=int(request["span"]),
        seq=int(request["seq"]),
        fallback=reason,
    )
    return payload.model_dump(mode="json")


def _events(context: PassContext, verdict: Verdict) -> list[LedgerEvent]:
    """Accepted items as events, in message order, with their ids and sequence numbers."""
    counters = Counter(context.counters)
    events: list[LedgerEvent] = []

    def next_n() -> int:
        counters["ev"] += 1
        return counters["ev"]

    rule_ids: dict[str, str] = {}
    for mid, message in context.messages.items():
        for rule in sorted((r for r in verdict.rules if r.u == mid), key=lambda r: r.start):
            counters["R"] += 1
            rule_id = f"R{counters['R']}"
            rule_ids.setdefault(mid, rule_id)
            events.append(
                RuleEvent(
                    n=next_n(),
                    id=rule_id,
                    u=mid,
                    entry=rule.entry,
                    words=rule.words,
                    start=rule.start,
                    end=rule.end,
                )
            )
        for lift in (lift for lift in verdict.lifts if lift.by == mid):
            target = rule_ids.get(lift.target) if lift.target.startswith("u") else lift.target
            if target is None:
                continue
            events.append(
                LiftEvent(
                    n=next_n(),
                    rule=target,
                    by=mid,
                    entry=message.entry,
                    replacedBy=rule_ids.get(mid) if lift.replaces else None,
                )
            )
    for kind, letter, notes in (
        ("decision", "D", verdict.decisions),
        ("deadEnd", "X", verdict.dead_ends),
    ):
        for text, evidence in notes:
            counters[letter] += 1
            events.append(
                NoteEvent(
                    kind=kind,
                    n=next_n(),
                    id=f"{letter}{counters[letter]}",
                    text=text,
                    evidence=evidence,
                )
            )
    for value, turn, what in verdict.values:
        counters["V"] += 1
        events.append(
            ValueEvent(n=next_n(), id=f"V{counters['V']}", value=value, turn=turn, what=what)
        )
    return events


def _last_objective(context: PassContext) -> str | None:
    """The newest objective a span record of the state holds."""
    for record in reversed(context.state.get("spans", [])):
        if record.get("objective"):
            return str(record["objective"])
    return None


def _takeover_counts(context: PassContext, verdict: Verdict | None) -> dict[str, int]:
    """Counts of a pass that took over from another compactor (empty otherwise)."""
    if context.earlier is None:
        return {}
    return {
        "earlier": sum(context.is_earlier(m) for m in context.messages.values()),
        "standing": len(context.standing),
        "recorded": len(verdict.recorded) if verdict else 0,
        "oneOffs": len(verdict.one_offs) if verdict else 0,
    }


def _close(
    context: PassContext,
    verdict: Verdict | None,
    problem: str | None,
    model_name: str,
    calls: int,
    config: LedgerConfig,
    chunking: tuple[int, list[int]] = (1, []),
    turns: TurnsOutcome | None = None,
) -> LedgerPassPayload:
    offered = list(context.messages)
    chunks, missing = chunking
    extras: dict[str, Any] = {}
    if turns is not None:
        extras = {"objective": turns.objective, "sections": turns.sections}
        extras["excuses"] = turns.excuses
        if turns.objective is None:
            extras["objective"] = _last_objective(context)  # carried from the previous state
    if turns is not None and turns.problem is None:
        verdict = turns.verdict or Verdict()
        events = _events(context, verdict)
        carried = verdict.unlabeled(context)[-config.carry_limit :]
        narrative = turns.narrative or "(turns mode: the narrative section was not settled)"
        kind, now, dropped = "turns", turns.now or context.state.get("now"), verdict.dropped
    elif verdict is None:
        events: list[LedgerEvent] = []
        carried = offered[-config.carry_limit :]
        narrative = f"narrative-less: {problem or 'no answer'}; {len(offered)} messages carried"
        kind, now, dropped = "narrative-less", context.state.get("now"), Counter[str]()
    else:
        events = _events(context, verdict)
        carried = verdict.unlabeled(context)[-config.carry_limit :]
        narrative = verdict.narrative or "(no narrative line)"
        if missing:
            # The close does not say which messages were judged: they are carried instead.
            narrative += f" (chunk {', '.join(map(str, missing))} of {chunks} missing)"
        kind, now, dropped = "model", verdict.now or context.state.get("now"), verdict.dropped
    bounds = context.bounds
    record = SpanRecord(
        span=context.span,
        request=context.request,
        trigger=context.trigger,
        entry=context.entry,
        lastSeq=context.seq,
        model=model_name,
        narrativeKind=kind,
        narrative=narrative,
        now=now,
        world=context.state.get("world"),
        commands=IdRange(first=bounds["C"][0], last=bounds["C"][1]),
        errors=IdRange(first=bounds["E"][0], last=bounds["E"][1]),
        users=IdRange(first=bounds["u"][0], last=bounds["u"][1]),
        counts={
            "messages": len(offered),
            "commands": max(0, bounds["C"][1] - bounds["C"][0] + 1),
            "errors": max(0, bounds["E"][1] - bounds["E"][0] + 1),
            "rules": sum(isinstance(e, RuleEvent) for e in events),
            "lifts": sum(isinstance(e, LiftEvent) for e in events),
            "decisions": sum(isinstance(e, NoteEvent) and e.kind == "decision" for e in events),
            "deadEnds": sum(isinstance(e, NoteEvent) and e.kind == "deadEnd" for e in events),
            "values": sum(isinstance(e, ValueEvent) for e in events),
            **_takeover_counts(context, verdict),
        },
        dropped=dict(sorted((k, v) for k, v in dropped.items() if v)),
        carried=carried,
        calls=calls,
        reason=problem if verdict is None or missing else None,
        chunks=chunks,
        missing=missing,
        takeover=(context.earlier or {}).get("entry") if context.earlier is not None else None,
        **extras,
    )
    summary, cap_fit = render(
        apply_to_state(context.state, events, record),
        config.summary_chars,
        config.render_command_chars,
    )
    record = record.model_copy(update={"summaryChars": len(summary), "capFit": cap_fit})
    log.info(
        "ledger pass",
        extra={
            "ledger": {
                "span": context.span,
                "calls": calls,
                "kind": kind,
                "events": len(events),
                "summaryChars": len(summary),
                "dropped": sum(dropped.values()),
            }
        },
    )
    return LedgerPassPayload(
        request=context.request,
        session=context.session,
        span=context.span,
        seq=context.seq,
        events=events,
        record=record,
        summary=summary,
    )
