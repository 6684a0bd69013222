"""Flush answers off the tailer (runtime/live.py `answer_threads`): a model that is slow for one
session delays only that session. The other sessions' lines fold on and their context calls are
answered at once, not stale; the slow session's own lines wait for its answer and, once it is
back, every session's state, answers and journal are the synchronous fold's, byte for byte."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from fake_openai import FakeOpenAI, Reply, Request

from sessionfold.ports.model_http import HttpModelClient, Timeouts, resolve_endpoint
from sessionfold.ports.summarizer_http import HttpSummarizer
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.views.context import ContextView
from sessionfold.streams.cli.context import view_from_replay
from sessionfold.streams.cli.serve import _tail
from sessionfold.streams.runtime.answer_journal import journal_path
from sessionfold.streams.runtime.embedded import fold_files
from sessionfold.streams.runtime.live import LiveFolds
from sessionfold.streams.tools.replay import Collector, replay_files
from sessionfold.streams.tools.synthetic import generate_session, write_session
from sessionfold.streams.web.live_api import LiveApi

#: How long the stalled answer waits for the test to release it (a test without the fix must
#: still end: then the tailer is stuck in the call that long).
STALL_S = 20.0
#: A context call of a session whose model is fast, while another's stalls, answers within this.
PROMPT_S = 5.0


def _cli_view(path: Path, session_id: str) -> ContextView:
    """`sessionfold context FILE`'s view of the file as it is (its journal folded)."""
    collector = Collector(session_id)
    replayer = replay_files([path], DEFAULT_CONFIG, [session_id], on_folded=collector)
    return view_from_replay(replayer, collector, DEFAULT_CONFIG)


def _context_json(path: Path, session_id: str) -> bytes:
    """`sessionfold context FILE --format json` for the file as it is."""
    return orjson.dumps(_cli_view(path, session_id).to_json())


def _lines(tmp_path: Path, seed: int, turns: int) -> tuple[list[bytes], str]:
    folder = tmp_path / f"src-{seed}"
    folder.mkdir()
    source = write_session(folder, generate_session(seed, turns)).path
    lines = source.read_bytes().splitlines(keepends=True)
    return lines, str(orjson.loads(lines[0])["id"])


class _Stalling:
    """The fake model's answers: the first request waits on `release`; every other one is a
    labelled summary at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.stalled = threading.Event()
        self._first = True
        self._lock = threading.Lock()

    def __call__(self, request: Request) -> Reply:
        with self._lock:
            first, self._first = self._first, False
        if first:
            self.stalled.set()
            self.release.wait(STALL_S)
        text = f"- summary of {len(request.prompt)} prompt characters"
        return Reply(text=text, usage=(400, 30))


@pytest.fixture
def stalling() -> Iterator[tuple[_Stalling, FakeOpenAI]]:
    """A real HTTP model server whose first answer stalls until released."""
    responder = _Stalling()
    with FakeOpenAI(default=responder) as server:
        yield responder, server
        responder.release.set()


def _summarizer(server: FakeOpenAI) -> HttpSummarizer:
    endpoint = resolve_endpoint("primary", base_url=server.base_url, env={})
    # Timeouts far above the stall: the answer is slow, not failed.
    timeouts = Timeouts(idle_s=STALL_S * 3, ceiling_s=STALL_S * 6, connect_s=2.0)
    return HttpSummarizer(HttpModelClient(endpoint, timeouts=timeouts, retry_wait_s=0.0))


def test_a_stalled_answer_delays_only_its_own_session(
    tmp_path: Path, stalling: tuple[_Stalling, FakeOpenAI]
) -> None:
    """Session A's flush is with a real HTTP model that holds its answer; meanwhile session B
    grows line by line, its flushes are answered, and each context call of B (through the
    route, a real tailer thread folding) answers promptly, not stale, with the CLI's render.
    A's own call waits and goes stale; A's status is answered at once (no lock is held during
    the model call). Released, A folds its answer and the lines that waited: its context and
    document are the synchronous fold's, and its journal holds the model's answer."""
    responder, server = stalling
    a_lines, a_id = _lines(tmp_path, 5, 60)
    b_lines, b_id = _lines(tmp_path, 11, 60)
    watched = tmp_path / "live"
    watched.mkdir()
    a_file, b_file = watched / "a.jsonl", watched / "b.jsonl"
    b_file.write_bytes(b_lines[0])
    live = LiveFolds([watched], summarizer=_summarizer(server), answer_threads=4)
    stop = threading.Event()
    tailer = threading.Thread(target=_tail, args=(live, 0.01, stop), daemon=True)
    tailer.start()
    try:
        _until(lambda: b_id in live.sessions)
        a_file.write_bytes(b"".join(a_lines))  # all of A at once: its first flush stalls
        assert responder.stalled.wait(10)
        _grow_b_while_a_stalls(live, a_id, b_id, b_file, b_lines)
        assert not live.sessions[a_id].settled and live.sessions[a_id].backlog
        responder.release.set()
        assert live.settle(STALL_S) == 0
    finally:
        stop.set()
        live.wanted.set()
        tailer.join(10)
        responder.release.set()
    assert live.close(5) == 0
    for path, session_id in ((a_file, a_id), (b_file, b_id)):
        assert orjson.dumps(live.view(session_id).to_json()) == _context_json(path, session_id)
        document = fold_files([path])["sessions"][session_id]
        assert live.document(session_id) == document
    for path in (a_file, b_file):
        assert b"summary of" in journal_path(path).read_bytes()  # the model's words, kept


def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _grow_b_while_a_stalls(
    live: LiveFolds, a_id: str, b_id: str, b_file: Path, b_lines: list[bytes]
) -> None:
    async def run() -> None:
        api = LiveApi(live, wait_s=PROMPT_S * 2)
        async with TestClient(TestServer(api.app(None))) as client:
            asked = changed = 0
            for line in b_lines[1:]:
                with b_file.open("ab") as handle:
                    handle.write(line)
                entry = orjson.loads(line)
                if entry.get("type") != "message" or entry["message"]["role"] != "user":
                    continue
                cli = _cli_view(b_file, b_id)  # pi's array: B's file as written so far
                started = time.monotonic()
                body = {"leaf": entry["id"], "messages": cli.unpruned, "wait_ms": PROMPT_S * 2000}
                answer = await (await client.post(f"/sessions/{b_id}/context", json=body)).json()
                took = time.monotonic() - started
                assert answer["stale"] is False and answer["reason"] != "unknown-session", took
                assert took < PROMPT_S
                asked += 1
                # What the CLI renders, byte for byte (now that the answer is journaled).
                cli = _cli_view(b_file, b_id)
                assert answer["tokens"] == cli.tokens
                if answer["changed"]:
                    changed += 1
                    assert orjson.dumps(answer["messages"]) == orjson.dumps(cli.messages)
                assert live.sessions[a_id].asking  # A's answer is still with the model
            assert asked > 5 and changed > 0  # B flushed, its answers folded, A still out
            started = time.monotonic()
            status = await client.get(f"/sessions/{a_id}/status")
            assert status.status == 200 and time.monotonic() - started < PROMPT_S
            body = {"leaf": None, "messages": [], "wait_ms": 300}
            answer = await (await client.post(f"/sessions/{a_id}/context", json=body)).json()
            assert answer["stale"] is True  # A's own call waits for A's answer

    asyncio.run(run())
