"""A model that answers far too much, on the real broker: a worker whose summarizer faces a 50 MB
answer still completes the session as the embedded runtime does, and an answer the producer or
the broker refuses for its size goes out as a small error answer instead of stopping the agent.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from conftest import unique_topic_prefix
from fake_openai import FakeOpenAI, huge
from kafka.admin import ConfigResource, ConfigResourceType
from kafka_workers import WorkerProcess, generate_fleet, publish_tree, wait_converged
from prometheus_client import CollectorRegistry

from sessionfold.events.envelope import PruningRequestEnvelope, decode, encode
from sessionfold.events.flush import read_compaction, read_request
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.ports.summarizer import OfflineSummarizer
from sessionfold.ports.summarizer_http import summarizer_for
from sessionfold.streams.kafka import clients
from sessionfold.streams.kafka.table_store import Output
from sessionfold.streams.kafka.topic_reader import read_topic
from sessionfold.streams.kafka.topics import Topics, ensure_topics
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file, session_files
from sessionfold.streams.runtime.config_files import load_config
from sessionfold.streams.runtime.embedded import EmbeddedRuntime
from sessionfold.streams.runtime.step import Answerer
from sessionfold.streams.worker.agents import SourceRecord, SummarizeRuntime
from sessionfold.streams.worker.prometheus import create

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

HUGE = 50 * 1024 * 1024


def test_a_worker_facing_a_50_mb_answer_completes_the_session(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Every model answer is 50 MB: the worker's summarizer reads 4 MiB of each and answers the
    batch `failed` (`too-large`) in a small record; no barrier stays up, nothing is held, and the
    state is the embedded runtime's against the same model, byte for byte."""
    root = generate_fleet(tmp_path / "sessions", 1, 30, seed=5)
    paths = list(session_files([root]))
    config_path = tmp_path / "pruning.toml"
    config_path.write_text('summarizerModel = "vllm/runaway"\n')
    config = load_config(config_path, [])
    with FakeOpenAI(default=huge(HUGE)) as fake:
        env = {"SESSIONFOLD_MODEL_BASE_URL": fake.base_url}
        embedded = EmbeddedRuntime(config, summarizer=summarizer_for(config, env=env))
        for path in paths:
            for record in read_session_file(path):
                assert not isinstance(record, DeadLetter)
                embedded.publish(record)
        expected = {sid: embedded.session_state(sid, 0) for sid in embedded.sessions()}
        embedded_calls = len(fake.requests)
        assert embedded_calls > 0
        prefix = unique_topic_prefix()
        topics = Topics(prefix)
        publish_tree(kafka_bootstrap, prefix, 1, [root], tmp_path / "publish.json")
        worker = WorkerProcess(
            kafka_bootstrap,
            prefix,
            "all",
            1,
            tmp_path,
            env={**env, "SESSIONFOLD_CONFIG": str(config_path)},
        )
        try:
            worker.start()
            worker.wait_web()
            wait_converged([worker], worker.url, expected, timeout=240)
        finally:
            worker.stop()
    answers = [r.value for r in read_topic(kafka_bootstrap, topics.compaction_events)]
    pruning = [a for a in answers if orjson.loads(a)["kind"] == "compaction"]
    assert pruning and max(len(a) for a in answers) < 64 * 1024
    errors = {r.error for a in pruning for r in read_compaction(decode(a)).results}  # type: ignore[arg-type]
    assert "too-large" in errors
    assert len(fake.requests) == 2 * embedded_calls  # each runtime asked once per batch


def _runaway_request(tmp_path: Path) -> PruningRequestEnvelope:
    """A flush request with a batch for the model."""
    root = generate_fleet(tmp_path / "one", 1, 40, seed=5)
    runtime = EmbeddedRuntime()
    for path in session_files([root]):
        for record in read_session_file(path):
            runtime.publish(record)
    return next(
        e
        for e in runtime.log["flush-requests"]
        if isinstance(e, PruningRequestEnvelope)
        and any(b.disposition == "summarize" for b in read_request(e).batches)
    )


class PaddedPort:
    """The offline summaries, each padded by `size` characters (under the step's 1 MiB)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def summarize(self, request: Any) -> Any:
        compaction = OfflineSummarizer().summarize(request)
        results = tuple(
            r.model_copy(update={"text": (r.text or "") + "x" * self.size})
            if r.outcome == "summarized"
            else r
            for r in compaction.results
        )
        return compaction.model_copy(update={"results": results})


@pytest.mark.parametrize("refused_by", ["producer", "broker"])
def test_an_answer_refused_for_its_size_goes_out_as_a_small_error(
    kafka_bootstrap: str, tmp_path: Path, refused_by: str
) -> None:
    """A 300 KB compaction over the producer's max_request_size (refused at send) or over the
    topic's max.message.bytes (refused in the acknowledgement): the agent does not die, and the
    compaction topic gets one small error answer to the request."""
    request = _runaway_request(tmp_path)
    prefix = unique_topic_prefix()
    topics = Topics(prefix)
    ensure_topics(kafka_bootstrap, topics, 1)
    limit = 64 * 1024
    if refused_by == "broker":
        admin = clients.admin(kafka_bootstrap, "sessionfold-test")
        try:
            admin.alter_configs(
                [
                    ConfigResource(
                        ConfigResourceType.TOPIC,
                        topics.compaction_events,
                        configs={"max.message.bytes": str(limit)},
                    )
                ]
            )
        finally:
            admin.close()

    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap,
            max_request_size=limit if refused_by == "producer" else 4 * 1024 * 1024,
        )
        await producer.start()
        try:

            async def send(output: Output) -> Any:
                return await producer.send(output.topic, output.value, key=output.key)

            answerer = Answerer(PaddedPort(300_000), OfflineModel())
            agent = SummarizeRuntime(answerer, send, topics, create(CollectorRegistry()))
            key = request.session_id.encode()
            record = SourceRecord(topics.flush_requests, 0, 0, key, encode(request))
            await (await agent.handle(record))
        finally:
            await producer.stop()

    asyncio.run(run())
    [record] = list(read_topic(kafka_bootstrap, topics.compaction_events))
    assert len(record.value) < 4096
    payload = read_compaction(decode(record.value))  # type: ignore[arg-type]
    assert payload.error == "unsendable:too-large" and payload.results == ()
    assert payload.request_id == read_request(request).request_id
