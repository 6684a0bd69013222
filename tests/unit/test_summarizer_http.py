"""HttpSummarizer against the fake server: the §6.1 prompt, §6.4 post-processing, unusable
answers, usage and cost in the compaction, the fallback model, and an outage that loses no
batch when a session is folded through the embedded runtime."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fake_openai import FakeOpenAI, Reply, Request, answer, cut_off, http_error

from sessionfold.events.envelope import EntryEnvelope, EntryPayload
from sessionfold.events.flush import FlushBatch, FlushCall, FlushRequestPayload
from sessionfold.ports.model_http import (
    HttpModelClient,
    Price,
    Timeouts,
    resolve_endpoint,
    resolve_fallback,
)
from sessionfold.ports.summarizer import OfflineSummarizer, batch_prompt
from sessionfold.ports.summarizer_http import HttpSummarizer, summarizer_for
from sessionfold.projections.pruning import digest, index
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.config import build_config
from sessionfold.streams.runtime.embedded import EmbeddedRuntime

SID = "sess-http"
FAST = Timeouts(idle_s=0.5, ceiling_s=3.0, connect_s=1.0)
_LABEL = re.compile(r"\[\[(\d+):([^\]\n]+)\]\] Tool:")


def labelled_summary(request: Request) -> Reply:
    """What a good model answers: one bullet per call, led by the call's label."""
    labels = _LABEL.findall(request.prompt)
    text = "\n".join(f"- [[{n}:{name}]] {name} call, nothing notable" for n, name in labels)
    return Reply(text=text, usage=(400, 30))


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    """A running fake server answering every unscripted request with a labelled summary."""
    with FakeOpenAI(default=labelled_summary) as server:
        yield server


def summarizer(fake: FakeOpenAI, fallback: str | None = None, **options: Any) -> HttpSummarizer:
    primary = resolve_endpoint("primary", base_url=fake.base_url, env={})
    client = HttpModelClient(
        primary,
        fallback=resolve_fallback(fallback, primary, env={}) if fallback else None,
        timeouts=FAST,
        retry_wait_s=0.0,
        prices={"primary": Price(1.0, 4.0), "backup": Price(0.5, 2.0)},
    )
    return HttpSummarizer(client, **options)


def call(call_id: str, name: str = "read", ref: str | None = None, size: int = 3_000) -> FlushCall:
    return FlushCall(
        key=f"{call_id}@1",
        tool_call_id=call_id,
        tool_name=name,
        arguments={"path": f"/w/{call_id}.ts"},
        raw_chars=size,
        content_hash="h",
        head="x" * min(size, 2_000),
        truncated_chars=max(0, size - 2_000),
        seq=1,
        ref=ref,
    )


def request(*batches: FlushBatch, thinking: str = "default") -> FlushRequestPayload:
    return FlushRequestPayload(
        request_id=f"{SID}:9",
        session_id=SID,
        seq=9,
        trigger="message-end",
        model="primary",
        thinking=thinking,
        batches=batches,
    )


def batch(*calls: FlushCall, disposition: str = "summarize") -> FlushBatch:
    return FlushBatch(
        turn_index=0,
        timestamp=0,
        assistant_text="Looking.",
        disposition=disposition,  # type: ignore[arg-type]
        calls=calls,
    )


# --- one request -------------------------------------------------------------------------------


def test_batches_are_summarized_with_refs_footer_usage_and_cost(fake: FakeOpenAI) -> None:
    """One user message per batch (§6.1); labels become refs, footer appended (§6.4); usage
    and cost per batch and in total; skips are echoed without a call."""
    fake.script(
        answer(
            "- [[1:read]] read a.ts\n- [[2:bash]] ran tests\n[[9:read]] invented", usage=(900, 50)
        )
    )
    first = batch(call("a", ref="t1"), call("b", "bash", ref="t2"))
    skipped = batch(call("c", ref="t3"), disposition="skipped-trivial")
    with summarizer(fake) as port:
        compaction = port.summarize(request(first, skipped, batch(call("d", ref="t4"))))
    one, two, three = compaction.results
    assert one.outcome == "summarized" and one.refs == ("t1", "t2")
    assert one.text is not None and one.text.startswith(
        "- `t1` read a.ts\n- `t2` ran tests\ninvented"
    )
    assert one.text.endswith(
        "---\n**Summarized tool refs**: `t1`, `t2`\n"
        "Use `context_tree_query` with these refs to retrieve the original full outputs."
    )
    assert (two.outcome, two.usage.calls) == ("skipped-trivial", 0)
    assert three.outcome == "summarized" and three.text is not None and "`t4`" in three.text
    assert (one.usage.input_tokens, one.usage.output_tokens, one.usage.calls) == (900, 50, 1)
    assert one.usage.cost == pytest.approx((900 * 1.0 + 50 * 4.0) / 1e6)
    assert compaction.usage.calls == 2
    assert compaction.usage.input_tokens == 900 + 400
    assert compaction.usage.cost == pytest.approx(one.usage.cost + three.usage.cost)
    assert compaction.model == "primary"
    assert len(fake.requests) == 2
    body = fake.requests[0].body
    assert body["messages"] == [{"role": "user", "content": batch_prompt(first)}]
    assert "reasoning_effort" not in body


