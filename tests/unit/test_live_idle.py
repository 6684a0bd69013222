"""issue #39 items 5, 8, 9 and 10 (docs/live.md, "Faults"): an idle fleet of files costs the
tailer next to nothing; a restart's window answers a session whose file exists once it is
folded (that one first), not `unknown-session`; old sessions' flushes go to no paid model;
a session file outside the watched folders is tailed when a client names it under an allowed
root, or answered `not-watched` with one warning."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from fake_openai import FakeOpenAI, Reply, Request
from serve_process import serving

from sessionfold.ports.model_http import HttpModelClient, Timeouts, resolve_endpoint
from sessionfold.ports.summarizer_http import HttpSummarizer
from sessionfold.streams.logs import SESSIONS_LOGGER
from sessionfold.streams.runtime import live as live_module
from sessionfold.streams.runtime.agent_dirs import (
    agent_session_dirs,
    claude_projects_dir,
    codex_sessions_dir,
    pi_sessions_dir,
)
from sessionfold.streams.runtime.answer_journal import journal_path
from sessionfold.streams.runtime.embedded import fold_files
from sessionfold.streams.runtime.live import LiveFolds
from sessionfold.streams.tools.synthetic import generate_session, write_session
from sessionfold.streams.tools.synthetic_claude import generate_claude_session, write_claude_session
from sessionfold.streams.tools.synthetic_codex import generate_codex_session, write_codex_session
from sessionfold.streams.web.live_api import LiveApi

#: Idle files the stat-count tests watch.
IDLE_FILES = 300
#: A file appended to is folded within this, seconds (no call asking for it).
PROMPT_S = 1.5


def _copies(
    folder: Path, count: int, seed: int = 5, turns: int = 3, scratch_in: Path | None = None
) -> list[tuple[Path, str]]:
    """`count` copies of one small pi session under their own ids and pi's names."""
    folder.mkdir(parents=True, exist_ok=True)
    scratch = (folder.parent if scratch_in is None else scratch_in) / f"src-{folder.name}-{seed}"
    scratch.mkdir(exist_ok=True)
    source = write_session(scratch, generate_session(seed, turns)).path
    lines = source.read_bytes().splitlines(keepends=True)
    header = orjson.loads(lines[0])
    made = []
    for n in range(count):
        session_id = f"{n:08x}-0000-4000-8000-{n:012x}"
        path = folder / f"2026-01-01T00-00-00-000Z_{session_id}.jsonl"
        path.write_bytes(orjson.dumps({**header, "id": session_id}) + b"\n" + b"".join(lines[1:]))
        made.append((path, session_id))
    return made


@contextmanager
def _following(live: LiveFolds, poll_s: float = 0.005) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=live.follow, args=(stop, poll_s), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        live.wanted.set()
        thread.join(10)


def _until(check: Callable[[], Any], within_s: float = 30.0) -> Any:
    deadline = time.monotonic() + within_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.01)


