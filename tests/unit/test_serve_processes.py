"""`sessionfold serve`'s two processes (cli/serve.py, web/live_front.py): the API process
answers a caught-up context call from what the fold process handed over, without it; a fold
process that dies stops serve with an error, never leaving it half alive; a dead API process
takes the fold process with it; a stop waits `--shutdown-grace` for the answers with the model."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from serve_process import Serve, fold_process, serving

from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.streams.cli.context import view_from_replay
from sessionfold.streams.cli.serve import FOLD_NICE
from sessionfold.streams.tools.replay import Collector, replay_files
from sessionfold.streams.tools.synthetic import generate_session, write_session
from sessionfold.streams.worker.fault_injection import ENV_TEST_DELAY

TOKEN = "t" * 32
#: The shutdown grace the stop test asks for, seconds (the default is 30).
GRACE_S = 2.0
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Serve, str, list[bytes], Path]]:
    """A serve process over one session file written whole; the session's id and lines."""
    source = write_session(tmp_path, generate_session(7, 40)).path
    lines = source.read_bytes().splitlines(keepends=True)
    watched = tmp_path / "sessions"
    watched.mkdir()
    path = watched / source.name
    path.write_bytes(b"".join(lines))
    with serving(watched, TOKEN) as serve:
        yield serve, str(orjson.loads(lines[0])["id"]), lines, path


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if status == "Z":  # exited, not yet waited for by its parent
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.05)
    return False


def test_a_caught_up_call_is_answered_without_the_fold_process(
    served: tuple[Serve, str, list[bytes], Path],
) -> None:
    """With the fold process stopped (SIGSTOP), a call repeated at a folded leaf still gets
    the same bytes, in the form asked before; a form not asked yet, a leaf not folded and any
    other route wait for the fold process, and get its answer once it runs again."""
    serve, session_id, lines, path = served
    fold = fold_process(serve)
    leaf = orjson.loads(lines[-1])["id"]
    route = f"/sessions/{session_id}/context"
    shape = [[m["role"], m.get("toolCallId")] for m in _pi_array(path, session_id)]
    with httpx.Client(base_url=serve.url, headers=AUTH, timeout=30) as client:
        asked = {"leaf": leaf, "shape": shape, "answer": "patch", "wait_ms": 20_000}
        first = client.post(route, json=asked)  # the fold process renders, and hands it over
        assert first.json()["changed"] is True and "patch" in first.json()
        os.kill(fold, signal.SIGSTOP)
        try:
            started = time.monotonic()
            again = client.post(route, json=asked)
            assert time.monotonic() - started < 2
            assert again.content == first.content
            anywhere = client.post(route, json={**asked, "leaf": None}).json()
            assert anywhere == {**first.json(), "leaf": None}
            for waits in (
                {**asked, "answer": "messages"},  # not encoded yet
                {**asked, "leaf": "not-folded", "wait_ms": 0},
            ):
                with pytest.raises(httpx.ReadTimeout):
                    client.post(route, json=waits, timeout=1)
            with pytest.raises(httpx.ReadTimeout):
                client.get(f"/sessions/{session_id}/status", timeout=1)
        finally:
            os.kill(fold, signal.SIGCONT)
        whole = client.post(route, json={**asked, "answer": "messages"}).json()
        assert whole["changed"] is True and "messages" in whole
        assert client.get(f"/sessions/{session_id}/status").json()["known"] is True
    serve.stop()


def _nice(pid: int, tid: int) -> int:
    """A thread's nice value (/proc's stat, field 19)."""
    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


def test_the_fold_process_folds_below_the_api_process_priority_but_its_loop(
    served: tuple[Serve, str, list[bytes], Path],
) -> None:
    """The fold process' event loop (its main thread: it answers the relayed calls and hands
    renders over) keeps the API process' priority; every other thread of it (the tailer, the
    render thread, the compact route's ledger pass, the answers) runs `FOLD_NICE` below."""
    serve, session_id, _lines, _path = served
    with httpx.Client(base_url=serve.url, headers=AUTH, timeout=30) as client:
        context = client.post(f"/sessions/{session_id}/context", json={"leaf": None, "shape": []})
        assert context.status_code == 200  # rendered on the render thread
        compact = client.post(f"/sessions/{session_id}/compact", json={})
        assert compact.status_code == 200  # a ledger pass on the loop's executor
    fold = fold_process(serve)
    api = serve.process.pid
    base = os.nice(0)
    threads = {int(tid): _nice(fold, int(tid)) for tid in os.listdir(f"/proc/{fold}/task")}
    assert threads.pop(fold) == base  # the main thread: the loop
    assert len(threads) >= 3  # the tailer, the render thread, the executor's
    assert set(threads.values()) == {min(19, base + FOLD_NICE)}
    assert {_nice(api, int(tid)) for tid in os.listdir(f"/proc/{api}/task")} == {base}
    serve.stop()