def test_thinking_level_is_sent_as_reasoning_effort(fake: FakeOpenAI) -> None:
    """summarizerThinking `high` passes through; `off` and `default` send nothing."""
    with summarizer(fake) as port:
        for thinking in ("high", "off"):
            port.summarize(request(batch(call("a", ref="t1")), thinking=thinking))
    assert fake.requests[0].body["reasoning_effort"] == "high"
    assert "reasoning_effort" not in fake.requests[1].body


def test_unusable_answers_fail_their_batch(fake: FakeOpenAI) -> None:
    """A cut-off or blank answer is unusable (§6.3): failed, not retried, later batches not
    attempted (the fold keeps nothing after a failure)."""
    fake.script(cut_off("- [[1:read]] half"), answer("   \n"))
    with summarizer(fake) as port:
        cut = port.summarize(request(batch(call("a", ref="t1")), batch(call("b", ref="t2"))))
        blank = port.summarize(request(batch(call("c", ref="t3"))))
    assert [(r.outcome, r.error) for r in cut.results] == [
        ("failed", "unusable-length"),
        ("failed", "not-attempted"),
    ]
    assert cut.results[0].usage.calls == 1  # the call happened and is recorded
    assert (blank.results[0].outcome, blank.results[0].error) == ("failed", "unusable-empty")
    assert len(fake.requests) == 2


def test_an_outage_fails_batches_without_raising(fake: FakeOpenAI) -> None:
    """Server down: every model batch is answered `failed` with a code; nothing raises."""
    fake.stop()
    with summarizer(fake) as port:
        compaction = port.summarize(request(batch(call("a", ref="t1")), batch(call("b"))))
    assert [(r.outcome, r.error) for r in compaction.results] == [
        ("failed", "transport"),
        ("failed", "not-attempted"),
    ]
    assert compaction.error is None and compaction.usage.calls == 0


def test_fallback_model_summarizes_when_the_primary_fails(fake: FakeOpenAI) -> None:
    """Primary answers 503: the batch is summarized by the fallback, named in the compaction."""
    fake.script(http_error(503), model="primary")
    with summarizer(fake, fallback="backup") as port:
        compaction = port.summarize(request(batch(call("a", ref="t1"))))
    [result] = compaction.results
    assert result.outcome == "summarized"
    assert result.usage.cost == pytest.approx((400 * 0.5 + 30 * 2.0) / 1e6)
    assert compaction.model == "backup"
    assert fake.models() == ["primary", "backup"]


def test_parallel_batches_are_all_attempted(fake: FakeOpenAI) -> None:
    """With concurrency, each batch has its own call and result, in batch order."""
    batches = [batch(call(f"c{n}", ref=f"t{n}")) for n in range(1, 5)]
    with summarizer(fake, concurrency=3) as port:
        compaction = port.summarize(request(*batches))
    assert [r.outcome for r in compaction.results] == ["summarized"] * 4
    assert [r.refs for r in compaction.results] == [(f"t{n}",) for n in range(1, 5)]
    assert len(fake.requests) == 4


def test_summarizer_for_reads_the_config(fake: FakeOpenAI) -> None:
    """`offline` is the offline port; `provider/model-id` is HTTP with the config's timeouts."""
    assert isinstance(summarizer_for(build_config()), OfflineSummarizer)
    config = build_config(
        {
            "summarizerModel": "vllm/Qwen/Qwen2.5-7B",
            "summarizerIdleTimeoutMs": 1_500,
            "summarizerMaxTimeoutMs": 0,
        }
    )
    port = summarizer_for(config, env={"SESSIONFOLD_MODEL_BASE_URL": fake.base_url})
    assert isinstance(port, HttpSummarizer)
    with port:
        assert port.client.primary.model == "Qwen/Qwen2.5-7B"
        assert (port.client.timeouts.idle, port.client.timeouts.ceiling) == (1.5, None)
        assert port.summarize(request(batch(call("a", ref="t1")))).results[0].outcome == (
            "summarized"
        )
    assert fake.requests[0].model == "Qwen/Qwen2.5-7B"


# --- a session through the embedded runtime ------------------------------------------------------


