"""The per-session fold: sequence guard, flush barrier, triggers, capture, frontier, reload rearm.

Sessions are built entry by entry with `Pi` and folded either through the embedded runtime
(requests answered at once) or envelope by envelope with `apply` (to see the barrier).
Acceptance scenarios of reference §12 and invariants of §14, adapted to events.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionfold.events.envelope import (
    CommandEnvelope,
    CommandPayload,
    CompactionEnvelope,
    EntryEnvelope,
    EntryPayload,
    FlushMetricsEnvelope,
    FlushRequestEnvelope,
    OpaquePayload,
    PlaceholderEnvelope,
    PlaceholderPayload,
    ReloadEnvelope,
    UsageEnvelope,
    UsagePayload,
)
from sessionfold.events.flush import (
    BatchResult,
    CompactionPayload,
    FlushRequestPayload,
    ModelUsage,
    read_flush_metrics,
    read_request,
    wrap,
)
from sessionfold.ports.summarizer import OfflineSummarizer
from sessionfold.projections.pruning import context_metrics as metrics
from sessionfold.projections.pruning import digest, index, windows
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.capture import Batch, Call, call_arguments, group_batches
from sessionfold.projections.pruning.config import PruneConfig, build_config
from sessionfold.projections.pruning.fold import apply
from sessionfold.projections.pruning.frontier import trim_batches
from sessionfold.projections.store import DictStore
from sessionfold.streams.runtime.embedded import EmbeddedRuntime
from sessionfold.streams.runtime.step import answer_pruning, fold_step

SID = "sess-1"
BIG = 1500  # above the default minBatchChars


class Pi:
    """Builds a session's envelopes the way a producer publishes them, one seq per event."""

    def __init__(self, session_id: str = SID) -> None:
        self.session_id = session_id
        self.seq = 0
        self.count = 0
        self.leaf: str | None = None
        self.clock = 1_760_000_000_000
        self.envelopes: list[Any] = []

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _entry(self, fields: dict[str, Any], parent: str | None = None) -> EntryEnvelope:
        self.count += 1
        self.clock += 1000
        entry_id = f"e{self.count}"
        stamp = datetime.fromtimestamp(self.clock / 1000, UTC).isoformat().replace("+00:00", "Z")
        entry = {
            "type": "message",
            "id": entry_id,
            "parentId": self.leaf if parent is None else parent,
            "timestamp": stamp,
            **fields,
        }
        self.leaf = entry_id
        envelope = EntryEnvelope(
            session_id=self.session_id,
            seq=self._next_seq(),
            time=stamp,
            payload=EntryPayload(entry=entry),
        )
        self.envelopes.append(envelope)
        return envelope

    def header(self) -> EntryEnvelope:
        envelope = EntryEnvelope(
            session_id=self.session_id,
            seq=self._next_seq(),
            payload=EntryPayload(entry={"type": "session", "version": 3, "id": self.session_id}),
        )
        self.envelopes.append(envelope)
        return envelope

    def user(self, text: str = "do it", parent: str | None = None) -> EntryEnvelope:
        message = {"role": "user", "content": [{"type": "text", "text": text}]}
        return self._entry({"message": {**message, "timestamp": self.clock}}, parent)

    def assistant(
        self,
        *calls: tuple[str, str, dict[str, Any]],
        text: str = "",
        thinking: str | None = None,
        stop: str | None = None,
        tokens: int | None = None,
    ) -> EntryEnvelope:
        content: list[dict[str, Any]] = []
        if thinking is not None:
            content.append({"type": "thinking", "thinking": thinking})
        if text:
            content.append({"type": "text", "text": text})
        for call_id, name, args in calls:
            content.append({"type": "toolCall", "id": call_id, "name": name, "arguments": args})
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "stopReason": stop or ("toolUse" if calls else "stop"),
            "timestamp": self.clock + 1000,
        }
        if tokens is not None:
            message["usage"] = {"input": tokens, "output": 0, "cacheRead": 0, "cacheWrite": 0}
        return self._entry({"message": message})

    def reply(self, text: str = "done", **kwargs: Any) -> EntryEnvelope:
        return self.assistant(text=text, **kwargs)

    def result(
        self,
        call_id: str,
        name: str,
        size: int = BIG,
        *,
        text: str | None = None,
        is_error: bool = False,
        timestamp: Any = "auto",
    ) -> EntryEnvelope:
        body = text if text is not None else f"{call_id}:{self.count}:" + "x" * size
        message: dict[str, Any] = {
            "role": "toolResult",
            "toolCallId": call_id,
            "toolName": name,
            "content": [{"type": "text", "text": body}],
            "isError": is_error,
        }
        if timestamp == "auto":
            message["timestamp"] = self.clock + 1000
        elif timestamp is not None:
            message["timestamp"] = timestamp
        return self._entry({"message": message})

    def turn(self, *calls: str, name: str = "read", size: int = BIG) -> list[EntryEnvelope]:
        """One assistant with the given call ids and a result for each."""
        out = [self.assistant(*((c, name, {"path": f"/w/{c}.ts"}) for c in calls))]
        out.extend(self.result(c, name, size) for c in calls)
        return out

    def reload(self) -> ReloadEnvelope:
        envelope = ReloadEnvelope(session_id=self.session_id, seq=self._next_seq())
        self.envelopes.append(envelope)
        return envelope

    def usage(self, tokens: int | None, window: int | None = None) -> UsageEnvelope:
        envelope = UsageEnvelope(
            session_id=self.session_id,
            seq=self._next_seq(),
            payload=UsagePayload(tokens=tokens, context_window=window),
        )
        self.envelopes.append(envelope)
        return envelope

    def command(self, name: str, **settings: Any) -> CommandEnvelope:
        envelope = CommandEnvelope(
            session_id=self.session_id,
            seq=self._next_seq(),
            payload=CommandPayload(name=name, settings=settings),  # type: ignore[arg-type]
        )
        self.envelopes.append(envelope)
        return envelope


