"""Flushing (reference §2.3, §5): turn-end gates, eager spill, flush attempts, compactions.

`start_flush` captures, runs the pre-flush pipeline and either finishes at once (nothing for
the model) or emits a flush request and raises the barrier; `apply_compaction` finishes it with
the summarizer's answer. Either way `finish_flush` indexes the kept summaries under their refs,
advances the frontier (on skips too, never on failure) and writes exactly one flush-metrics
record. Rows: `q/<request id>` (the outstanding plan), `f/<n>` (frontier history), `m/<n>`.
"""

from __future__ import annotations

import logging
from typing import Any, get_args

from msgspec.structs import replace

from sessionfold.events.envelope import Envelope, FlushMetricsEnvelope, opaque_envelope
from sessionfold.events.flush import (
    AttemptOutcome,
    CompactionPayload,
    FlushMetricsPayload,
    MetricsSnapshot,
    Trigger,
)
from sessionfold.projections.pruning import context_metrics as metrics
from sessionfold.projections.pruning import index
from sessionfold.projections.pruning.capture import Batch, Call, js_length
from sessionfold.projections.pruning.flush_pipeline import (
    FlushPlan,
    Walk,
    plan_flush,
    walk_answers,
)
from sessionfold.projections.pruning.flush_request import plan_from_row, plan_row, request_envelope
from sessionfold.projections.pruning.frontier import frontier_row, mark_of, trim_batch
from sessionfold.projections.pruning.records import (
    AttemptInfo,
    FrontierRow,
    OutstandingRequest,
    ResultFacts,
    Spill,
)
from sessionfold.projections.pruning.session import Session, row_key
from sessionfold.projections.pruning.triggers import (
    should_budget_flush,
    should_delta_flush,
    usage_fraction,
)
from sessionfold.projections.pruning.windows import (
    capture,
    ready_calls,
    turn_batch,
)

log = logging.getLogger(__name__)


# --- turn end (reference §2.3) ---------------------------------------------------------------


def turn_end(session: Session, seq: int, time: str | None) -> list[Envelope]:
    """Evaluate the open turn's end: live capture, eager spill, queue, budget and delta gates."""
    head = session.head
    gate, head["gate"] = head["gate"], None
    if gate is None or not session.config.enabled:
        return []
    if not gate["has"] and not head["rearmed"]:
        return []
    pushed = gate["has"] and _push_live_batch(session, gate["turn"])
    if not pushed and not head["rearmed"]:
        return []  # no gate evaluation, even when older batches are pending
    tokens, window = head["tokens"], head["window"] or session.config.contextWindow
    budget_hit = should_budget_flush(tokens, window, session.config.autoBudgetThreshold)
    fraction = usage_fraction(tokens, window)
    delta_hit = should_delta_flush(head["prev"], fraction, session.config.budgetTurnDelta)
    if fraction is not None:
        head["prev"] = fraction
    if not (head["queued"] > 0 or head["rearmed"]) or head["out"] is not None:
        return []
    if not (budget_hit or delta_hit):
        return []
    trigger: Trigger = "rearmed" if head["queued"] == 0 else "budget" if budget_hit else "delta"
    return start_flush(session, trigger, seq, time)


def _push_live_batch(session: Session, turn: int) -> bool:
    """Live capture of the turn's batch: spill oversized results, trim, count it as queued."""
    left = live_batch_left(session, turn)
    if left is None:
        left = _spilled_batch_left(session, turn)
    if left:
        session.head["queued"] += 1
    return left


def live_batch_left(session: Session, turn: int) -> bool | None:
    """Whether the turn's batch keeps a call after the frontier's trim, read off its rows
    without building the batch; None when a result may spill (`_spilled_batch_left` decides).

    At most turn ends nothing spills and the batch is thrown away once trimmed: this is
    `turn_batch`, `_eager_spill` and `trim_batch` for that case, without a Call per call."""
    rows = ready_calls(session, turn)
    if rows is None:
        return False
    threshold = session.config.spillThreshold
    summarized = index.summarized_check(session.store, session.session_id)
    ids: list[str] = []  # the calls the trim keeps before the frontier's own rule
    for call, _seq, result in rows[2]:
        if result["raw"] >= threshold:
            return None
        if not summarized(result["key"]):
            ids.append(call["id"])
    if not ids:
        return False
    mark = mark_of(session.head["frontier"])
    if mark is None or turn > mark.last_attempted_turn_index:
        return True
    if turn < mark.last_attempted_turn_index:
        return False
    if mark.last_attempted_tool_call_id not in ids:
        return True  # miss: the frontier call is gone, the trim keeps everything
    return ids.index(mark.last_attempted_tool_call_id) + 1 < len(ids)