@pytest.fixture
def stats(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the stats of session files (`*.jsonl`) made through `os.stat`."""
    counted = {"n": 0}
    real = os.stat

    def stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if str(path).endswith(".jsonl"):
            counted["n"] += 1
        return real(path, *args, **kwargs)

    monkeypatch.setattr(live_module.os, "stat", stat)
    return counted


# --- item 5: idle cost does not grow with the number of files ----------------------------------


@pytest.mark.parametrize("notify", [False, True])
def test_idle_files_are_not_stat_every_tick_and_an_append_still_folds_promptly(
    tmp_path: Path, stats: dict[str, int], notify: bool
) -> None:
    """300 idle files, a 5 ms poll: once folded, a second of idling stats each file about once
    (the scan's back-off) or hardly at all (notifications), where it was every 5 ms (60,000
    stats a second); a line appended to one is folded within a second and a half with nobody
    asking, and at once when a call waits for it (`want`)."""
    files = _copies(tmp_path / "live", IDLE_FILES)
    live = LiveFolds([tmp_path / "live"], journals=False, notify=notify)
    with _following(live):
        assert _until(lambda: len(live.sessions) == IDLE_FILES)
        time.sleep(2.5)  # the back-off reaches its ceiling
        before = stats["n"]
        time.sleep(1.0)
        per_second = stats["n"] - before
        bound = IDLE_FILES * 1.5 if not notify else IDLE_FILES * 0.5
        assert per_second < bound, per_second
        path, session_id = files[IDLE_FILES // 2]
        session = live.sessions[session_id]
        line = path.read_bytes().splitlines(keepends=True)[-1]
        entry = orjson.loads(line)
        for n, within in ((1, PROMPT_S), (2, 0.5)):
            appended = {**entry, "id": f"appended-{n}", "parentId": entry["id"]}
            with path.open("ab") as handle:
                handle.write(orjson.dumps(appended) + b"\n")
            started = time.monotonic()
            if n == 2:
                live.want(session_id)  # a call waits for the line: its file is read now
            assert _until(lambda n=n: f"appended-{n}" in session.ids, within), n
            assert time.monotonic() - started < within


def test_discovery_lists_only_folders_that_changed(tmp_path: Path, stats: dict[str, int]) -> None:
    """A discovery over an idle tree stats its folders, not its files; a file made in one is
    found."""
    _copies(tmp_path / "live" / "a", 50, scratch_in=tmp_path)
    _copies(tmp_path / "live" / "b", 50, seed=6, scratch_in=tmp_path)
    live = LiveFolds([tmp_path / "live"], journals=False)
    assert live.discover() == 100
    time.sleep(2.1)  # past the racy window of a folder's mtime
    live.discover()
    before = stats["n"]
    assert live.discover() == 0 and stats["n"] == before
    _copies(tmp_path / "live" / "c", 1, seed=7, scratch_in=tmp_path)
    assert live.discover() == 1


# --- item 8: a restart answers a session whose file exists once it is folded -------------------


def test_a_call_during_a_starts_fold_waits_for_its_file_folded_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """40 longer sessions, the one asked for sorted last: its call, made before the tailer
    starts, answers its context (not `unknown-session`), its file read through before any
    other; the start's fold logs its progress and its end."""
    watched = tmp_path / "live"
    files = _copies(watched, 40, turns=60)
    path, session_id = files[-1]
    leaf = orjson.loads(path.read_bytes().splitlines()[-1])["id"]
    live = LiveFolds([watched], journals=False)
    live.discover()  # the files are known by name, none folded yet: as at a start
    # The order files are read through, taken as the tailer goes (a count of the files folded,
    # taken once the answer was back, counted what the tailer did meanwhile: flaky under load).
    done: list[Path] = []
    poll_tail = live._poll_tail

    def recording(tail: Any, slice_s: float | None) -> int:
        read = poll_tail(tail, slice_s)
        if tail.seen is not None and tail.path not in done:
            done.append(tail.path)
        return read

    live._poll_tail = recording  # type: ignore[method-assign]

    async def run() -> dict[str, Any]:
        api = LiveApi(live, wait_s=30)
        async with TestClient(TestServer(api.app(None))) as client:
            body = {"leaf": leaf, "shape": [], "wait_ms": 30_000}
            call = asyncio.ensure_future(client.post(f"/sessions/{session_id}/context", json=body))
            while path not in live._urgent_paths:  # the call waits for the file
                await asyncio.sleep(0.005)
            with _following(live):
                answer: dict[str, Any] = await (await call).json()
                assert _until(lambda: len(live.sessions) == 40)
                assert _until(lambda: len(live.tails) == len(done))
                await asyncio.sleep(0.1)
            return answer

    with caplog.at_level(logging.INFO, logger=SESSIONS_LOGGER):  # shown on serve's stderr
        answer = asyncio.run(run())
    assert answer["reason"] == "mismatch" and answer["stale"] is False  # folded: pi's [] differs
    assert done.index(path) == 0, done.index(path)
    said = [r.getMessage() for r in caplog.records]
    assert "live: the files found are folded" in said


def test_a_session_in_an_unnamed_file_is_known_by_its_header_before_its_fold(
    tmp_path: Path,
) -> None:
    """A file whose name says no id (`a.jsonl`): its header, read once at discovery, tells a
    call which file to wait for."""
    watched = tmp_path / "live"
    watched.mkdir()
    path = write_session(watched, generate_session(8, 4)).path.rename(watched / "a.jsonl")
    session_id = str(orjson.loads(path.read_bytes().splitlines()[0])["id"])
    live = LiveFolds([watched], journals=False)
    live.discover()
    assert live.holder(session_id) == path and session_id not in live.sessions
    live.poll()
    assert live.holder(session_id) is None and session_id in live.sessions


# --- item 9: the first start bills no old session ----------------------------------------------


def _summarizer(server: FakeOpenAI) -> HttpSummarizer:
    endpoint = resolve_endpoint("primary", base_url=server.base_url, env={})
    timeouts = Timeouts(idle_s=20, ceiling_s=40, connect_s=2.0)
    return HttpSummarizer(HttpModelClient(endpoint, timeouts=timeouts, retry_wait_s=0.0))


def _session(folder: Path, seed: int, age_s: float) -> tuple[Path, str]:
    folder.mkdir(parents=True, exist_ok=True)
    path = write_session(folder, generate_session(seed, 40)).path
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))
    return path, str(orjson.loads(path.read_bytes().splitlines()[0])["id"])


