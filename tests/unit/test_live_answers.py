"""Flush answers off the tailer (runtime/live.py `answer_threads`): a model that is slow for one
session delays only that session. The other sessions' lines fold on and their context calls are
answered at once, not stale; the slow session's own lines wait for its answer and, once it is
back, every session's state, answers and journal are the synchronous fold's, byte for byte."""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from fake_openai import FakeOpenAI, Reply, Request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionfold.events.flush import CompactionPayload, FlushRequestPayload
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.ports.model_http import HttpModelClient, Timeouts, resolve_endpoint
from sessionfold.ports.summarizer import OfflineSummarizer
from sessionfold.ports.summarizer_http import HttpSummarizer
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.views.context import ContextView
from sessionfold.streams.cli.context import view_from_replay
from sessionfold.streams.runtime.answer_journal import journal_path
from sessionfold.streams.runtime.embedded import fold_files
from sessionfold.streams.runtime.live import LiveFolds
from sessionfold.streams.tools.replay import Collector, replay_files
from sessionfold.streams.tools.synthetic import generate_session, write_session
from sessionfold.streams.web.live_api import LiveApi
from sessionfold.streams.web.live_contract import epoch_of

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
    tailer = threading.Thread(target=live.follow, args=(stop, 0.01), daemon=True)
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


# --- the order of folds, however the answers are delayed ------------------------------------

#: Small synthetic sessions (seed, turns), each with a few flushes.
SMALL = ((5, 12), (11, 20), (9, 16))


class _Gated:
    """The offline summaries, each held until the test releases its session's gate (or opens
    every gate for good)."""

    model = OfflineSummarizer.model

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.waiting: set[str] = set()  # sessions whose call is here, held
        self._gates: dict[str, threading.Semaphore] = {}
        self._lock = threading.Lock()

    def gate(self, session_id: str) -> threading.Semaphore:
        with self._lock:
            return self._gates.setdefault(session_id, threading.Semaphore(0))

    def summarize(self, request: FlushRequestPayload) -> CompactionPayload:
        gate = self.gate(request.session_id)
        self.waiting.add(request.session_id)
        while not gate.acquire(timeout=0.01) and not self.opened.is_set():
            pass
        self.waiting.discard(request.session_id)
        return OfflineSummarizer().summarize(request)


class _Reference:
    """One session folded synchronously (inline answers), line by line: the live view's JSON
    after each count of lines, the final document and the answers journal's bytes."""

    def __init__(self, seed: int, turns: int) -> None:
        folder = Path(tempfile.mkdtemp(prefix="sessionfold-ref-"))
        source = write_session(folder, generate_session(seed, turns)).path
        self.lines = source.read_bytes().splitlines(keepends=True)
        self.session_id = str(orjson.loads(self.lines[0])["id"])
        (folder / "live").mkdir()
        target = folder / "live" / source.name
        target.write_bytes(b"")
        live = LiveFolds([folder / "live"])
        live.discover()
        self.views: list[bytes] = []
        for line in self.lines:
            with target.open("ab") as handle:
                handle.write(line)
            live.poll()
            self.views.append(orjson.dumps(live.view(self.session_id).to_json()))
        self.document = live.document(self.session_id)
        self.journal = journal_path(target).read_bytes()
        shutil.rmtree(folder)


_REFERENCES: dict[tuple[int, int], _Reference] = {}


def _reference(seed: int, turns: int) -> _Reference:
    if (seed, turns) not in _REFERENCES:
        _REFERENCES[(seed, turns)] = _Reference(seed, turns)
    return _REFERENCES[(seed, turns)]


