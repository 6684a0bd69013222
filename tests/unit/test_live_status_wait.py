"""The status route at pi's leaf (issue #40): `GET /sessions/{id}/status?leaf=ID&wait_ms=N`
answers once the leaf is folded (and its flush answered), so the extension's footer shows the
state the turn left, not the one before serve read its last lines."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import orjson
from aiohttp.test_utils import TestClient, TestServer

from sessionfold.streams.runtime.live import LiveFolds
from sessionfold.streams.tools.synthetic import generate_session, write_session
from sessionfold.streams.web.live_api import LiveApi


def _state(document: dict[str, Any]) -> tuple[Any, Any]:
    return document["pending_batches"], document["metrics"]


def test_a_status_at_a_leaf_waits_for_its_fold(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    source = write_session(tmp_path / "src", generate_session(5, 12)).path
    lines = source.read_bytes().splitlines(keepends=True)
    session_id = str(orjson.loads(lines[0])["id"])
    # The state after each prefix of the file, folded line by line.
    (tmp_path / "ref").mkdir()
    ref_file = tmp_path / "ref" / "s.jsonl"
    ref_file.write_bytes(b"")
    reference = LiveFolds([tmp_path / "ref"])
    reference.discover()
    states: list[tuple[Any, Any] | None] = []
    for line in lines:
        with ref_file.open("ab") as handle:
            handle.write(line)
        reference.poll()
        known = session_id in reference.sessions
        states.append(_state(reference.document(session_id)) if known else None)
    # A line whose fold moves the status (pending batches or metrics).
    k = next(i for i in range(2, len(lines)) if states[i] != states[i - 1] and states[i - 1])
    leaf = str(orjson.loads(lines[k])["id"])

    (tmp_path / "live").mkdir()
    live_file = tmp_path / "live" / "s.jsonl"
    live_file.write_bytes(b"".join(lines[:k]))
    live = LiveFolds([tmp_path / "live"])
    live.discover()
    live.poll()
    assert _state(live.document(session_id)) == states[k - 1]
    stop = threading.Event()
    # A tailer that polls every 30 s unless a call wants a line: the status must ask for it.
    tailer = threading.Thread(target=live.follow, args=(stop, 30.0), daemon=True)

    async def run() -> None:
        api = LiveApi(live, wait_s=5.0)
        async with TestClient(TestServer(api.app(None))) as client:
            tailer.start()
            await asyncio.sleep(0.2)  # its first poll is done; it sleeps now
            with live_file.open("ab") as handle:
                handle.write(lines[k])
            started = time.monotonic()
            answer = await client.get(
                f"/sessions/{session_id}/status", params={"leaf": leaf, "wait_ms": "3000"}
            )
            assert answer.status == 200
            status = await answer.json()
            assert time.monotonic() - started < 2.5
            assert (status["pending"], status["metrics"]) == states[k]
            # Without a leaf it answers at once, as before; a bad wait is a 400.
            plain = await (await client.get(f"/sessions/{session_id}/status")).json()
            assert plain["footer"] == status["footer"]
            bad = await client.get(
                f"/sessions/{session_id}/status", params={"leaf": leaf, "wait_ms": "nan"}
            )
            assert bad.status == 400

    try:
        asyncio.run(run())
    finally:
        stop.set()
        live.wanted.set()
        tailer.join(10)
    live.close(5)