def _settled(live: LiveFolds) -> None:
    live.discover()
    for _ in range(3):
        live.poll()
        assert live.settle(30) == 0


def test_old_sessions_flushes_go_to_no_paid_model(tmp_path: Path) -> None:
    """A day-old session's flushes are answered offline (no request reaches the HTTP model),
    journaled, and its state is the one `sessionfold fold FILE` gives with that journal; a
    session written now, and an old one a client asked for, send theirs to the model."""
    with FakeOpenAI(default=lambda _r: Reply(text="- a paid summary", usage=(10, 3))) as server:
        live = LiveFolds(
            [tmp_path / "live"],
            summarizer=_summarizer(server),
            answer_threads=2,
            live_within_s=600,
        )
        old, old_id = _session(tmp_path / "live", 5, age_s=86_400)
        _settled(live)
        assert len(server.requests) == 0
        assert journal_path(old).exists()  # answered, offline, kept
        assert live.document(old_id) == fold_files([old])["sessions"][old_id]
        _new, new_id = _session(tmp_path / "live", 6, age_s=0)
        _settled(live)
        paid = len(server.requests)
        assert paid > 0 and new_id in live.sessions
        asked, asked_id = _session(tmp_path / "elsewhere", 7, age_s=86_400)
        live.asked(asked_id)  # asked before its file is found
        os.replace(asked, tmp_path / "live" / asked.name)
        _settled(live)
        assert len(server.requests) > paid
        live.close(5)


def _requests_counted(_request: Request) -> Reply:
    return Reply(text="- a paid summary", usage=(10, 3))


# --- item 10: sessions outside the watched folders ----------------------------------------------


