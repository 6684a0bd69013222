"""A model that answers far too much: the answer step bounds what both runtimes fold and send,
and the summarizer agent answers whatever it cannot send with a small error answer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka_steps import StepCluster
from prometheus_client import CollectorRegistry

from sessionfold.events.envelope import (
    CompactRequestEnvelope,
    LedgerRequestEnvelope,
    PruningCompactionEnvelope,
    PruningRequestEnvelope,
    decode,
    encode,
)
from sessionfold.events.flush import (
    BatchResult,
    CompactionPayload,
    read_compaction,
    read_request,
    wrap,
)
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.ports.summarizer import OfflineSummarizer
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.streams.kafka.table_store import Output
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.runtime.embedded import COMPACTION_EVENTS, EmbeddedRuntime
from sessionfold.streams.runtime.step import (
    MAX_ANSWER_BYTES,
    OVERSIZED_ANSWER,
    Answerer,
    answer_ledger,
    fit_compaction,
    fitted_envelope,
    session_document,
)
from sessionfold.streams.tools.synthetic import generate_session, write_session
from sessionfold.streams.worker.agents import SourceRecord, SummarizeRuntime
from sessionfold.streams.worker.prometheus import create

TOPICS = Topics("t.")


class RunawayPort:
    """The offline summaries, with `size` more characters on every batch numbered in `runaway`
    (the first batch of a request by default): a model that will not stop talking."""

    def __init__(self, size: int, runaway: frozenset[int] = frozenset({0})) -> None:
        self.size = size
        self.runaway = runaway

    def summarize(self, request: Any) -> CompactionPayload:
        compaction = OfflineSummarizer().summarize(request)
        results = tuple(
            r.model_copy(update={"text": (r.text or "") + "x" * self.size})
            if r.outcome == "summarized" and r.batch in self.runaway
            else r
            for r in compaction.results
        )
        return compaction.model_copy(update={"results": results})


@pytest.fixture(scope="module")
def session_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic session long enough to flush several times."""
    return write_session(tmp_path_factory.mktemp("runaway"), generate_session(5, 40)).path


def _records(path: Path) -> list[Any]:
    return [r for r in read_session_file(path) if not isinstance(r, DeadLetter)]


def test_both_runtimes_fold_a_runaway_model_alike_and_keep_records_small(
    session_path: Path,
) -> None:
    """A 2 MB summary is never folded nor sent: the batch fails as `oversized-answer`, every
    compaction stays within the limit, the session ends with no barrier up, and the embedded
    runtime and the Kafka steps reach the same state byte for byte."""
    answerer = Answerer(RunawayPort(2 * 1024 * 1024), OfflineModel())
    embedded = EmbeddedRuntime(summarizer=answerer.port)
    cluster = StepCluster(answerer=answerer)
    for record in _records(session_path):
        embedded.publish(record)
        cluster.publish(record)
    session_id = embedded.sessions()[0]
    compactions = [
        e for e in embedded.log[COMPACTION_EVENTS] if isinstance(e, PruningCompactionEnvelope)
    ]
    assert compactions
    assert max(len(encode(e)) for e in compactions) <= MAX_ANSWER_BYTES
    errors = {r.error for e in compactions for r in read_compaction(e).results}
    assert OVERSIZED_ANSWER in errors
    head = pruning.load_head(embedded.store, session_id)
    assert (head["out"], head["held"]) == (None, [])
    kafka_state = session_document(cluster.store, session_id, DEFAULT_CONFIG)
    assert _canonical(embedded.session_state(session_id)) == _canonical(kafka_state)
    kafka_answers = [encode(cluster.answerer.answer(r).envelope) for r in cluster.logs["requests"]]
    embedded_answers = [encode(e) for e in embedded.log[COMPACTION_EVENTS]]
    assert kafka_answers == embedded_answers