def _spilled_batch_left(session: Session, turn: int) -> bool:
    """`live_batch_left` for a turn with a result at the spill threshold: the batch is built,
    its oversized results spilled (written to the index), the rest trimmed."""
    batch = turn_batch(session, turn)
    if batch is None:
        return False
    batch = _eager_spill(session, batch)
    if batch is None:
        return False
    summarized = index.summarized_check(session.store, session.session_id)
    return trim_batch(batch, mark_of(session.head["frontier"]), summarized) is not None


def _eager_spill(session: Session, batch: Batch) -> Batch | None:
    """Index oversized single results by pointer with a head preview, no model call (§5.2)."""
    store, sid, config = session.store, session.session_id, session.config
    spilled: list[Call] = []
    spills: list[Spill] = []
    kept: list[Call] = []
    for call in batch.calls:
        if call.raw_chars < config.spillThreshold or index.is_summarized(store, sid, call.key):
            kept.append(call)
            continue
        original = index.canonical_of(store, sid, call.content_hash)
        if config.dedupByContentHash and original is not None and original != call.key:
            index.add_alias(
                store, sid, call, original, turn=batch.turn_index, timestamp=batch.timestamp
            )
            session.head["stats"]["deduped_calls"] += 1
            _forget_result(session, call)
            continue
        facts: ResultFacts | None = store.get(row_key(sid, "r", call.seq))
        kept_spill = facts.get("spill") if facts is not None else None
        spill: Spill = kept_spill or {"bytes": call.raw_chars, "preview": ""}
        spilled.append(call)
        spills.append(spill)
    if spilled:
        index.add_batch(
            store, sid, spilled, turn=batch.turn_index, timestamp=batch.timestamp, spills=spills
        )
        stats = session.head["stats"]
        stats["spilled_calls"] += len(spilled)
        stats["reclaimed_chars"] += sum(
            c.raw_chars - js_length(s["preview"]) for c, s in zip(spilled, spills, strict=True)
        )
        for call in spilled:
            _forget_result(session, call)
    if len(kept) == len(batch.calls):
        return batch  # frozen: nothing spilled, so the batch is the copy `replace` would make
    return replace(batch, calls=tuple(kept)) if kept else None


def _forget_result(session: Session, call: Call) -> None:
    """Drop a result's captured facts once it is indexed: the index and the log hold it now."""
    session.store.delete(f"{session.session_id}/pr/r/{call.seq}")


# --- flush (reference §5.5) ------------------------------------------------------------------


def _attempt_id(session: Session, seq: int) -> str:
    head = session.head
    head["attempts"] += 1
    if head["aseq"] == seq:
        head["an"] += 1
        return f"{session.session_id}:{seq}:{head['an']}"
    head["aseq"], head["an"] = seq, 1
    return f"{session.session_id}:{seq}"


def start_flush(session: Session, trigger: Trigger, seq: int, time: str | None) -> list[Envelope]:
    """Start a flush attempt: a flush request when the model is needed, else its whole result."""
    head = session.head
    if head["out"] is not None:
        return []  # already flushing: no attempt, no record (§4.5)
    head["rearmed"] = False
    if trigger == "message-end":
        head["me"] = seq
    snapshot = metrics.snapshot(session.store, session.session_id)
    info: AttemptInfo = {
        "id": _attempt_id(session, seq),
        "n": head["attempts"],
        "seq": seq,
        "trigger": trigger,
        "metrics": snapshot,
        "time": time,
    }
    batches = capture(session)
    info["captured"] = len(batches)
    if not batches:
        return [_record_attempt(session, info, 0, "empty")]
    head["queued"] = 0
    plan = plan_flush(
        batches,
        index.canonical_check(session.store, session.session_id),
        dedup=session.config.dedupByContentHash,
        min_batch_chars=session.config.minBatchChars,
        next_ref=head["next_ref"],
    )
    head["next_ref"] = plan.next_ref
    _register_aliases(session, plan)
    if not plan.needs_model:
        return finish_flush(session, plan, walk_answers(plan, {}), info)
    head["out"] = info["id"]
    row = plan_row(plan)
    session.store.put(row_key(session.session_id, "q", info["id"]), {**info, "plan": row})
    _remember_plan(info["id"], row, plan)
    return [request_envelope(session, plan, info, seq)]