def test_the_agents_session_dirs_follow_their_settings(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    assert pi_sessions_dir(env) == tmp_path / ".pi/agent/sessions"
    assert claude_projects_dir(env) == tmp_path / ".claude/projects"
    assert codex_sessions_dir(env) == tmp_path / ".codex/sessions"
    env = {
        "HOME": str(tmp_path),
        "PI_CODING_AGENT_DIR": "/x/pi",
        "CLAUDE_CONFIG_DIR": "/x/claude",
        "CODEX_HOME": "/x/codex",
    }
    assert agent_session_dirs(env) == [
        Path("/x/pi/sessions"),
        Path("/x/claude/projects"),
        Path("/x/codex/sessions"),
    ]


def test_a_named_session_file_under_an_allowed_root_is_tailed_else_not_watched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A call naming its `sessionFile` under an allowed root (not watched) is answered from
    its fold; one outside every root, or a link in a root to a file outside, answers
    `not-watched` at once, with one warning per file however often it is asked."""
    watched = tmp_path / "live"
    watched.mkdir()
    root = tmp_path / "pi-elsewhere"
    inside, inside_id = _session(root, 5, age_s=0)
    outside, outside_id = _session(tmp_path / "nowhere", 6, age_s=0)
    link = root / f"link-{outside.name}"
    link.symlink_to(outside)
    live = LiveFolds([watched], journals=False, allowed_roots=[root])

    async def run() -> None:
        api = LiveApi(live, wait_s=30)
        async with TestClient(TestServer(api.app(None))) as client:
            with _following(live):

                async def context(session_id: str, path: Path) -> dict[str, Any]:
                    body = {"leaf": None, "shape": [], "sessionFile": str(path), "wait_ms": 20_000}
                    sent = await client.post(f"/sessions/{session_id}/context", json=body)
                    return dict(await sent.json())

                answer = await context(inside_id, inside)
                assert answer["reason"] == "mismatch" and answer["stale"] is False
                for path in (outside, outside, link, link):
                    started = time.monotonic()
                    answer = await context(outside_id, path)
                    assert answer["reason"] == "not-watched" and answer["changed"] is False
                    assert time.monotonic() - started < 1
                bad = await client.post(
                    f"/sessions/{outside_id}/context", json={"shape": [], "sessionFile": 3}
                )
                assert bad.status == 400

    with caplog.at_level(logging.WARNING):
        asyncio.run(run())
    warned = [r for r in caplog.records if "not watched" in r.getMessage()]
    assert [r.why for r in warned] == ["outside-roots", "outside-roots"]  # type: ignore[attr-defined]
    assert outside_id not in live.sessions and inside_id in live.sessions


TOKEN = "t" * 32


def test_serve_watches_pi_coding_agent_dir_by_default(tmp_path: Path) -> None:
    """`PI_CODING_AGENT_DIR` set, no path: serve tails its `sessions` folder (it watched
    ~/.pi/agent/sessions whatever the variable said)."""
    agent = tmp_path / "agent"
    _path, session_id = _session(agent / "sessions" / "--cwd--", 5, age_s=0)
    env = {"PI_CODING_AGENT_DIR": str(agent), "HOME": str(tmp_path / "home")}
    with serving(None, TOKEN, env=env) as serve:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=serve.url, headers=headers, timeout=30) as client:
            body = {"leaf": None, "shape": [], "wait_ms": 20_000}
            answer = client.post(f"/sessions/{session_id}/context", json=body).json()
            assert answer["reason"] == "mismatch", answer
        serve.stop()


def test_serve_watches_claude_code_and_codex_folders_by_default(tmp_path: Path) -> None:
    """No path: serve folds the sessions in `CLAUDE_CONFIG_DIR/projects` and
    `CODEX_HOME/sessions` too (it tailed pi's folder only, so the gateway rewrote nothing)."""
    claude = generate_claude_session(3, 6)
    write_claude_session(tmp_path / "claude" / "projects", claude)
    rollout = generate_codex_session(4, 6)
    write_codex_session(tmp_path / "codex" / "sessions" / "2026" / "12" / "06", rollout)
    env = {
        "HOME": str(tmp_path / "home"),
        "CLAUDE_CONFIG_DIR": str(tmp_path / "claude"),
        "CODEX_HOME": str(tmp_path / "codex"),
    }
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with serving(None, TOKEN, env=env) as serve:
        with httpx.Client(base_url=serve.url, headers=headers, timeout=30) as client:
            for session in (claude.session, str(rollout[0]["payload"]["id"])):
                deadline = time.monotonic() + 30
                while (status := client.get(f"/sessions/{session}").status_code) == 404:
                    assert time.monotonic() < deadline, f"serve never folded {session}"
                    time.sleep(0.1)
                assert status == 200
        serve.stop()