def run(pi: Pi, config: PruneConfig | None = None, summarizer: Any = None) -> EmbeddedRuntime:
    """Fold every envelope of `pi` in the embedded runtime."""
    runtime = EmbeddedRuntime(config or build_config(), summarizer)
    for envelope in pi.envelopes:
        runtime.publish(envelope)
    return runtime


def attempts(runtime: EmbeddedRuntime) -> list[dict[str, Any]]:
    return pruning.flush_records(runtime.store, SID)


def head(runtime: EmbeddedRuntime) -> dict[str, Any]:
    return pruning.load_head(runtime.store, SID)


def canonical(store: DictStore) -> bytes:
    return orjson.dumps(dict(store), option=orjson.OPT_SORT_KEYS)


class FailingSummarizer:
    """Fails every batch whose index is in `failing`; summarizes the rest offline."""

    def __init__(self, failing: set[int] | None = None, text: str | None = None) -> None:
        self.failing = failing
        self.text = text
        self.requests: list[FlushRequestPayload] = []

    def summarize(self, request: FlushRequestPayload) -> CompactionPayload:
        self.requests.append(request)
        answer = OfflineSummarizer().summarize(request)
        results = []
        for result in answer.results:
            if self.failing is None or result.batch in self.failing:
                results.append(BatchResult(batch=result.batch, outcome="failed", error="down"))
            elif self.text is not None and result.outcome == "summarized":
                results.append(result.model_copy(update={"text": self.text}))
            else:
                results.append(result)
        return answer.model_copy(update={"results": tuple(results)})


def simple_session(pi: Pi, flushes: int = 2) -> Pi:
    pi.header()
    for n in range(flushes):
        pi.user()
        pi.turn(f"a{n}", f"b{n}")
        pi.turn(f"c{n}")
        pi.reply()
    return pi


# --- sequence guard and idempotence ----------------------------------------------------------


def test_an_envelope_not_above_the_last_seq_is_ignored() -> None:
    """Redelivery of an already applied seq changes nothing and outputs nothing."""
    pi = simple_session(Pi(), flushes=1)
    store = DictStore()
    for envelope in pi.envelopes[:4]:
        apply(store, envelope)
    before = canonical(store)
    for envelope in pi.envelopes[:4]:
        assert apply(store, envelope) == []
    assert canonical(store) == before


def test_feeding_every_envelope_twice_gives_byte_identical_state() -> None:
    """Replaying the fold order with each envelope twice (every fold: pruning and ledger)
    yields the same canonical JSON."""
    pi = simple_session(Pi(), flushes=3)
    pi.reload()
    pi.command("flush")
    runtime = run(pi)
    once, twice = DictStore(), DictStore()
    for envelope in runtime.folded:
        fold_step(once, envelope, runtime.config)
        fold_step(twice, envelope, runtime.config)
        fold_step(twice, envelope, runtime.config)
    assert canonical(once) == canonical(twice) == canonical(runtime.store)


# --- the flush barrier ------------------------------------------------------------------------


