"""What a table value costs in memory: its own length, not the encoder's buffer.

orjson (3.12 and later) hands back bytes that keep a buffer of at least 4 KiB, however short the
JSON; a fold worker's table keeps ~100 rows per session for the session's life, so each value must
be stored in an allocation of its own size (issue #13: a worker's RSS for 1,000 sessions).
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from faust_fakes import FakeTable

from sessionfold.streams.kafka.table_store import MemoryBackend
from sessionfold.streams.worker.app import FaustBackend

ROWS = 2_000
#: Bytes a short row may hold in the table: its length plus a bytes object's header, with room.
MOST_PER_ROW = 256


def _held_per_row(write: Callable[[str, bytes], Awaitable[Any]], data: dict[str, bytes]) -> float:
    """Bytes `data` frees per row when it drops `ROWS` short orjson-encoded rows written to it."""

    async def write_all() -> None:
        for n, value in enumerate(values):
            await write(f"s{n}/pr/m/{n}", value)

    tracemalloc.start()  # before the encoding: only blocks allocated while tracing are seen
    try:
        values = [orjson.dumps({"n": n, "role": "toolResult"}) for n in range(ROWS)]
        asyncio.run(write_all())
        values.clear()  # the encoder's own objects go; only what the table holds stays
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        assert len(data) == ROWS
        data.clear()
        gc.collect()
        return (held - tracemalloc.get_traced_memory()[0]) / ROWS
    finally:
        tracemalloc.stop()


def test_memory_backend_keeps_a_row_in_its_own_size() -> None:
    data: dict[str, bytes] = {}
    backend = MemoryBackend(data)
    per_row = _held_per_row(lambda k, v: backend.write(k, v, 0), data)
    assert per_row < MOST_PER_ROW, f"{per_row:.0f} bytes per row"


def test_faust_backend_keeps_a_row_in_its_own_size() -> None:
    table = FakeTable()
    backend = FaustBackend(table, direct=True)  # type: ignore[arg-type]

    async def write(k: str, v: bytes) -> None:
        await backend.write(k, v, 0)
        table.data.pop(f"{k.split('/')[0]}/rt/c/0")  # the session's changelog position row
        table.app.producer.sent.clear()  # the fake producer's record of sends is not the table
        table.app.producer.pending.clear()

    per_row = _held_per_row(write, table.data)
    assert per_row < MOST_PER_ROW, f"{per_row:.0f} bytes per row"


def test_memory_backend_groups_keep_a_row_in_its_own_size() -> None:
    data: dict[str, bytes] = {}
    backend = MemoryBackend(data)

    async def write(k: str, v: bytes) -> None:
        await backend.write_groups([[(k, v)], [(f"{k}/b", v)]], 0)
        data.pop(f"{k}/b")

    per_row = _held_per_row(write, data)
    assert per_row < MOST_PER_ROW, f"{per_row:.0f} bytes per row"


def test_faust_backend_groups_keep_a_row_in_its_own_size() -> None:
    """A record batch's rows too (a fold commit writes every row this way)."""
    table = FakeTable()
    backend = FaustBackend(table, direct=True)  # type: ignore[arg-type]

    async def write(k: str, v: bytes) -> None:
        await backend.write_groups([[(k, v)], [(f"{k}/b", v)]], 0)
        table.data.pop(f"{k}/b")
        table.data.pop(f"{k.split('/')[0]}/rt/c/0")  # the session's changelog position row
        # The fake's record of the batches and their acknowledgements (whose callbacks hold the
        # writes) are not the table.
        table.app.producer._producer.batches.clear()
        table.app.producer.pending.clear()

    per_row = _held_per_row(write, table.data)
    assert per_row < MOST_PER_ROW, f"{per_row:.0f} bytes per row"
