"""The flush request a plan becomes, and the plan kept in the store while it is outstanding.

The request carries what the summarizer needs (heads, arguments, refs); the stored plan only
what applying the answer needs (keys, sizes, hashes, seqs), under `q/<request id>`.
`request_envelope` builds the request's JSON directly: the fold only ever sends it, so building
its typed models (`request_payload`, which a test holds equal) and dumping them was pure cost.
"""

from __future__ import annotations

from typing import Any, get_args

from sessionfold.events.envelope import PruningRequestEnvelope, opaque_envelope
from sessionfold.events.flush import (
    DedupedCall,
    FlushBatch,
    FlushCall,
    FlushRequestPayload,
    Frontier,
    FrontierOutcome,
    MetricsSnapshot,
)
from sessionfold.projections.pruning.capture import Batch, Call
from sessionfold.projections.pruning.flush_pipeline import FlushPlan, PlannedBatch
from sessionfold.projections.pruning.records import AttemptInfo
from sessionfold.projections.pruning.session import Session
from sessionfold.projections.pruning.windows import frontier_of


def request_payload(session: Session, plan: FlushPlan, info: AttemptInfo) -> FlushRequestPayload:
    """The flush request for a plan: every batch in order, the refs, the entry snapshot."""
    return FlushRequestPayload(
        request_id=info["id"],
        session_id=session.session_id,
        seq=info["seq"],
        trigger=info["trigger"],
        model=session.config.summarizerModel,
        thinking=session.config.summarizerThinking,
        batches=tuple(_flush_batch(planned) for planned in plan.batches),
        frontier_before=frontier_of(session),
        metrics=MetricsSnapshot(**info["metrics"]),
        time=info["time"],
    )


def request_envelope(
    session: Session, plan: FlushPlan, info: AttemptInfo, seq: int
) -> PruningRequestEnvelope:
    """The flush request's envelope: `wrap(request_payload(...), seq)`, built from the plan
    without the typed models (the same JSON, field for field)."""
    raw = session.head["frontier"]
    frontier = None if raw is None else frontier_document(raw)
    snapshot = info["metrics"]
    document: dict[str, Any] = {
        "request_id": info["id"],
        "session_id": session.session_id,
        "seq": info["seq"],
        "trigger": info["trigger"],
        "model": session.config.summarizerModel,
        "thinking": session.config.summarizerThinking,
        "batches": [_batch_document(planned) for planned in plan.batches],
        "frontier_before": frontier,
        "metrics": {name: snapshot[name] for name in MetricsSnapshot.model_fields},
        "time": info["time"],
    }
    return opaque_envelope(PruningRequestEnvelope, session.session_id, seq, document, info["time"])


_FRONTIER_FIELDS = tuple(Frontier.model_fields)
_FRONTIER_INTS = _FRONTIER_FIELDS[2:-1]
_FRONTIER_OUTCOMES = frozenset(get_args(FrontierOutcome))


def frontier_document(raw: Any) -> dict[str, Any]:
    """`Frontier.model_validate(raw).model_dump(mode="json")`: a copy of `raw` when it is what
    a flush stores (`frontier_row`: every field, in order, of its exact type); anything else
    (a restored or damaged row) goes through the model, which fills, coerces or refuses."""
    if (
        type(raw) is dict
        and tuple(raw) == _FRONTIER_FIELDS
        and type(raw["last_attempted_tool_call_id"]) is str
        and type(raw["last_attempted_tool_name"]) is str
        and all(type(raw[name]) is int for name in _FRONTIER_INTS)
        and type(raw["outcome"]) is str
        and raw["outcome"] in _FRONTIER_OUTCOMES
    ):
        return dict(raw)
    return Frontier.model_validate(raw).model_dump(mode="json")