def test_barrier_holds_later_events_until_the_compaction_is_applied() -> None:
    """While a request is outstanding the session's later events wait in the store."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.turn("a")
    reply = pi.reply()
    later = [pi.user("next"), *pi.turn("b"), pi.reply()]
    store = DictStore()
    outputs: list[Any] = []
    for envelope in pi.envelopes[: pi.envelopes.index(reply) + 1]:
        outputs = apply(store, envelope)
    [request] = outputs
    assert isinstance(request, FlushRequestEnvelope)
    messages_before = digest.head(store, SID)["n"]
    for envelope in later:
        assert apply(store, envelope) == []
    assert digest.head(store, SID)["n"] == messages_before  # not even the reply is folded yet
    assert pruning.load_head(store, SID)["held"] == [reply.seq] + [e.seq for e in later]
    compaction = wrap(OfflineSummarizer().summarize(read_request(request)), request.seq)
    released = apply(store, compaction)
    assert isinstance(released[0], FlushMetricsEnvelope)
    assert isinstance(released[-1], FlushRequestEnvelope)  # the later reply's own flush
    assert pruning.load_head(store, SID)["held"] == [later[-1].seq]
    assert digest.head(store, SID)["n"] == messages_before + 4


def test_a_second_compaction_for_the_same_request_is_ignored() -> None:
    """A compaction answers one request id; a second answer changes nothing."""
    pi = simple_session(Pi(), flushes=1)
    runtime = run(pi)
    [compaction] = runtime.log["compaction-events"]
    before = canonical(runtime.store)
    assert apply(runtime.store, compaction) == []
    assert canonical(runtime.store) == before


def test_a_compaction_answering_nothing_outstanding_is_ignored() -> None:
    """An answer to an unknown request id is ignored."""
    pi = simple_session(Pi(), flushes=1)
    runtime = run(pi)
    stray = CompactionPayload(request_id=f"{SID}:999", session_id=SID, model="offline")
    before = canonical(runtime.store)
    assert apply(runtime.store, wrap(stray, 999)) == []
    assert canonical(runtime.store) == before


def test_a_ledger_pass_result_on_the_compaction_topic_is_not_ours() -> None:
    """Compactions of another producer (the ledger's pass results) are left alone."""
    pi = simple_session(Pi(), flushes=1)
    runtime = run(pi)
    before = canonical(runtime.store)
    ledger = CompactionEnvelope(
        session_id=SID,
        seq=99,
        payload=OpaquePayload(producer="sessionfold-ledger", request=f"{SID}/ledger/9"),
    )
    broken = CompactionEnvelope(
        session_id=SID, seq=99, payload=OpaquePayload(producer="sessionfold-pruning")
    )
    assert apply(runtime.store, ledger) == [] and apply(runtime.store, broken) == []
    assert canonical(runtime.store) == before


# --- triggers and the flush-metrics entry ----------------------------------------------------


def test_message_end_snapshot_is_taken_before_the_reply_is_folded() -> None:
    """The entry snapshot records the open cycle's thinking and gap that triggered the flush."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.assistant(("a", "read", {"path": "/w/a"}), thinking="t" * 400)
    pi.result("a", "read", BIG)
    pi.reply()
    runtime = run(pi)
    [record] = attempts(runtime)
    assert record["trigger"] == "message-end"
    assert record["outcome"] == "summarized"
    assert record["captured_batches"] == record["processed_batches"] == 1
    assert record["metrics"]["open_cycle_thinking_tokens"] > 100
    assert record["metrics"]["frontier_gap_tokens"] > BIG // 4
    after = metrics.snapshot(runtime.store, SID)
    assert after["open_cycle_thinking_tokens"] == 0
    assert after["frontier_gap_tokens"] == 0


def test_a_flush_with_nothing_ready_is_an_empty_attempt_and_recorded() -> None:
    """A final reply with nothing pending still writes one record, outcome empty."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.reply()
    runtime = run(pi)
    [record] = attempts(runtime)
    assert (record["outcome"], record["captured_batches"], record["processed_batches"]) == (
        "empty",
        0,
        0,
    )
    assert runtime.log["flush-requests"] == []


def test_one_flush_metrics_record_per_attempt_whatever_the_outcome() -> None:
    """Summarized, empty, skipped and error attempts each leave exactly one record."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.turn("a")
    pi.reply()  # fails below
    pi.reply()  # retried: summarized
    pi.reply()  # empty
    pi.turn("b", size=10)
    pi.reply()  # trivial
    summarizer = FailingSummarizer(failing=set())
    runtime = EmbeddedRuntime(build_config(), summarizer)
    for envelope in pi.envelopes:
        summarizer.failing = {0} if envelope.seq <= 5 else set()
        runtime.publish(envelope)
    outcomes = [r["outcome"] for r in attempts(runtime)]
    assert outcomes == ["error", "summarized", "empty", "skipped-trivial"]
    assert len(runtime.log["flush-metrics"]) == 4
    assert [read_flush_metrics(e).outcome for e in runtime.log["flush-metrics"]] == outcomes


def test_on_demand_mode_does_not_flush_on_a_final_reply() -> None:
    """pruneOn on-demand ignores final replies; a manual flush command flushes."""
    pi = simple_session(Pi(), flushes=1)
    pi.command("flush")
    runtime = run(pi, build_config({"pruneOn": "on-demand"}))
    [record] = attempts(runtime)
    assert record["trigger"] == "manual"
    assert record["outcome"] == "summarized"
    assert record["captured_batches"] == 2


def test_enabled_false_folds_with_no_flushes() -> None:
    """With pruning disabled nothing is flushed, not even on command; metrics still fold."""
    pi = simple_session(Pi(), flushes=2)
    pi.command("flush")
    runtime = run(pi, build_config({"enabled": False}))
    assert attempts(runtime) == []
    assert runtime.log["flush-requests"] == []
    assert metrics.snapshot(runtime.store, SID)["frontier_gap_tokens"] > 0


def _on_demand(**settings: Any) -> PruneConfig:
    return build_config({"pruneOn": "on-demand", **settings})


def test_budget_threshold_fires_at_the_turn_end() -> None:
    """A turn that queues a batch with usage over threshold x window flushes as budget."""
    pi = Pi()
    pi.header()
    pi.usage(None, 10_000)
    pi.user()
    pi.assistant(("a", "read", {"path": "/w/a"}), tokens=4_000)
    pi.result("a", "read")
    pi.assistant(("b", "read", {"path": "/w/b"}), tokens=6_000)
    pi.result("b", "read")
    runtime = run(pi, _on_demand(autoBudgetThreshold=0.5))
    [record] = attempts(runtime)
    assert record["trigger"] == "budget"
    assert record["seq"] == pi.envelopes[-1].seq  # evaluated when the turn's last result came
    assert record["captured_batches"] == 2


def test_budget_window_cap_binds_on_huge_windows() -> None:
    """On a 1M window at 0.4 the level is capped at 300k tokens."""
    pi = Pi()
    pi.header()
    pi.usage(None, 1_000_000)
    pi.user()
    pi.assistant(("a", "read", {"path": "/w/a"}), tokens=299_999)
    pi.result("a", "read")
    pi.assistant(("b", "read", {"path": "/w/b"}), tokens=300_000)
    pi.result("b", "read")
    runtime = run(pi, _on_demand(autoBudgetThreshold=0.4))
    assert [r["seq"] for r in attempts(runtime)] == [pi.envelopes[-1].seq]


def test_budget_delta_fires_on_a_jump_between_gated_turns() -> None:
    """The delta trigger compares with the previous gated turn; the first one never fires."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.assistant(("a", "read", {"path": "/w/a"}), tokens=20_000)
    pi.result("a", "read")
    pi.assistant(("b", "read", {"path": "/w/b"}), tokens=29_000)
    pi.result("b", "read")
    pi.assistant(("c", "read", {"path": "/w/c"}), tokens=50_000)
    pi.result("c", "read")
    runtime = run(pi, _on_demand(budgetTurnDelta=0.1, contextWindow=200_000))
    [record] = attempts(runtime)
    assert record["trigger"] == "delta"
    assert record["captured_batches"] == 3


def test_gate_is_not_evaluated_when_the_turn_queues_nothing() -> None:
    """A turn whose only call is protected queues nothing: no gate, even over budget."""
    pi = Pi()
    pi.header()
    pi.usage(None, 1000)
    pi.user()
    pi.assistant(("a", "read", {"path": "/w/skills/x/SKILL.md"}), tokens=900)
    pi.result("a", "read")
    runtime = run(pi, _on_demand(autoBudgetThreshold=0.5))
    assert attempts(runtime) == []


def test_at_most_one_request_is_outstanding_per_session() -> None:
    """A manual flush while a request is outstanding is held, not a second request."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.turn("a")
    first = pi.command("flush")
    pi.turn("b")
    second = pi.command("flush")
    store = DictStore()
    config = _on_demand()
    requests = []
    for envelope in pi.envelopes:
        requests.extend(o for o in apply(store, envelope, config) if o.kind == "flush-request")
    assert [r.seq for r in requests] == [first.seq]
    compaction = wrap(OfflineSummarizer().summarize(read_request(requests[0])), first.seq)
    released = apply(store, compaction, config)
    assert [o.seq for o in released if o.kind == "flush-request"] == [second.seq]


# --- capture and occurrence keys -------------------------------------------------------------


def test_reused_ids_pair_within_their_own_turn_and_get_distinct_refs() -> None:
    """Two turns reusing one call id are captured and summarized as separate occurrences."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.turn("bash_1", name="bash")
    pi.turn("bash_1", name="bash")
    pi.reply()
    runtime = run(pi)
    [request] = runtime.log["flush-requests"]
    keys = [c.key for b in read_request(request).batches for c in b.calls]
    assert len(set(keys)) == 2 and all(k.startswith("bash_1@") for k in keys)
    refs = {index.record(runtime.store, SID, k)["ref"] for k in keys}
    assert refs == {"t1", "t2"}


def test_results_outside_their_turn_window_are_ignored() -> None:
    """A result arriving after the next assistant does not pair with the earlier call."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.assistant(("a", "read", {"path": "/w/a"}))
    pi.assistant(("b", "read", {"path": "/w/b"}))
    pi.result("a", "read")
    pi.result("b", "read")
    pi.reply()
    runtime = run(pi)
    [request] = runtime.log["flush-requests"]
    assert [c.tool_call_id for b in read_request(request).batches for c in b.calls] == ["b"]


def test_calls_without_a_result_are_not_captured() -> None:
    """A call whose result never arrived is not ready; the others of its turn are."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.assistant(("a", "read", {"path": "/w/a"}), ("b", "read", {"path": "/w/b"}))
    pi.result("b", "read")
    pi.reply()
    runtime = run(pi)
    [request] = runtime.log["flush-requests"]
    assert [c.tool_call_id for c in read_request(request).batches[0].calls] == ["b"]


def test_first_result_per_id_wins_and_the_key_carries_its_timestamp() -> None:
    """The occurrence key is id@resultTimestamp of the first result; a bare id without one."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.assistant(("a", "read", {"path": "/w/a"}), ("n", "read", {"path": "/w/n"}))
    pi.result("a", "read", timestamp=1234)
    pi.result("a", "read", timestamp=5678)
    pi.result("n", "read", timestamp=None)
    pi.reply()
    runtime = run(pi)
    [request] = runtime.log["flush-requests"]
    assert [c.key for c in read_request(request).batches[0].calls] == ["a@1234", "n"]


def test_agent_message_batching_merges_one_user_turn() -> None:
    """batchingMode agent-message sends one batch per user turn, last turn's index."""
    pi = simple_session(Pi(), flushes=1)
    runtime = run(pi, build_config({"batchingMode": "agent-message"}))
    [request] = runtime.log["flush-requests"]
    [batch] = read_request(request).batches
    assert [c.tool_call_id for c in batch.calls] == ["a0", "b0", "c0"]
    assert batch.turn_index == 1


def test_protected_paths_are_never_captured_and_leave_the_gap() -> None:
    """A read of a skills markdown file is never captured, indexed or counted in the gap."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.assistant(("a", "read", {"path": "/repo/skills/git/SKILL.md"}))
    pi.result("a", "read")
    reply = pi.reply()
    runtime = run(pi)
    [record] = attempts(runtime)
    assert record["outcome"] == "empty"
    assert record["metrics"]["frontier_gap_tokens"] == 0
    assert not index.is_summarized(
        runtime.store, SID, f"a@{reply.payload.entry['message']['timestamp'] - 1000}"
    )


def test_protected_tools_by_name() -> None:
    """protectedTools keeps every call of that tool out of batches."""
    pi = simple_session(Pi(), flushes=1)
    runtime = run(pi, build_config({"protectedTools": ["read"]}))
    assert [r["outcome"] for r in attempts(runtime)] == ["empty"]


# --- pipeline, frontier and index --------------------------------------------------------------


def test_trivial_batches_advance_the_frontier_and_are_not_retried() -> None:
    """A skipped range is never re-attempted: the frontier moved past it."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.turn("a", size=10)
    pi.reply()
    pi.reply()
    runtime = run(pi)
    assert [r["outcome"] for r in attempts(runtime)] == ["skipped-trivial", "empty"]
    frontier = head(runtime)["frontier"]
    assert frontier["last_attempted_tool_call_id"] == "a"
    assert frontier["outcome"] == "skipped-trivial"
    assert not index.is_summarized(runtime.store, SID, "a")


def test_a_failed_flush_does_not_advance_the_frontier_and_loses_nothing() -> None:
    """Nothing processed: outcome error, frontier unchanged, the batches retried next time."""
    pi = simple_session(Pi(), flushes=1)
    pi.reply()
    summarizer = FailingSummarizer(failing=None)
    runtime = EmbeddedRuntime(build_config(), summarizer)
    for envelope in pi.envelopes[:-1]:
        runtime.publish(envelope)
    assert [r["outcome"] for r in attempts(runtime)] == ["error"]
    assert head(runtime)["frontier"] is None
    assert head(runtime)["queued"] == 2
    summarizer.failing = set()
    runtime.publish(pi.envelopes[-1])
    last = attempts(runtime)[-1]
    assert (last["outcome"], last["captured_batches"]) == ("summarized", 2)


def test_a_failure_midway_keeps_the_processed_prefix() -> None:
    """Batches before the first failure are processed; the frontier stops before the failure."""
    pi = simple_session(Pi(), flushes=1)
    runtime = run(pi, summarizer=FailingSummarizer(failing={1}))
    [record] = attempts(runtime)
    assert (record["outcome"], record["processed_batches"]) == ("summarized", 1)
    assert head(runtime)["frontier"]["last_attempted_tool_call_id"] == "b0"
    assert head(runtime)["queued"] == 1


def test_dedup_across_flushes_aliases_to_the_original_and_its_ref() -> None:
    """Identical output in a later flush is aliased (no model call) and inherits the tN."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.assistant(("a", "read", {"path": "/w/x"}))
    pi.result("a", "read", text="same\n" * 400)
    pi.reply()
    pi.user()
    pi.assistant(("b", "read", {"path": "/w/x"}))
    second = pi.result("b", "read", text="same  \r\n" * 400)
    pi.reply()
    runtime = run(pi)
    assert [r["outcome"] for r in attempts(runtime)] == ["summarized", "skipped-deduped"]
    assert len(runtime.log["flush-requests"]) == 1
    key = digest.occurrence_key("b", second.payload.entry["message"]["timestamp"])
    alias = index.record(runtime.store, SID, key)
    assert alias is not None and alias["ref"] == "t1" and alias["alias"].startswith("a@")
    assert head(runtime)["frontier"]["last_attempted_tool_call_id"] == "b"


def test_oversized_summaries_are_discarded_and_the_frontier_advances() -> None:
    """A summary longer than its raw output is skipped-oversized: no index, refs burned."""
    pi = simple_session(Pi(), flushes=1)
    runtime = run(pi, summarizer=FailingSummarizer(failing=set(), text="y" * 5000))
    [record] = attempts(runtime)
    assert record["outcome"] == "skipped-oversized"
    assert head(runtime)["frontier"]["outcome"] == "skipped-oversized"
    assert index.resolve_ref(runtime.store, SID, "t1") is None
    assert head(runtime)["next_ref"] == 4


def test_refs_are_unique_monotonic_and_point_at_the_original_entry() -> None:
    """Refs t1..tN follow batch order across flushes; each names one occurrence whose index
    record points at the toolResult entry's seq."""
    pi = simple_session(Pi(), flushes=3)
    runtime = run(pi)
    results = {
        digest.occurrence_key(
            e.payload.entry["message"]["toolCallId"], e.payload.entry["message"]["timestamp"]
        ): e.seq
        for e in pi.envelopes
        if isinstance(e, EntryEnvelope)
        and e.payload.entry.get("message", {}).get("role") == "toolResult"
    }
    keys = [index.resolve_ref(runtime.store, SID, f"t{n}") for n in range(1, 10)]
    assert len(set(keys)) == 9
    assert [k.split("@")[0] for k in keys] == ["a0", "b0", "c0", "a1", "b1", "c1", "a2", "b2", "c2"]
    for ref_number, key in enumerate(keys, start=1):
        record = index.record(runtime.store, SID, key)
        assert record["ref"] == f"t{ref_number}"
        assert record["seq"] == results[key]


def test_oversized_single_results_are_spilled_by_pointer_without_a_model_call() -> None:
    """A result over spillThreshold is indexed at its turn end with a head preview, no ref."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.assistant(("a", "read", {"path": "/w/a"}))
    big = pi.result("a", "read", text="line\n" * 1000)
    pi.reply()
    runtime = run(pi, build_config({"spillThreshold": 4000, "spillPreviewBytes": 100}))
    key = digest.occurrence_key("a", big.payload.entry["message"]["timestamp"])
    record = index.record(runtime.store, SID, key)
    assert record["spill"]["bytes"] == 5000
    assert record["spill"]["preview"] == ("line\n" * 20).rstrip("\n")
    assert "ref" not in record and record["seq"] == big.seq
    assert [r["outcome"] for r in attempts(runtime)] == ["empty"]
    assert runtime.log["flush-requests"] == []


# --- reload rearm ----------------------------------------------------------------------------


def test_reload_rearms_and_a_gate_without_tool_results_flushes_the_recovered_work() -> None:
    """Reload with unflushed work, then a turn end without results over budget: trigger rearmed."""
    pi = Pi()
    pi.header()
    pi.usage(None, 10_000)
    pi.user()
    pi.assistant(("a", "read", {"path": "/w/a"}), tokens=1_000)
    pi.result("a", "read")
    pi.reload()
    pi.usage(9_000, 10_000)
    pi.user()
    pi.reply()
    config = _on_demand(autoBudgetThreshold=0.8)
    runtime = EmbeddedRuntime(config)
    for envelope in pi.envelopes[:-4]:
        runtime.publish(envelope)
    assert head(runtime)["queued"] == 1 and not head(runtime)["rearmed"]
    runtime.publish(pi.envelopes[-4])  # the reload
    assert head(runtime)["rearmed"] and head(runtime)["queued"] == 0
    for envelope in pi.envelopes[-3:]:
        runtime.publish(envelope)
    [record] = attempts(runtime)
    assert (record["trigger"], record["outcome"]) == ("rearmed", "summarized")
    assert not head(runtime)["rearmed"]


def test_reloads_are_side_effect_free() -> None:
    """A reload outputs nothing, calls no model, flushes nothing; no work means no rearm."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.turn("a")
    reload = pi.reload()
    store = DictStore()
    for envelope in pi.envelopes[:-1]:
        apply(store, envelope, _on_demand())
    assert apply(store, reload, _on_demand()) == []
    assert pruning.load_head(store, SID)["rearmed"] is True
    disabled = DictStore()
    for envelope in pi.envelopes:
        assert apply(disabled, envelope, build_config({"enabled": False})) == []
    assert pruning.load_head(disabled, SID)["rearmed"] is False


def test_rearm_is_cleared_at_the_start_of_any_flush_even_an_empty_one() -> None:
    """The flag clears when a flush starts, whatever the outcome."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.turn("a", size=10)
    pi.reload()
    pi.reply()
    runtime = run(pi)
    assert [r["outcome"] for r in attempts(runtime)] == ["skipped-trivial"]
    assert not head(runtime)["rearmed"]


# --- config commands and branch switches -----------------------------------------------------


def test_a_config_command_changes_the_session_config() -> None:
    """A config command's settings merge into the session's config; invalid ones are refused."""
    pi = Pi()
    pi.header()
    pi.command("config", minBatchChars=500)
    pi.command("config", minBatchChars=-3)
    pi.user()
    pi.turn("a", size=600)
    pi.reply()
    runtime = run(pi)
    assert [r["outcome"] for r in attempts(runtime)] == ["summarized"]


def test_a_branch_switch_captures_only_the_new_branch() -> None:
    """Navigating back in the tree leaves the abandoned branch's batches behind."""
    pi = Pi()
    pi.header()
    start = pi.user()
    pi.turn("old")
    pi.user("again", parent=start.payload.entry["id"])
    pi.turn("new")
    pi.reply()
    runtime = run(pi)
    [request] = runtime.log["flush-requests"]
    assert [c.tool_call_id for b in read_request(request).batches for c in b.calls] == ["new"]
    assert read_request(request).batches[0].turn_index == 0


@pytest.mark.parametrize("mode", ["turn", "agent-message"])
def test_every_attempt_leaves_frontier_gap_zero_when_all_is_summarized(mode: str) -> None:
    """After a summarizing flush of everything, the frontier gap is 0."""
    pi = simple_session(Pi(), flushes=2)
    runtime = run(pi, build_config({"batchingMode": mode}))
    assert metrics.snapshot(runtime.store, SID)["frontier_gap_tokens"] == 0
    assert all(r["outcome"] == "summarized" for r in attempts(runtime))


def test_usage_is_added_to_stats() -> None:
    """Model usage and cost of every answered call go into the stats."""
    pi = simple_session(Pi(), flushes=1)

    class Paid(FailingSummarizer):
        def summarize(self, request: FlushRequestPayload) -> CompactionPayload:
            answer = super().summarize(request)
            priced = tuple(
                r.model_copy(update={"usage": ModelUsage(input_tokens=10, cost=0.5, calls=1)})
                for r in answer.results
            )
            return answer.model_copy(update={"results": priced})

    runtime = run(pi, summarizer=Paid(failing=set()))
    stats = head(runtime)["stats"]
    assert (stats["calls"], stats["input_tokens"], stats["cost"]) == (2, 20, 1.0)
    assert stats["summarized_calls"] == 3


def test_an_oversized_duplicate_is_aliased_not_spilled_again() -> None:
    """A second oversized result with the same content becomes an alias of the first."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.assistant(("a", "read", {"path": "/w/a"}))
    pi.result("a", "read", text="big\n" * 2000)
    pi.assistant(("b", "read", {"path": "/w/a"}))
    second = pi.result("b", "read", text="big\n" * 2000)
    runtime = run(pi, _on_demand(spillThreshold=4000))
    key = digest.occurrence_key("b", second.payload.entry["message"]["timestamp"])
    record = index.record(runtime.store, SID, key)
    assert record["alias"].startswith("a@") and "spill" not in record
    assert head(runtime)["stats"]["spilled_calls"] == 1
    assert head(runtime)["stats"]["deduped_calls"] == 1


def test_a_flush_request_carries_what_the_summarizer_needs() -> None:
    """Calls carry key, tool, arguments, error flag, size, hash, a 2,000-char head and the
    truncation count, the seq of the original, and their ref; batches their turn and text."""
    pi = Pi()
    pi.header()
    pi.user()
    pi.assistant(("a", "bash", {"command": "make"}), text="Building.")
    result = pi.result("a", "bash", size=5000, is_error=True)
    pi.reply()
    runtime = run(pi)
    [envelope] = runtime.log["flush-requests"]
    request = read_request(envelope)
    assert request.request_id == f"{SID}:{envelope.seq}" and request.trigger == "message-end"
    assert request.frontier_before is None and request.model == "offline"
    [batch] = request.batches
    assert (batch.turn_index, batch.assistant_text, batch.disposition) == (
        0,
        "Building.",
        "summarize",
    )
    [call] = batch.calls
    text = result.payload.entry["message"]["content"][0]["text"]
    assert call.arguments == {"command": "make"} and call.is_error
    assert call.raw_chars == len(text) and call.head == text[:2000]
    assert call.truncated_chars == len(text) - 2000
    assert call.seq == result.seq and call.ref == "t1"
    assert request.metrics.frontier_gap_tokens > 0


# --- the rescan is the definition ----------------------------------------------------------


IDS = ["a", "b", "c"]


def _path(call_id: str) -> str:
    return "/w/skills/x/a.md" if call_id == "c" else f"/w/{call_id}"  # "c" is protected


ops = st.lists(
    st.one_of(
        st.just(("user",)),
        st.tuples(st.just("assistant"), st.lists(st.sampled_from(IDS), min_size=1, max_size=3)),
        st.tuples(st.just("result"), st.sampled_from(IDS), st.sampled_from([40, 700, 1200])),
        st.tuples(
            st.just("turn"),
            st.lists(st.sampled_from(IDS), min_size=1, max_size=3),
            st.sampled_from([40, 700, 1200]),
        ),
        st.tuples(st.just("reply"), st.booleans()),
        st.just(("reload",)),
        st.just(("flush",)),
    ),
    max_size=30,
)


def _events(pi: Pi, op: tuple[Any, ...]) -> list[Any]:
    """The envelopes one generated operation publishes."""
    if op[0] == "user":
        return [pi.user()]
    if op[0] == "assistant":
        return [pi.assistant(*((c, "read", {"path": _path(c)}) for c in op[1]))]
    if op[0] == "result":
        return [pi.result(op[1], "read", op[2])]
    if op[0] == "turn":
        calls = [(c, "read", {"path": _path(c)}) for c in op[1]]
        return [pi.assistant(*calls), *(pi.result(c, "read", op[2]) for c in op[1])]
    if op[0] == "reply":
        return [pi.reply(stop=None if op[1] else "aborted")]
    return [pi.reload() if op[0] == "reload" else pi.command("flush")]


def _rescan(messages: list[dict[str, Any]], session: pruning.Session) -> list[Batch]:
    """pi-condense's captureUnindexedBatchesFromSession, trimmed and grouped, from scratch."""
    batches = []
    group = 0
    turn = -1
    for position, message in enumerate(messages):
        role = message["role"]
        if role == "user":
            group += 1
        if role != "assistant":
            continue
        turn += 1
        results: dict[str, dict[str, Any]] = {}
        for later in messages[position + 1 :]:
            if later["role"] == "assistant":
                break
            if later["role"] == "toolResult":
                results.setdefault(later["toolCallId"], later)
        calls = []
        for block in message["content"]:
            if block.get("type") != "toolCall" or block["id"] not in results:
                continue
            result = results[block["id"]]
            key = f"{block['id']}@{result['timestamp']}"
            if index.is_summarized(session.store, SID, key):
                continue
            if session.protection.is_protected(block["name"], call_arguments(block)):
                continue
            calls.append(key)
        if calls:
            batches.append(Batch(turn, 0, tuple(_stub(k) for k in calls), group=group))
    summarized = windows.summarized_predicate(session)
    trimmed = trim_batches(batches, windows.frontier_of(session), summarized)
    return group_batches(trimmed, session.config.batchingMode)


def _stub(key: str) -> Call:
    return Call(key, key.split("@")[0], "read", 0, "", "", 0)


def _shape(batches: list[Batch]) -> list[tuple[int, list[str]]]:
    return [(b.turn_index, [c.key for c in b.calls]) for b in batches]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, mode=st.sampled_from(["turn", "agent-message"]), fail=st.booleans())
