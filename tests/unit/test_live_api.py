"""The live API's context route in process (aiohttp's test server over `LiveFolds`): what it
costs. pi's whole array fits in a call, a waiting call wakes when its leaf is folded (not at
its next look), and a call repeated before anything new is folded renders nothing again; the
plan route answers a 304 for the plan a gateway names."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.streams.cli.context import view_from_replay
from sessionfold.streams.runtime.live import LiveFolds
from sessionfold.streams.tools.replay import Collector, replay_files
from sessionfold.streams.tools.synthetic import generate_session, write_session
from sessionfold.streams.web import live_api
from sessionfold.streams.web.live_api import LiveApi


def _grown(tmp_path: Path, turns: int) -> tuple[Path, list[bytes], str]:
    source = write_session(tmp_path, generate_session(9, turns)).path
    lines = source.read_bytes().splitlines(keepends=True)
    (tmp_path / "live").mkdir()
    target = tmp_path / "live" / source.name
    target.write_bytes(b"")
    return target, lines, str(orjson.loads(lines[0])["id"])


def _served(live: LiveFolds, test: Callable[[TestClient[Any, Any]], Awaitable[None]]) -> None:
    async def run() -> None:
        async with TestClient(TestServer(LiveApi(live, wait_s=5).app(None))) as client:
            await test(client)

    asyncio.run(run())


def test_an_array_past_a_mebibyte_is_answered(tmp_path: Path) -> None:
    """pi sends its whole context every call: 3 MB of it is read, not refused with 413."""
    live = LiveFolds([tmp_path])
    messages = [{"role": "user", "content": "x" * 1000}] * 3000

    async def test(client: TestClient[Any, Any]) -> None:
        body = {"leaf": "a", "messages": messages, "wait_ms": 0}
        answer = await client.post("/sessions/nobody/context", data=orjson.dumps(body))
        assert answer.status == 200
        assert (await answer.json())["reason"] == "unknown-session"

    _served(live, test)


def test_a_waiting_call_wakes_when_its_leaf_is_folded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the look-again step far longer than the test, the answer still comes as soon as
    another thread's poll folds the leaf: the poll wakes the call."""
    monkeypatch.setattr(live_api, "WAIT_STEP_S", 60.0)
    target, lines, session_id = _grown(tmp_path, 3)
    target.write_bytes(b"".join(lines[:-1]))
    live = LiveFolds([tmp_path / "live"])
    live.discover()
    live.poll()
    leaf = str(orjson.loads(lines[-1])["id"])

    def later() -> None:
        time.sleep(0.3)
        with target.open("ab") as handle:
            handle.write(lines[-1])
        live.poll()

    async def test(client: TestClient[Any, Any]) -> None:
        threading.Thread(target=later).start()
        started = time.monotonic()
        body = {"leaf": leaf, "messages": [], "wait_ms": 30_000}
        answer = await client.post(f"/sessions/{session_id}/context", json=body)
        assert (await answer.json())["stale"] is False
        assert 0.3 <= time.monotonic() - started < 10

    _served(live, test)