def _batch_document(planned: PlannedBatch) -> dict[str, Any]:
    """`_flush_batch(planned).model_dump(mode="json")`, field order included."""
    batch = planned.batch
    refs = planned.refs or (None,) * len(batch.calls)
    return {
        "turn_index": batch.turn_index,
        "timestamp": batch.timestamp,
        "assistant_text": batch.assistant_text,
        "disposition": planned.disposition,
        "calls": [
            {
                "key": c.key,
                "tool_call_id": c.tool_call_id,
                "tool_name": c.tool_name,
                "arguments": c.arguments,
                "is_error": c.is_error,
                "raw_chars": c.raw_chars,
                "content_hash": c.content_hash,
                "head": c.head,
                "truncated_chars": c.truncated_chars,
                "seq": c.seq,
                "ref": ref,
            }
            for c, ref in zip(batch.calls, refs, strict=True)
        ],
        "deduped": [
            {
                "key": c.key,
                "tool_call_id": c.tool_call_id,
                "tool_name": c.tool_name,
                "original_key": original,
                "raw_chars": c.raw_chars,
                "seq": c.seq,
            }
            for c, original in planned.deduped
        ],
    }


def _flush_batch(planned: PlannedBatch) -> FlushBatch:
    refs = planned.refs or (None,) * len(planned.batch.calls)
    return FlushBatch(
        turn_index=planned.batch.turn_index,
        timestamp=planned.batch.timestamp,
        assistant_text=planned.batch.assistant_text,
        disposition=planned.disposition,
        calls=tuple(
            FlushCall(
                key=c.key,
                tool_call_id=c.tool_call_id,
                tool_name=c.tool_name,
                arguments=c.arguments,
                is_error=c.is_error,
                raw_chars=c.raw_chars,
                content_hash=c.content_hash,
                head=c.head,
                truncated_chars=c.truncated_chars,
                seq=c.seq,
                ref=ref,
            )
            for c, ref in zip(planned.batch.calls, refs, strict=True)
        ),
        deduped=tuple(
            DedupedCall(
                key=c.key,
                tool_call_id=c.tool_call_id,
                tool_name=c.tool_name,
                original_key=original,
                raw_chars=c.raw_chars,
                seq=c.seq,
            )
            for c, original in planned.deduped
        ),
    )


def _call_row(call: Call) -> dict[str, Any]:
    # What the walk and the index need; the head and arguments went out with the request.
    return {
        "key": call.key,
        "id": call.tool_call_id,
        "tool": call.tool_name,
        "raw": call.raw_chars,
        "hash": call.content_hash,
        "seq": call.seq,
        "err": call.is_error,
        "aseq": call.assistant_seq,
    }


def _call_from_row(row: dict[str, Any]) -> Call:
    return Call(
        key=row["key"],
        tool_call_id=row["id"],
        tool_name=row["tool"],
        raw_chars=row["raw"],
        content_hash=row["hash"],
        head="",
        seq=row["seq"],
        is_error=row["err"],
        assistant_seq=row["aseq"],
    )


def plan_row(plan: FlushPlan) -> dict[str, Any]:
    """The plan as kept in the store while its request is outstanding (no heads, no args)."""
    return {
        "next_ref": plan.next_ref,
        "batches": [
            {
                "turn": p.batch.turn_index,
                "ts": p.batch.timestamp,
                "group": p.batch.group,
                "disp": p.disposition,
                "refs": list(p.refs),
                "calls": [_call_row(c) for c in p.batch.calls],
                "dups": [[_call_row(c), original] for c, original in p.deduped],
            }
            for p in plan.batches
        ],
    }


def plan_from_row(row: dict[str, Any]) -> FlushPlan:
    """Inverse of plan_row."""
    batches = tuple(
        PlannedBatch(
            batch=Batch(
                b["turn"], b["ts"], tuple(_call_from_row(c) for c in b["calls"]), "", b["group"]
            ),
            disposition=b["disp"],
            deduped=tuple((_call_from_row(c), original) for c, original in b["dups"]),
            refs=tuple(b["refs"]),
        )
        for b in row["batches"]
    )
    return FlushPlan(batches, row["next_ref"])
