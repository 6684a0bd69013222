"""The Kafka fold's own code without Kafka: `FoldRuntime` over an in-memory table.

`runtime_cpu_seconds(records)` folds a fleet's records (key, value as published) the way a fold
worker does, batches of `BATCH` records committed through the journal, flush requests answered
in process after each commit and their compactions folded as compaction-events records, and
returns the process time it took. Set next to the embedded fold's process time and a fold
worker's CPU per event, it splits the worker's cost: our batches, journals and encoded rows on
one side, Faust's and aiokafka's per-record path on the other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from sessionfold.events.envelope import FlushRequestEnvelope, decode, encode
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.ports.summarizer import OfflineSummarizer
from sessionfold.projections.ledger.config import DEFAULT_LEDGER, LedgerConfig
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.streams.kafka.table_store import MemoryBackend, Output
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.runtime.step import Answerer
from sessionfold.streams.worker.agents import FoldRuntime, SessionTracker, SourceRecord
from sessionfold.streams.worker.prometheus import create

#: Records per committed batch (the fold agent's batches are about this size under load).
BATCH = 100
_TOPICS = Topics("bench.")


def memory_runtime(
    topics: Topics, ledger: LedgerConfig | None = DEFAULT_LEDGER
) -> tuple[FoldRuntime, list[Output]]:
    """A FoldRuntime over an in-memory table whose sends are acknowledged at once, and the list
    its sends land in."""
    sent: list[Output] = []

    async def send(output: Output) -> asyncio.Future[None]:
        sent.append(output)
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    table = MemoryBackend()
    metrics = create(CollectorRegistry())
    tracker = SessionTracker(table, DEFAULT_CONFIG, 1)
    runtime = FoldRuntime(table, send, topics, DEFAULT_CONFIG, metrics, tracker, ledger=ledger)
    return runtime, sent


async def _fold(records: Sequence[tuple[bytes, bytes]]) -> None:
    runtime, sent = memory_runtime(_TOPICS)
    answerer = Answerer(OfflineSummarizer(), OfflineModel())
    offset = len(records)

    async def commit_and_answer() -> None:
        nonlocal offset
        await (await runtime.commit())
        while requests := [o for o in sent if o.topic == _TOPICS.flush_requests]:
            sent.clear()
            for output in requests:
                request = decode(output.value)
                assert isinstance(request, FlushRequestEnvelope)
                offset += 1
                value = encode(answerer.answer(request).envelope)
                topic = _TOPICS.compaction_events
                await runtime.fold(SourceRecord(topic, 0, offset, output.key, value))
            await (await runtime.commit())
        sent.clear()

    for n, (key, value) in enumerate(records):
        await runtime.fold(SourceRecord(_TOPICS.session_events, 0, n, key, value))
        if (n + 1) % BATCH == 0:
            await commit_and_answer()
    await commit_and_answer()


def runtime_cpu_seconds(records: Sequence[tuple[bytes, bytes]]) -> float:
    """Process time of folding `records` through `FoldRuntime` over an in-memory table."""
    started = time.process_time()
    asyncio.run(_fold(records))
    return time.process_time() - started