def test_capture_equals_the_rescan_after_every_event(
    ops: list[tuple[Any, ...]], mode: str, fail: bool
) -> None:
    """After every event, capture() holds exactly the batches a full rescan would find."""
    config = build_config({"batchingMode": mode, "minBatchChars": 500})
    summarizer = FailingSummarizer(failing={1}) if fail else OfflineSummarizer()
    pi = Pi()
    pi.header()
    store = DictStore()
    messages: list[dict[str, Any]] = []
    for envelope in (e for op in ops for e in _events(pi, op)):
        if hasattr(envelope.payload, "entry"):
            messages.append(envelope.payload.entry["message"])
        queue = list(apply(store, envelope, config))
        while queue:
            output = queue.pop(0)
            if output.kind == "flush-request":
                queue.extend(apply(store, answer_pruning(summarizer, output).envelope, config))
        session = pruning.open_session(store, SID, config)
        assert not session.busy
        assert _shape(windows.capture(session)) == _shape(_rescan(messages, session))


# --- duplicate ids and placeholders -----------------------------------------------------------


def _again(pi: Pi, original: EntryEnvelope, **fields: Any) -> EntryEnvelope:
    """A new envelope (next seq) of an entry with an id already folded: another producer's."""
    entry = {**original.payload.entry, **fields}
    envelope = EntryEnvelope(session_id=SID, seq=pi._next_seq(), payload=EntryPayload(entry=entry))
    pi.envelopes.append(envelope)
    return envelope


