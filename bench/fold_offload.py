"""The Kafka fold's steps in a worker thread against the same steps on the event loop.

    .venv/bin/python bench/fold_offload.py [--repeat 3]

Folds both real sessions through `FoldRuntime` over an in-memory table (batches of 100, as the
agent commits them): every step on the loop, the large records' steps in a thread (what the
worker does), every step in a thread; prints the ratios to the first.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from runtime_layer import memory_runtime

from sessionfold.events.envelope import encode
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.worker.agents import (
    OFFLOAD_BYTES,
    SourceRecord,
)

SESSIONS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sessions"
REAL = ("before-compaction.jsonl", "large-session.jsonl")
TOPICS = Topics("bench.")


def records() -> list[SourceRecord]:
    """Every envelope of the real sessions as session-events records."""
    out = []
    for name in REAL:
        for envelope in read_session_file(SESSIONS / name):
            if not isinstance(envelope, DeadLetter):
                key = envelope.session_id.encode()
                out.append(SourceRecord(TOPICS.session_events, 0, len(out), key, encode(envelope)))
    return out


async def fold_all(batch: list[SourceRecord], offload: int | None) -> None:
    """Fold `batch` through a fresh runtime, committing every 100 records."""

    runtime, _sent = memory_runtime(TOPICS, ledger=None)
    runtime.offload_bytes = offload
    for n, record in enumerate(batch, 1):
        await runtime.fold(record)
        if n % 100 == 0:
            await (await runtime.commit())
    await (await runtime.commit())


def best_of(repeat: int, batch: list[SourceRecord], offload: int | None) -> float:
    """The fastest of `repeat` runs, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        asyncio.run(fold_all(batch, offload))
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per figure (best kept)")
    args = parser.parse_args()
    batch = records()
    inline = best_of(args.repeat, batch, offload=None)
    large = best_of(args.repeat, batch, offload=OFFLOAD_BYTES)
    every = best_of(args.repeat, batch, offload=0)
    big = sum(len(r.value or b"") >= OFFLOAD_BYTES for r in batch)
    print(f"records: {len(batch)}, of {OFFLOAD_BYTES} bytes or more: {big}")
    print(f"all inline            {inline:8.3f} s")
    print(f"large ones offloaded  {large:8.3f} s  {large / inline:.2f}x inline (the worker's)")
    print(f"every one offloaded   {every:8.3f} s  {every / inline:.2f}x inline")


if __name__ == "__main__":
    main()