def _canonical(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def test_summaries_before_the_runaway_batch_are_kept(session_path: Path) -> None:
    """Only the batch over the limit and those after it fail; earlier batches keep theirs."""
    runtime = EmbeddedRuntime(summarizer=RunawayPort(2 * 1024 * 1024, frozenset({1})))
    for record in _records(session_path):
        runtime.publish(record)
    results = [
        read_compaction(e).results
        for e in runtime.log[COMPACTION_EVENTS]
        if isinstance(e, PruningCompactionEnvelope)
    ]
    two = [r for r in results if len(r) > 1 and r[1].error == OVERSIZED_ANSWER]
    assert two, "no request had a second batch to run away on"
    assert all(r[0].outcome != "failed" for r in two)


def _compaction(sizes: list[int | None]) -> CompactionPayload:
    """A compaction with a summary of each size (None: a skipped batch)."""
    results = tuple(
        BatchResult(batch=n, outcome="skipped-trivial")
        if size is None
        else BatchResult(batch=n, outcome="summarized", text="é" * size, refs=(f"t{n}",))
        for n, size in enumerate(sizes)
    )
    return CompactionPayload(request_id="r", session_id="s", model="m", results=results)


@given(
    st.lists(st.one_of(st.none(), st.integers(0, 3_000)), max_size=8),
    st.integers(200, 20_000),
)
def test_a_fitted_compaction_keeps_the_longest_prefix_that_fits(
    sizes: list[int | None], limit: int
) -> None:
    """Within the limit, exactly: the summaries of the longest prefix that fits are kept, every
    later summary fails as `oversized-answer` (skips stay skips); None when nothing fits."""
    compaction = _compaction(sizes)
    fitted = fit_compaction(compaction, 7, limit)
    assert fitted_envelope(compaction, 7, limit) == (None if fitted is None else wrap(fitted, 7))
    if fitted is None:
        stripped = [None if s is None else -1 for s in sizes]
        assert len(encode(wrap(_failed(compaction, 0), 7))) > limit, stripped
        return
    assert len(encode(wrap(fitted, 7))) <= limit
    kept = next(
        (n for n, r in enumerate(fitted.results) if r.error == OVERSIZED_ANSWER),
        len(sizes),
    )
    assert fitted.results[:kept] == compaction.results[:kept]
    for before, after in zip(compaction.results[kept:], fitted.results[kept:], strict=True):
        if before.outcome == "summarized":
            assert (after.outcome, after.text, after.error) == ("failed", None, OVERSIZED_ANSWER)
        else:
            assert after == before
    if kept < len(sizes):  # one more summary would not have fitted
        assert len(encode(wrap(_failed(compaction, kept + 1), 7))) > limit


def _failed(compaction: CompactionPayload, kept: int) -> CompactionPayload:
    results = tuple(
        r
        if n < kept or r.outcome != "summarized"
        else BatchResult(batch=r.batch, outcome="failed", error=OVERSIZED_ANSWER)
        for n, r in enumerate(compaction.results)
    )
    return compaction.model_copy(update={"results": results})


def test_a_ledger_pass_over_the_limit_gets_a_fallback(session_path: Path) -> None:
    """A pass result over the limit is answered with a fallback that closes nothing."""
    runtime = EmbeddedRuntime()
    for record in _records(session_path):
        runtime.publish(record)
    last = max(e.seq for e in runtime.log["session-events"])
    runtime.publish(CompactRequestEnvelope(session_id=runtime.sessions()[0], seq=last + 1))
    requests = runtime.log["flush-requests"]
    request = next(e for e in requests if isinstance(e, LedgerRequestEnvelope))
    fits = answer_ledger(OfflineModel(), request)
    assert fits.outcome == "answered"
    over = answer_ledger(OfflineModel(), request, max_bytes=len(encode(fits.envelope)) - 1)
    assert over.outcome == "error"
    assert over.envelope.payload.fallback == OVERSIZED_ANSWER
    assert over.envelope.payload.request == request.payload.request


# --- the summarizer agent: what it cannot send -------------------------------------------------


def test_the_agent_answers_a_record_over_its_limit_with_a_small_error(session_path: Path) -> None:
    """An answer over the agent's record limit goes out as an error compaction that fits,
    naming the request, so the session's barrier comes down."""
    runtime = EmbeddedRuntime()
    for record in _records(session_path):
        runtime.publish(record)
    request = next(
        e
        for e in runtime.log["flush-requests"]
        if isinstance(e, PruningRequestEnvelope)
        and read_request(e).batches[0].disposition == "summarize"
    )
    sent: list[Output] = []

    async def send(output: Output) -> Any:
        sent.append(output)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    limit = 4096
    answerer = Answerer(RunawayPort(100_000), OfflineModel())
    agent = SummarizeRuntime(answerer, send, TOPICS, create(CollectorRegistry()), limit)
    key = request.session_id.encode()
    record = SourceRecord(TOPICS.flush_requests, 0, 0, key, encode(request))

    async def handle() -> None:
        await (await agent.handle(record))

    asyncio.run(handle())
    [output] = sent
    assert output.topic == TOPICS.compaction_events and len(output.value) <= limit
    answer = decode(output.value)
    assert isinstance(answer, PruningCompactionEnvelope)
    payload = read_compaction(answer)
    assert payload.error == "unsendable:too-large" and payload.results == ()
    assert payload.request_id == request.payload.request_id