def test_a_second_entry_with_a_folded_id_is_refused_by_every_fold() -> None:
    """A duplicate id that reaches the folds (the reader dead-letters it; a producer may not)
    neither ends a turn, flushes, joins the branch nor adds a ledger row; the ledger notes it."""
    from sessionfold.projections.ledger.state import load_head as ledger_head

    pi = simple_session(Pi(), flushes=1)
    pi.user("next")
    first_user = next(e for e in pi.envelopes if e.payload.entry.get("type") == "message")
    reply = pi.envelopes[-2]
    plain = run(pi)
    _again(pi, first_user)  # a user message would end the open turn and add a ledger row
    _again(pi, reply, message={**reply.payload.entry["message"], "content": []})
    doubled = run(pi)
    expected = plain.session_state(SID)
    state = doubled.session_state(SID)
    assert {k: v for k, v in state.items() if k != "ledger"} == {
        k: v for k, v in expected.items() if k != "ledger"
    }
    assert doubled.log["flush-requests"] == plain.log["flush-requests"]
    before, after = ledger_head(plain.store, SID), ledger_head(doubled.store, SID)
    assert before is not None and after is not None
    assert after["n"]["u"] == before["n"]["u"]
    assert after["n"]["A"] == before["n"]["A"] + 2
    anomaly = doubled.store.get(f"{SID}/ledger/A/{after['n']['A']}")
    assert anomaly["code"] == "duplicate-id"


