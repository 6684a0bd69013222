"""serve never blocks on a stderr nobody reads: a supervisor that pipes serve's stderr and
never drains it (a pipe holds 64 KB, here 4 KB) must not stall the fold. Its log lines wait in
a thread of their own, none is lost once the pipe is read, and past a bound they are dropped
and counted."""

from __future__ import annotations

import fcntl
import json
import secrets
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from serve_process import serving

from sessionfold.streams import logs
from sessionfold.streams.tools.synthetic import generate_session, write_session

F_SETPIPE_SZ = 1031  # Linux's fcntl for a pipe's size (not in Python's fcntl module)
BAD_LINES = 400  # a dead letter warning each: about 49 KB of log


def test_a_full_stderr_pipe_never_stalls_the_fold(tmp_path: Path) -> None:
    watched = tmp_path / "sessions"
    watched.mkdir()
    token = secrets.token_urlsafe(24)
    with serving(watched, token) as serve:
        assert serve.process.stderr is not None
        fcntl.fcntl(serve.process.stderr.fileno(), F_SETPIPE_SZ, 4096)
        header = {"type": "session", "version": 3, "id": "bad", "timestamp": "2026-12-06T00:00:00Z"}
        lines = [json.dumps({**header, "cwd": "/x"})] + [f"not json {n}" for n in range(BAD_LINES)]
        (watched / "bad.jsonl").write_text("\n".join(lines) + "\n")
        time.sleep(1.0)  # the tailer reads it: its warnings fill the pipe
        written = write_session(watched, generate_session(7, 6))
        session = json.loads(written.path.read_text().splitlines()[0])["id"]
        auth = {"Authorization": f"Bearer {token}"}
        deadline = time.monotonic() + 20
        known = False
        while not known and time.monotonic() < deadline:
            try:
                answer = httpx.get(
                    f"{serve.url}/sessions/{session}/status", headers=auth, timeout=5
                )
                known = answer.status_code == 200 and answer.json()["known"]
            except httpx.TimeoutException:
                pass
            time.sleep(0.1)
        assert known, "the good session was never folded: the fold blocked on its log"
        err = serve.stop()  # reads the pipe: every held line comes out
    assert err.count(b"WARNING: dead letter") == BAD_LINES


class _Stuck:
    """A stderr that takes nothing until released, then keeps what it is given."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.text: list[str] = []

    def write(self, text: str) -> int:
        self.released.wait()
        self.text.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_lines_past_the_bound_are_dropped_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A logging thread never waits on the writer: past `MAX_HELD_LINES` held, a line is
    dropped, and the count follows the lines once stderr takes them again."""
    stuck = _Stuck()
    monkeypatch.setattr(sys, "stderr", stuck)
    monkeypatch.setattr(logs, "MAX_HELD_LINES", 50)
    writer = logs._StderrWriter()
    writer.put("first\n")
    time.sleep(0.2)  # the writer has taken it and waits on stderr
    started = time.monotonic()
    for n in range(60):
        writer.put(f"line {n}\n")
    assert time.monotonic() - started < 1.0
    assert writer.dropped == 10
    stuck.released.set()
    assert writer.flush(5.0)
    text = "".join(stuck.text)
    assert text.count("line ") == 50 and "first" in text
    assert text.endswith("WARNING: log lines dropped: stderr was not read dropped=10\n")