_STEP = st.tuples(
    st.sampled_from(["write", "answer"]), st.integers(0, len(SMALL) - 1), st.integers(1, 10)
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(_STEP, min_size=10, max_size=60), threads=st.integers(1, 3))
def test_any_interleaving_of_lines_and_answers_folds_as_the_synchronous_fold(
    steps: list[tuple[str, int, int]], threads: int
) -> None:
    """Sessions grow in drawn chunks while their answers come back in a drawn order, on a pool
    of 1 to 3 threads: whenever a session is settled its view is the synchronous fold's at the
    lines written, and at the end every state, document and journal is, byte for byte."""
    references = [_reference(seed, turns) for seed, turns in SMALL]
    folder = Path(tempfile.mkdtemp(prefix="sessionfold-live-"))
    model = _Gated()
    live = LiveFolds([folder], summarizer=model, answer_threads=threads)
    files = [folder / f"{n}.jsonl" for n in range(len(SMALL))]
    written = [0] * len(SMALL)
    try:
        for kind, n, count in steps:
            reference = references[n]
            if kind == "write":
                chunk = reference.lines[written[n] : written[n] + count]
                with files[n].open("ab") as handle:
                    handle.write(b"".join(chunk))
                written[n] += len(chunk)
                live.discover()
                live.poll()
            else:
                session = live.sessions.get(reference.session_id)
                if session is None or not session.asking:
                    continue
                folds = session.folds
                model.gate(reference.session_id).release()
                # The answer comes back and is folded, unless its call is queued behind held
                # ones: then every thread ends up holding another session's call.
                _until(
                    lambda s=session, f=folds, i=reference.session_id: (  # type: ignore[misc]
                        s.folds != f or (i not in model.waiting and len(model.waiting) >= threads)
                    )
                )
            with live.lock:  # (the pool folds nothing meanwhile)
                for m, reference in enumerate(references):
                    session = live.sessions.get(reference.session_id)
                    if session is None:
                        continue
                    # Rendered (and kept) whether settled or not: a kept render of half a
                    # flush must not outlive the answer's fold.
                    rendered = live.rendered(reference.session_id, epoch_of)
                    assert rendered.settled == session.settled
                    if session.settled:
                        view = orjson.dumps(rendered.view.to_json())
                        assert view == reference.views[written[m] - 1]
        model.opened.set()
        for n, reference in enumerate(references):
            with files[n].open("ab") as handle:
                handle.write(b"".join(reference.lines[written[n] :]))
        live.discover()
        live.poll()
        assert live.close(30) == 0
        for n, reference in enumerate(references):
            session_id = reference.session_id
            assert orjson.dumps(live.view(session_id).to_json()) == reference.views[-1]
            assert live.document(session_id) == reference.document
            assert journal_path(files[n]).read_bytes() == reference.journal
    finally:
        model.opened.set()
        live.close(5)
        shutil.rmtree(folder)