def test_placeholders_keep_the_branch_in_every_fold_order() -> None:
    """A placeholder (with an id, `previous`, or a gap) between entries: the entries after it
    stay on the branch, and the state is that of a neutral entry in its place."""
    for kind in ("id", "previous", "gap"):
        pi, neutral = Pi(), Pi()
        for side in (pi, neutral):
            side.header()
            side.user()
            side.turn("a1")
        middle = pi.leaf
        lost = "lost-1"
        payload = {
            "id": PlaceholderPayload(id=lost, parentId=middle, reason="r"),
            "previous": PlaceholderPayload(id=lost, previous=True, reason="r"),
            "gap": PlaceholderPayload(reason="r"),
        }[kind]
        pi.envelopes.append(
            PlaceholderEnvelope(session_id=SID, seq=pi._next_seq(), payload=payload)
        )
        node = {"type": "x-neutral", "id": lost, "parentId": middle}
        neutral.envelopes.append(
            EntryEnvelope(session_id=SID, seq=neutral._next_seq(), payload=EntryPayload(entry=node))
        )
        for side in (pi, neutral):
            side.leaf = lost
            side.turn("b1")
            side.reply()
        damaged, expected = run(pi), run(neutral)
        assert digest.head(damaged.store, SID)["n"] == 6, kind  # nothing cut
        rows = [r["id"] for r in digest.branch_rows(damaged.store, SID)]
        assert rows == [r["id"] for r in digest.branch_rows(expected.store, SID)], kind
        assert damaged.session_state(SID) == expected.session_state(SID), kind