#: The plan of each outstanding request this process stored, with the row it stored: the
#: answer finds the plan itself when the store hands back that very row (the embedded store
#: does) instead of rebuilding it (`plan_from_row`, which reads only what the row holds, as
#: the answer's walk and indexing do). Any other row (a restored state) is read as ever.
_PLANS: dict[str, tuple[dict[str, Any], FlushPlan]] = {}


def _remember_plan(request_id: str, row: dict[str, Any], plan: FlushPlan) -> None:
    if len(_PLANS) >= 256:
        _PLANS.clear()  # answers that never came (a dropped runtime): forget them
    _PLANS[request_id] = (row, plan)


def _plan_of(request_id: str, row: dict[str, Any]) -> FlushPlan:
    """The outstanding plan stored as `row`: the remembered one if `row` is its row."""
    found = _PLANS.pop(request_id, None)
    if found is not None and found[0] is row:
        return found[1]
    return plan_from_row(row)


def _register_aliases(session: Session, plan: FlushPlan) -> None:
    """The dedup pass registers every alias at once, before any summary (§5.3)."""
    for planned in plan.batches:
        for call, original in planned.deduped:
            index.add_alias(
                session.store,
                session.session_id,
                call,
                original,
                turn=planned.batch.turn_index,
                timestamp=planned.batch.timestamp,
            )
            _forget_result(session, call)
            session.head["stats"]["deduped_calls"] += 1
            session.head["stats"]["reclaimed_chars"] += call.raw_chars


def apply_compaction(session: Session, payload: CompactionPayload) -> list[Envelope] | None:
    """Apply the answer to the outstanding request; None when it answers nothing outstanding.

    An answer whose plan row is gone (a damaged or partly restored state) still takes the barrier
    down, with nothing applied: the session folds on and captures those batches again.
    """
    if not session.busy or payload.request_id != session.head["out"]:
        return None  # a second answer, or an answer to nothing: ignored
    plan_key = row_key(session.session_id, "q", payload.request_id)
    info: OutstandingRequest | None = session.store.get(plan_key)
    session.store.delete(plan_key)
    session.head["out"] = None
    if info is None:
        log.warning("flush plan missing; barrier released", extra={"session": session.session_id})
        return []
    plan = _plan_of(payload.request_id, info["plan"])
    answers = {} if payload.error else {r.batch: r for r in payload.results}
    return finish_flush(session, plan, walk_answers(plan, answers), info)


def finish_flush(
    session: Session, plan: FlushPlan, walk: Walk, info: AttemptInfo
) -> list[Envelope]:
    """Index the kept summaries, advance the frontier, update stats, record the attempt."""
    head, store, sid = session.head, session.store, session.session_id
    stats = head["stats"]
    for kept in walk.summaries:
        planned = plan.batches[kept.index]
        calls = planned.batch.calls
        head["summaries"] += 1
        index.add_batch(
            store,
            sid,
            calls,
            turn=planned.batch.turn_index,
            timestamp=planned.batch.timestamp,
            refs=kept.refs,
            summary_number=head["summaries"],
        )
        index.add_summary(
            store,
            sid,
            head["summaries"],
            text=kept.text,
            refs=kept.refs,
            keys=[c.key for c in calls],
            turn=planned.batch.turn_index,
            request_id=info["id"],
        )
        for call in calls:
            _forget_result(session, call)
        raw = sum(c.raw_chars for c in calls)
        stats["summaries"] += 1
        stats["summarized_calls"] += len(calls)
        stats["summarized_raw_chars"] += raw
        stats["summary_chars"] += js_length(kept.text)
        stats["reclaimed_chars"] += raw - js_length(kept.text)
    stats["calls"] += walk.usage.calls
    stats["input_tokens"] += walk.usage.input_tokens
    stats["output_tokens"] += walk.usage.output_tokens
    stats["cost"] += walk.usage.cost
    frontier = frontier_row(walk.processed)
    if frontier is not None:
        _set_frontier(session, frontier)
    head["queued"] = walk.unprocessed  # pushed back to the front of the queue
    return [_record_attempt(session, info, len(walk.processed), walk.outcome)]