class _SlowDiff:
    """The offline diff model, each pass a drawn few milliseconds late."""

    def __init__(self, seed: int) -> None:
        self._model = OfflineModel()
        self.name = self._model.name
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def diff(self, prompt: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            delay = self._random.uniform(0, 0.02)
        time.sleep(delay)
        return self._model.diff(prompt)


class _SlowSummarizer:
    """The offline summaries, each a drawn few milliseconds late."""

    model = OfflineSummarizer.model

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def summarize(self, request: FlushRequestPayload) -> CompactionPayload:
        with self._lock:
            delay = self._random.uniform(0, 0.02)
        time.sleep(delay)
        return OfflineSummarizer().summarize(request)


def test_real_sessions_with_ledger_passes_fold_as_the_synchronous_fold(
    tmp_path: Path, shared_sessions: Path
) -> None:
    """Two real sessions (one with pi compactions: ledger passes) written at once in random
    chunks, every answer late by a random few milliseconds on a pool of 3: each session's
    document (the rule ledger included) and context are `fold FILE`'s and `context FILE`'s."""
    names = ["before-compaction.jsonl", "large-session.jsonl"]
    watched = tmp_path / "live"
    watched.mkdir()
    live = LiveFolds(
        [watched], summarizer=_SlowSummarizer(1), diff_model=_SlowDiff(2), answer_threads=3
    )
    rng = random.Random(3)
    sources = [(shared_sessions / name).read_bytes() for name in names]
    targets = [watched / name for name in names]
    at = [0] * len(names)
    while any(a < len(s) for a, s in zip(at, sources, strict=True)):
        n = rng.randrange(len(names))
        cut = min(len(sources[n]), at[n] + rng.randrange(1, 60_000))
        with targets[n].open("ab") as handle:
            handle.write(sources[n][at[n] : cut])
        at[n] = cut
        live.discover()
        live.poll()
    live.poll()
    assert live.close(60) == 0
    assert len(live.sessions) == len(names)
    for target in targets:
        (session_id,) = [s.session_id for s in live.sessions.values() if s.path == target]
        assert live.document(session_id) == fold_files([target])["sessions"][session_id]
        assert orjson.dumps(live.view(session_id).to_json()) == _context_json(target, session_id)


class _Counting:
    """The offline summaries, counting the calls."""

    model = OfflineSummarizer.model

    def __init__(self) -> None:
        self.calls = 0

    def summarize(self, request: FlushRequestPayload) -> CompactionPayload:
        self.calls += 1
        return OfflineSummarizer().summarize(request)


def test_a_stop_waits_for_answers_out_within_its_bound_and_loses_none(tmp_path: Path) -> None:
    """`close` waits for an answer that comes back within its bound (everything folds, the
    journal is the synchronous fold's); past the bound it returns at once, and an answer that
    comes back later is still journaled, so the restart asks no flush twice."""
    reference = _reference(*SMALL[0])
    flushes = reference.journal.count(b"\n")
    assert flushes >= 2
    for name in ("within", "past"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "s.jsonl").write_bytes(b"".join(reference.lines))

    model = _Gated()
    live = LiveFolds([tmp_path / "within"], summarizer=model, answer_threads=2)
    live.discover()
    live.poll()
    _until(lambda: reference.session_id in model.waiting)
    threading.Timer(0.3, model.opened.set).start()
    assert live.close(30) == 0
    assert orjson.dumps(live.view(reference.session_id).to_json()) == reference.views[-1]
    assert journal_path(tmp_path / "within" / "s.jsonl").read_bytes() == reference.journal

    stuck = _Gated()
    live = LiveFolds([tmp_path / "past"], summarizer=stuck, answer_threads=2)
    live.discover()
    live.poll()
    _until(lambda: reference.session_id in stuck.waiting)
    started = time.monotonic()
    assert live.close(0.3) == 1  # the first flush's answer is still out
    assert time.monotonic() - started < 5
    journal = journal_path(tmp_path / "past" / "s.jsonl")
    assert not journal.exists()
    stuck.opened.set()  # the model answers after the stop: the answer is kept all the same
    _until(lambda: journal.exists() and journal.read_bytes().count(b"\n") >= 1)
    again = _Counting()
    restarted = LiveFolds([tmp_path / "past"], summarizer=again, answer_threads=2)
    restarted.discover()
    restarted.poll()
    assert restarted.close(30) == 0
    assert again.calls == flushes - 1  # the one answered before the restart is not asked
    assert orjson.dumps(restarted.view(reference.session_id).to_json()) == reference.views[-1]
    assert journal.read_bytes() == reference.journal


def test_an_answer_whose_fold_raises_partway_still_announces_the_session(tmp_path: Path) -> None:
    """An answer comes back, is folded, and one of the lines that waited behind it raises: the
    state moved, so `on_lines` still runs for the session (serve's API process then drops the
    render it was handed, as it does when a poll's fold raises)."""
    reference = _reference(*SMALL[0])
    session_id = reference.session_id
    model = _Gated()
    live = LiveFolds([tmp_path], summarizer=model, answer_threads=1)
    announced: list[str] = []
    try:
        (tmp_path / "a.jsonl").write_bytes(b"".join(reference.lines))
        live.discover()
        live.poll()
        session = live.sessions[session_id]
        assert session.asking and session.backlog  # lines wait behind the answer out
        live.on_lines = announced.append
        fold, folds = live.runtime.fold, 0

        def failing(record: Any) -> Any:
            nonlocal folds
            folds += 1
            if folds == 3:  # the answer, a line that waited, then this one
                raise RuntimeError("a fold failed")
            return fold(record)

        live.runtime.fold = failing  # type: ignore[method-assign]
        before = session.state()
        model.gate(session_id).release()
        _until(lambda: folds >= 3)
        _until(lambda: bool(announced))
        assert announced == [session_id] and session.state() != before
    finally:
        model.opened.set()
        live.close(5)