def _pi_array(path: Path, session_id: str) -> list[dict[str, Any]]:
    """pi's own array for the file as it is (the unpruned context)."""
    collector = Collector(session_id)
    replayer = replay_files([path], DEFAULT_CONFIG, [session_id], on_folded=collector)
    return view_from_replay(replayer, collector, DEFAULT_CONFIG).unpruned


def test_a_dead_fold_process_stops_serve_with_an_error(
    served: tuple[Serve, str, list[bytes], Path],
) -> None:
    """SIGKILL the fold process: serve exits non-zero at once, saying so in one line."""
    serve, session_id, _lines, _path = served
    fold = fold_process(serve)
    with httpx.Client(base_url=serve.url, headers=AUTH, timeout=30) as client:
        assert client.get(f"/sessions/{session_id}/status").status_code == 200
    os.kill(fold, signal.SIGKILL)
    _, err = serve.process.communicate(timeout=20)
    assert serve.process.returncode == 1
    assert b"the fold process ended (exit code -9): serve stops" in err
    assert b"Traceback" not in err
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{serve.url}/health", timeout=2)


def _children(pid: int) -> list[int]:
    """A process' children (serve's: the fold process and multiprocessing's resource tracker)."""
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


#: How soon a process of serve's ends once another is killed, seconds.
TOGETHER_S = 1.0


@contextmanager
def _asking(tmp_path: Path) -> Iterator[tuple[Serve, list[int]]]:
    """A serve whose fold process has a flush with a model that takes a minute (so a stop
    would wait its grace); its API process' children."""
    source = write_session(tmp_path, generate_session(7, 40)).path
    lines = source.read_bytes().splitlines(keepends=True)
    session_id = str(orjson.loads(lines[0])["id"])
    watched = tmp_path / "sessions"
    watched.mkdir()
    (watched / source.name).write_bytes(b"".join(lines))
    with serving(watched, TOKEN, env={ENV_TEST_DELAY: "60"}) as serve:
        asked = {"leaf": orjson.loads(lines[-1])["id"], "shape": [], "wait_ms": 200}
        with httpx.Client(base_url=serve.url, headers=AUTH, timeout=30) as client:
            deadline = time.monotonic() + 30
            while not client.post(f"/sessions/{session_id}/context", json=asked).json()["stale"]:
                assert time.monotonic() < deadline, "no flush went to the model"
        fold_process(serve)
        yield serve, _children(serve.process.pid)


def test_a_killed_api_process_takes_its_children_at_once(tmp_path: Path) -> None:
    """SIGKILL the API process while a flush is with the model: the fold process (and the
    resource tracker) end within a second, not after the answers' grace (30 s)."""
    with _asking(tmp_path) as (serve, children):
        assert len(children) >= 1
        serve.kill()
        started = time.monotonic()
        for child in children:
            assert _gone(child, TOGETHER_S + 1), child
        assert time.monotonic() - started < TOGETHER_S


def test_a_killed_fold_process_ends_serve_at_once(tmp_path: Path) -> None:
    """SIGKILL the fold process while a flush is with the model: the API process (and the
    resource tracker) end within a second."""
    with _asking(tmp_path) as (serve, children):
        fold = fold_process(serve)
        os.kill(fold, signal.SIGKILL)
        started = time.monotonic()
        serve.process.wait(TOGETHER_S + 5)
        for child in children:
            assert _gone(child, TOGETHER_S + 1), child
        assert time.monotonic() - started < TOGETHER_S
        assert serve.process.returncode == 1


@pytest.mark.parametrize("how", ["option", "env"])
def test_a_stop_waits_the_shutdown_grace_for_answers_with_the_model(
    tmp_path: Path, how: str
) -> None:
    """A flush is with a model that takes a minute: a stop waits the grace asked for (by
    option or environment), not the default 30 s, and says the answer is still out."""
    source = write_session(tmp_path, generate_session(7, 40)).path
    lines = source.read_bytes().splitlines(keepends=True)
    session_id = str(orjson.loads(lines[0])["id"])
    watched = tmp_path / "sessions"
    watched.mkdir()
    (watched / source.name).write_bytes(b"".join(lines))
    env = {ENV_TEST_DELAY: "60"}
    args: list[str] = []
    if how == "option":
        args = ["--shutdown-grace", str(GRACE_S)]
    else:
        env["SESSIONFOLD_SERVE_SHUTDOWN_GRACE"] = str(GRACE_S)
    with serving(watched, TOKEN, args=args, env=env) as serve:
        asked = {"leaf": orjson.loads(lines[-1])["id"], "shape": [], "wait_ms": 200}
        with httpx.Client(base_url=serve.url, headers=AUTH, timeout=30) as client:
            deadline = time.monotonic() + 30
            # stale: the leaf is folded, or its lines wait, behind an answer with the model
            while not client.post(f"/sessions/{session_id}/context", json=asked).json()["stale"]:
                assert time.monotonic() < deadline, "no flush went to the model"
        started = time.monotonic()
        err = serve.stop()
        took = time.monotonic() - started
    assert GRACE_S <= took < GRACE_S + 10
    assert b"1 flush answers still out" in err