class Session:
    """A pi session's envelopes, one seq per entry (the producer's line order)."""

    def __init__(self) -> None:
        self.envelopes: list[EntryEnvelope] = []
        self.leaf: str | None = None
        self.clock = 1_760_000_000_000
        self._entry({"type": "session", "version": 3, "id": SID}, header=True)

    def _entry(self, fields: dict[str, Any], header: bool = False) -> None:
        seq = len(self.envelopes) + 1
        self.clock += 1_000
        stamp = datetime.fromtimestamp(self.clock / 1000, UTC).isoformat().replace("+00:00", "Z")
        entry = fields
        if not header:
            entry = {"type": "message", "id": f"e{seq}", "parentId": self.leaf, "timestamp": stamp}
            entry.update(fields)
            self.leaf = f"e{seq}"
        payload = EntryPayload(entry=entry)
        self.envelopes.append(EntryEnvelope(session_id=SID, seq=seq, time=stamp, payload=payload))

    def user(self, text: str) -> None:
        content = [{"type": "text", "text": text}]
        self._entry({"message": {"role": "user", "content": content, "timestamp": self.clock}})

    def tools(self, *call_ids: str) -> None:
        """An assistant calling `read` once per id, and a result of 1,500 chars for each."""
        content = [
            {"type": "toolCall", "id": c, "name": "read", "arguments": {"path": f"/w/{c}.ts"}}
            for c in call_ids
        ]
        self._entry(
            {
                "message": {
                    "role": "assistant",
                    "content": content,
                    "stopReason": "toolUse",
                    "timestamp": self.clock,
                }
            }
        )
        for c in call_ids:
            body = [{"type": "text", "text": f"{c}:" + "x" * 1_500}]
            result = {
                "role": "toolResult",
                "toolCallId": c,
                "toolName": "read",
                "content": body,
                "isError": False,
                "timestamp": self.clock,
            }
            self._entry({"message": result})

    def reply(self, text: str = "done") -> None:
        content = [{"type": "text", "text": text}]
        message = {"role": "assistant", "content": content, "stopReason": "stop"}
        self._entry({"message": {**message, "timestamp": self.clock}})


def test_an_outage_loses_no_batch_in_the_embedded_runtime(fake: FakeOpenAI) -> None:
    """Server down for the first flush: it fails, the frontier stays, nothing is indexed.
    Server up again: the next flush captures the failed batches with the new ones and every
    call ends up summarized, with the model's usage and cost in the stats."""
    session = Session()
    calls = []
    for turn in range(3):
        session.user(f"task {turn}")
        ids = [f"a{turn}", f"b{turn}"]
        session.tools(*ids)
        session.tools(f"c{turn}")
        session.reply()
        calls += [*ids, f"c{turn}"]
    first_cycle = 1 + 5  # header, then user, two tool turns (2 + 1 results), reply
    first_cycle_end = first_cycle + 3
    runtime = EmbeddedRuntime(build_config(), summarizer=summarizer(fake))
    fake.stop()
    for envelope in session.envelopes[:first_cycle_end]:
        runtime.publish(envelope)
    records = pruning.flush_records(runtime.store, SID)
    assert [r["outcome"] for r in records] == ["error"]
    head = pruning.load_head(runtime.store, SID)
    assert head["frontier"] is None and head["queued"] == 2
    assert not any(index.is_summarized(runtime.store, SID, k) for k in _keys(runtime, calls))
    fake.start()
    for envelope in session.envelopes[first_cycle_end:]:
        runtime.publish(envelope)
    records = pruning.flush_records(runtime.store, SID)
    assert [r["outcome"] for r in records] == ["error", "summarized", "summarized"]
    assert records[1]["captured_batches"] == 4  # the failed two and the new two
    keys = _keys(runtime, calls)
    assert len(keys) == 9
    assert all(index.is_summarized(runtime.store, SID, k) for k in keys)
    stats = pruning.load_head(runtime.store, SID)["stats"]
    assert stats["summarized_calls"] == 9
    assert stats["calls"] == 6  # six batches, one call each
    assert stats["input_tokens"] == 6 * 400 and stats["output_tokens"] == 6 * 30
    assert stats["cost"] == pytest.approx(6 * (400 * 1.0 + 30 * 4.0) / 1e6)
    compactions = runtime.log["compaction-events"]
    assert len(compactions) == 3


def _keys(runtime: EmbeddedRuntime, call_ids: list[str]) -> list[str]:
    """The occurrence keys of the given tool calls, read from the published results."""
    keys = []
    for envelope in runtime.log["session-events"]:
        message = envelope.payload.entry.get("message") or {}
        if message.get("role") == "toolResult" and message["toolCallId"] in call_ids:
            keys.append(digest.occurrence_key(message["toolCallId"], message["timestamp"]))
    return keys