def _set_frontier(session: Session, frontier: dict[str, Any]) -> None:
    """Store the frontier a flush left (`Frontier.model_dump()`) and move what depends on it."""
    head, store, sid = session.head, session.store, session.session_id
    head["frontier"] = frontier
    head["fn"] += 1
    leaf = metrics.on_frontier(store, sid, head["frontier"])  # the leaf: no move changes it
    moved: FrontierRow = {"frontier": head["frontier"], "leaf": leaf}
    store.put(row_key(sid, "f", head["fn"]), moved)
    _collect_dead_turns(session, frontier["last_attempted_turn_index"])


def _collect_dead_turns(session: Session, frontier_turn: int) -> None:
    """Turns before the frontier's are never captured again on this branch: drop their rows."""
    store, sid = session.store, session.session_id
    alive = []
    for turn in session.head["pending"]:
        if turn >= frontier_turn:
            alive.append(turn)
            continue
        window = store.get(f"{sid}/pr/w/{turn}")
        if window is not None:
            for seq in window["r"].values():
                store.delete(f"{sid}/pr/r/{seq}")
            store.delete(f"{sid}/pr/a/{window['a']}")
        store.delete(f"{sid}/pr/w/{turn}")
    session.head["pending"] = alive


_TRIGGERS = frozenset(get_args(Trigger))
_OUTCOMES = frozenset(get_args(AttemptOutcome))
_SNAPSHOT_FIELDS = tuple(MetricsSnapshot.model_fields)


def metrics_record(
    session_id: str, info: AttemptInfo, processed: int, outcome: AttemptOutcome
) -> dict[str, Any]:
    """An attempt's flush-metrics record: `FlushMetricsPayload(...).model_dump(mode="json")`,
    built as the dict itself when every field is what the fold writes (plain ints and strings,
    the snapshot's three counts); else through the model, which validates or refuses."""
    snapshot = info["metrics"]
    time = info["time"]
    if (
        type(info["id"]) is str
        and type(info["seq"]) is int
        and type(info["captured"]) is int
        and type(processed) is int
        and info["trigger"] in _TRIGGERS
        and outcome in _OUTCOMES
        and (time is None or type(time) is str)
        and tuple(snapshot) == _SNAPSHOT_FIELDS
        and all(type(value) is int for value in snapshot.values())
        and type(session_id) is str
    ):
        return {
            "request_id": info["id"],
            "session_id": session_id,
            "seq": info["seq"],
            "trigger": info["trigger"],
            "captured_batches": info["captured"],
            "processed_batches": processed,
            "outcome": outcome,
            "metrics": dict(snapshot),
            "time": time,
        }
    payload = FlushMetricsPayload(
        request_id=info["id"],
        session_id=session_id,
        seq=info["seq"],
        trigger=info["trigger"],
        captured_batches=info["captured"],
        processed_batches=processed,
        outcome=outcome,
        metrics=MetricsSnapshot(**snapshot),
        time=time,
    )
    return payload.model_dump(mode="json")


def _record_attempt(
    session: Session, info: AttemptInfo, processed: int, outcome: AttemptOutcome
) -> FlushMetricsEnvelope:
    """The one flush-metrics record of an attempt, kept in state and returned as an envelope."""
    record = metrics_record(session.session_id, info, processed, outcome)
    session.store.put(row_key(session.session_id, "m", info["n"]), record)
    log.info(
        "flush attempt",
        extra={"session": session.session_id, "trigger": info["trigger"], "outcome": outcome},
    )
    return opaque_envelope(
        FlushMetricsEnvelope, session.session_id, info["seq"], record, info["time"]
    )
