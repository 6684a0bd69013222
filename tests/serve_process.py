"""A `sessionfold serve` subprocess for tests: started on a free port with a token, stopped with
SIGTERM, its stderr kept for the test to check (no traceback, exit 0)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from sessionfold.events.envelope import EntryEnvelope
from sessionfold.streams.publishing.session_file import SessionFileReader
from sessionfold.streams.tools.broker import free_port_pair

CLI = [sys.executable, "-m", "sessionfold.streams.cli"]
START_TIMEOUT_S = 60.0


@dataclass
class Serve:
    """A running serve: its base URL, process and API token."""

    url: str
    process: subprocess.Popen[bytes]
    token: str

    def folded(self, transcript: Path) -> None:
        """Until serve has folded the agent's file as it is now (the last entry a tailing
        reader gives: a Claude Code message's lines are held until the next one; at most 5 s,
        as serve's status route waits), so that the next call's plan has the turns before it
        and no flush of the session is still with the model."""
        held = itertools.chain.from_iterable(SessionFileReader(transcript).lines(final=False))
        *_, last = (r for r in held if isinstance(r, EntryEnvelope))
        answer = httpx.get(
            f"{self.url}/sessions/{last.session_id}/status",
            params={"leaf": last.payload.entry["id"], "wait_ms": "5000"},
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=10,
        )
        assert answer.status_code == 200

    def stop(self) -> bytes:
        """SIGTERM, wait, and return its stderr (asserting a clean exit)."""
        if self.process.poll() is not None:
            return b""
        self.process.terminate()
        _, err = self.process.communicate(timeout=20)
        assert self.process.returncode == 0, err
        assert b"Traceback" not in err, err
        return err

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        self.process.kill()
        self.process.communicate(timeout=20)


@contextmanager
def serving(
    watched: Path | None,
    token: str,
    poll_ms: int = 5,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Iterator[Serve]:
    """`sessionfold serve WATCHED [ARGS]` (with `env` added to the environment; no WATCHED:
    serve's default) until the block ends; waits until /health answers."""
    port = free_port_pair()
    paths = [] if watched is None else [str(watched)]
    process = subprocess.Popen(
        [*CLI, "serve", *paths, "--port", str(port), "--poll-ms", str(poll_ms), *args],
        env={**os.environ, **(env or {}), "SESSIONFOLD_API_TOKEN": token},
        stderr=subprocess.PIPE,
    )
    serve = Serve(f"http://127.0.0.1:{port}", process, token)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            httpx.get(f"{serve.url}/health", timeout=1)
            break
        except httpx.TransportError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                _, err = process.communicate(timeout=20)
                raise AssertionError(f"serve did not start: {err.decode()[-2000:]}") from None
            time.sleep(0.05)
    try:
        yield serve
    finally:
        if process.poll() is None:
            process.terminate()
            process.communicate(timeout=20)


def fold_process(serve: Serve) -> int:
    """The pid of serve's fold process (its child that multiprocessing spawned, beside the
    resource tracker)."""
    pid = serve.process.pid
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            command = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"spawn_main" in command:
                return int(child)
        assert time.monotonic() < deadline, "serve has no fold process"
        time.sleep(0.05)