def test_the_tailer_wakes_the_loop_only_for_a_session_a_call_waits_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines of a session nobody waits for never hop onto the event loop (each hop costs the
    loop a turn at the GIL: at a fleet's line rate that starved the calls); the waiting call's
    session is woken once its leaf is folded."""
    woken: list[str] = []
    wake = LiveApi._wake

    def counted(self: LiveApi, session_id: str) -> None:
        woken.append(session_id)
        wake(self, session_id)

    monkeypatch.setattr(LiveApi, "_wake", counted)
    target, lines, session_id = _grown(tmp_path, 3)
    (tmp_path / "other").mkdir()
    other = write_session(tmp_path / "other", generate_session(10, 3)).path
    other_lines = other.read_bytes().splitlines(keepends=True)
    other_target = tmp_path / "live" / other.name
    other_target.write_bytes(other_lines[0])
    target.write_bytes(b"".join(lines[:-1]))
    live = LiveFolds([tmp_path / "live"])
    live.discover()
    live.poll()
    leaf = str(orjson.loads(lines[-1])["id"])

    def later() -> None:
        for line in other_lines[1:]:  # the other session grows, line by line
            with other_target.open("ab") as handle:
                handle.write(line)
            live.poll()
        time.sleep(0.2)
        with target.open("ab") as handle:
            handle.write(lines[-1])
        live.poll()

    async def test(client: TestClient[Any, Any]) -> None:
        threading.Thread(target=later).start()
        body = {"leaf": leaf, "messages": [], "wait_ms": 30_000}
        answer = await client.post(f"/sessions/{session_id}/context", json=body)
        assert (await answer.json())["stale"] is False

    _served(live, test)
    assert woken == [session_id]


def test_a_repeated_call_renders_once_and_answers_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two calls at the same leaf: one render, the second answered without a thread (it does
    not queue behind other sessions' renders), the same answer, the CLI's messages; a line
    folded since renders again."""
    target, lines, session_id = _grown(tmp_path, 40)
    target.write_bytes(b"".join(lines))
    live = LiveFolds([tmp_path / "live"])
    live.discover()
    live.poll()
    renders = 0
    view = live.view

    def counted(session: str) -> Any:
        nonlocal renders
        renders += 1
        return view(session)

    monkeypatch.setattr(live, "view", counted)
    threads: list[str] = []  # the thread of each call that went past the kept render
    rendered = live.rendered

    def counted_rendered(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return rendered(*args)

    monkeypatch.setattr(live, "rendered", counted_rendered)
    collector = Collector(session_id)
    replayer = replay_files([target], DEFAULT_CONFIG, [session_id], on_folded=collector)
    cli = view_from_replay(replayer, collector, DEFAULT_CONFIG)
    assert cli.pruned
    leaf = str(orjson.loads(lines[-1])["id"])
    body = {"leaf": leaf, "messages": cli.unpruned}

    async def test(client: TestClient[Any, Any]) -> None:
        first = await client.post(f"/sessions/{session_id}/context", json=body)
        again = await client.post(f"/sessions/{session_id}/context", json=body)
        # the kept answer is given on the loop, no queue; the render ran on the render thread
        assert renders == 1 and len(threads) == 1
        assert threads[0].startswith("sessionfold-render")
        raw = await first.read()
        assert raw == await again.read()
        answer = orjson.loads(raw)
        assert answer["changed"] and answer["tokens"] == cli.tokens
        assert orjson.dumps(answer["messages"]) == orjson.dumps(cli.messages)
        assert raw == orjson.dumps(answer)  # the spliced bytes are the whole answer's encoding
        with target.open("ab") as handle:
            handle.write(lines[-1].replace(leaf.encode(), b"feedbeef"))  # one more entry
        live.poll()
        await client.post(f"/sessions/{session_id}/context", json=body)
        assert renders == 2 and len(threads) == 2

    _served(live, test)


def test_an_unknown_session_asks_for_a_rescan_and_is_answered_after_the_grace(
    tmp_path: Path,
) -> None:
    """A call for a session no tailed file holds yet asks the tailer to look for new files
    (here a tailer that discovers only when asked) and is answered once its file is folded; a
    session no file holds is answered `unknown-session`, not stale, after the short grace."""
    target, lines, session_id = _grown(tmp_path, 4)
    target.write_bytes(b"".join(lines))
    live = LiveFolds([tmp_path / "live"], journals=False)
    stop = threading.Event()

    def tailer() -> None:  # serve's, minus its periodic discovery
        while not stop.is_set():
            if live.rescan.wait(0.01):
                live.rescan.clear()
                live.discover()
                live.poll()

    async def test(client: TestClient[Any, Any]) -> None:
        leaf = orjson.loads(lines[-1])["id"]
        body = {"leaf": leaf, "messages": [], "wait_ms": 20_000}
        answer = await (await client.post(f"/sessions/{session_id}/context", json=body)).json()
        assert answer["reason"] == "mismatch" and answer["stale"] is False
        started = time.monotonic()
        answer = await (await client.post("/sessions/nobody/context", json=body)).json()
        assert answer["reason"] == "unknown-session" and answer["stale"] is False
        assert live_api.UNKNOWN_GRACE_S <= time.monotonic() - started < 5

    thread = threading.Thread(target=tailer)
    thread.start()
    try:
        _served(live, test)
    finally:
        stop.set()
        thread.join()


def test_the_plan_route_answers_a_304_while_the_plan_named_is_the_plan(tmp_path: Path) -> None:
    """The plan carries its tag (`ETag`); asked with it the route answers a 304 without a body
    until a fold changes the plan, then the new plan whole; an unknown session's plan too."""
    target, lines, session_id = _grown(tmp_path, 40)
    half = len(lines) // 2
    target.write_bytes(b"".join(lines[:half]))
    live = LiveFolds([tmp_path / "live"])
    live.discover()
    live.poll()

    async def test(client: TestClient[Any, Any]) -> None:
        seen: list[bytes] = []
        for cut in (half, len(lines)):
            if cut != half:
                target.write_bytes(b"".join(lines))
                live.poll()
            first = await client.get(f"/sessions/{session_id}/plan")
            body, tag = await first.read(), first.headers["ETag"]
            assert first.status == 200 and orjson.loads(body)["known"]
            again = await client.get(f"/sessions/{session_id}/plan", headers={"If-None-Match": tag})
            assert again.status == 304 and await again.read() == b""
            assert again.headers["ETag"] == tag
            seen.append(body)
        assert seen[0] != seen[1]  # the second half changed the plan
        stale = await client.get(f"/sessions/{session_id}/plan", headers={"If-None-Match": tag})
        assert stale.status == 304
        other = await client.get(
            f"/sessions/{session_id}/plan", headers={"If-None-Match": '"something-else"'}
        )
        assert other.status == 200 and await other.read() == seen[1]
        unknown = await client.get("/sessions/nobody/plan")
        assert orjson.loads(await unknown.read()) == {
            "session": "nobody",
            "known": False,
            "results": {},
            "chains": [],
        }

    _served(live, test)
