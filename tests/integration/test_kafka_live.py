"""The live routes on a fold worker (docs/live.md), on the real broker: a generated session grows
line by line; each step is published with the Publisher to session-events and written to the
file `sessionfold serve` tails, and at every user message (where pi calls its model next):

- the worker's context answer is `sessionfold context FILE --format json` of the file cut at
  that leaf, byte for byte (messages and tokens), and serve's answer, whole;
- at the end, compact is `sessionfold ledger compact FILE --json`'s compaction, recall finds
  t1 with its original output, status carries the footer; the worker counts the calls it
  answered in `sessionfold_live_calls_total`;
- a call for a leaf not published yet waits and answers once the rest is published; past a
  short `wait_ms` it answers `stale`; an array of megabytes is read.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import unique_topic_prefix
from kafka_workers import API_TOKEN, WorkerProcess, auth, metric
from serve_process import CLI, serving

from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.streams.cli.context import view_from_replay
from sessionfold.streams.kafka.topics import Topics, ensure_topics
from sessionfold.streams.publishing.publisher import (
    Checkpoints,
    Publisher,
    make_producer,
    publish_paths,
)
from sessionfold.streams.tools.replay import Collector, replay_files
from sessionfold.streams.tools.synthetic import generate_session, write_session

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

READY_TIMEOUT_S = 240.0
#: A context call's wait: generous, the machine is shared (the call returns as soon as it can).
WAIT_MS = 120_000


class Grower:
    """A session file written a few lines at a time, each step published to session-events."""

    def __init__(self, bootstrap: str, prefix: str, source: Path, into: Path, state: Path) -> None:
        self.lines = source.read_bytes().splitlines(keepends=True)
        self.path = into / source.name
        self.path.write_bytes(b"")
        self.written = 0
        self.topics = Topics(prefix)
        self.state = state
        self.producer = make_producer(bootstrap)

    def write_upto(self, count: int) -> None:
        """Append lines up to `count` and publish them."""
        with self.path.open("ab") as handle:
            handle.write(b"".join(self.lines[self.written : count]))
        self.written = count
        publisher = Publisher(self.producer, self.topics, Checkpoints.load(self.state))
        publish_paths(publisher, [self.path])

    def close(self) -> None:
        """Close the producer."""
        self.producer.close()


def _cli_view(path: Path, session_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`sessionfold context FILE --format json` of the file now, and pi's own array there."""
    collector = Collector(session_id)
    replayer = replay_files([path], DEFAULT_CONFIG, [session_id], on_folded=collector)
    view = view_from_replay(replayer, collector, DEFAULT_CONFIG)
    return orjson.loads(orjson.dumps(view.to_json())), view.unpruned


def _user_lines(lines: list[bytes]) -> list[tuple[int, str]]:
    """(line count through it, entry id) of every user message."""
    found = []
    for number, line in enumerate(lines, start=1):
        entry = orjson.loads(line)
        if entry.get("type") == "message" and entry["message"]["role"] == "user":
            found.append((number, entry["id"]))
    return found


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A `sessionfold serve` process tailing an empty directory."""
    watched = tmp_path / "sessions"
    watched.mkdir()
    with serving(watched, API_TOKEN) as process:
        yield process.url, watched
        process.stop()  # exits 0, no traceback


@pytest.fixture
def worker(kafka_bootstrap: str, tmp_path: Path) -> Iterator[tuple[WorkerProcess, str]]:
    """One `--role all` worker on fresh topics of one partition; it and its prefix."""
    prefix = unique_topic_prefix()
    ensure_topics(kafka_bootstrap, Topics(prefix), 1)
    process = WorkerProcess(kafka_bootstrap, prefix, "all", 1, tmp_path).start()
    try:
        process.wait_web(READY_TIMEOUT_S)
        yield process, prefix
    finally:
        process.stop()


def _context(url: str, session_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST the context route (503s while the worker starts are retried)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        response = httpx.post(
            f"{url}/sessions/{session_id}/context", json=body, headers=auth(), timeout=180
        )
        if response.status_code != 503 or time.monotonic() > deadline:
            assert response.status_code == 200, response.text
            answer: dict[str, Any] = response.json()
            return answer
        time.sleep(0.5)


def test_the_worker_answers_what_serve_and_the_context_command_do(
    kafka_bootstrap: str,
    tmp_path: Path,
    worker: tuple[WorkerProcess, str],
    serve: tuple[str, Path],
) -> None:
    """At every user message the worker's context is the CLI's render and serve's answer;
    compact, recall and status answer as serve's and the CLI's do."""
    process, prefix = worker
    serve_url, watched = serve
    (tmp_path / "src").mkdir()
    source = write_session(tmp_path / "src", generate_session(5, 60)).path
    grower = Grower(kafka_bootstrap, prefix, source, watched, tmp_path / "publish.json")
    session_id = orjson.loads(grower.lines[0])["id"]
    changed = unchanged = 0
    try:
        for count, leaf in _user_lines(grower.lines):
            grower.write_upto(count)
            expected, pi_array = _cli_view(grower.path, session_id)
            body = {"leaf": leaf, "messages": pi_array, "wait_ms": WAIT_MS}
            answer = _context(process.url, session_id, body)
            assert answer["stale"] is False and answer["reason"] is None, (count, answer)
            assert orjson.dumps(answer["tokens"]) == orjson.dumps(expected["tokens"])
            if answer["changed"]:
                changed += 1
                assert orjson.dumps(answer["messages"]) == orjson.dumps(expected["messages"])
            else:
                unchanged += 1
                assert "messages" not in answer and expected["messages"] == pi_array
            served = _context(serve_url, session_id, body)
            assert orjson.dumps(answer) == orjson.dumps(served), count
        assert changed > 0 and unchanged > 0

        grower.write_upto(len(grower.lines))
        last = orjson.loads(grower.lines[-1])["id"]
        final = {"leaf": last, "messages": [], "wait_ms": WAIT_MS}
        assert _context(process.url, session_id, final)["stale"] is False
        _context(serve_url, session_id, final)
        with httpx.Client(base_url=process.url, headers=auth(), timeout=60) as client:
            compact = client.post(f"/sessions/{session_id}/compact", json={}).json()
            cli = subprocess.run(
                [*CLI, "ledger", "compact", str(grower.path), "--json"],
                capture_output=True,
                check=True,
                env={**os.environ, "SESSIONFOLD_LEDGER_LOG": "off"},
            )
            expected_compact = orjson.loads(cli.stdout)
            assert compact["status"] == "summary", compact
            assert compact["summary"] == expected_compact["payload"]["summary"]
            assert [
                {
                    "type": "compaction",
                    "summary": compact["summary"],
                    "details": compact["details"],
                },
                compact["span_record"],
            ] == expected_compact["entries"]
            served_compact = httpx.post(
                f"{serve_url}/sessions/{session_id}/compact", json={}, headers=auth(), timeout=60
            ).json()
            assert compact == served_compact

            recalled = client.post(f"/sessions/{session_id}/recall", json={"ids": ["t1", "t999"]})
            assert recalled.status_code == 200 and recalled.json()["found"] == 1
            original = client.get(f"/sessions/{session_id}/refs/t1").json()
            first_text = next(b["text"] for b in original["content"] if b["type"] == "text")
            assert first_text[:200] in recalled.json()["text"]
            served_recall = httpx.post(
                f"{serve_url}/sessions/{session_id}/recall",
                json={"ids": ["t1", "t999"]},
                headers=auth(),
                timeout=60,
            ).json()
            assert recalled.json() == served_recall

            status = client.get(f"/sessions/{session_id}/status").json()
            served_status = httpx.get(
                f"{serve_url}/sessions/{session_id}/status", headers=auth(), timeout=60
            ).json()
            assert status["known"] and status["footer"].startswith("prune: ")
            assert status == served_status

            assert client.post(f"/sessions/{session_id}/context", content=b"[1]").status_code == 400
            assert client.post("/sessions/nobody/recall", json={"ids": ["t1"]}).status_code == 404
            unknown = client.get("/sessions/nobody/status").json()
            assert unknown == {"session_id": "nobody", "known": False, "footer": "prune: ON"}
        no_token = httpx.post(f"{process.url}/sessions/{session_id}/context", json=final)
        assert no_token.status_code == 401
        for kind in ("timeout", "unreachable", "made-up"):  # the extension's fail-open reports
            report = {"fail_open": 1, "kind": kind}
            reported = httpx.post(
                f"{process.url}/sessions/{session_id}/client-events", json=report, headers=auth()
            )
            assert reported.status_code == 204
        samples = process.metrics()  # the calls the worker answered, by route and outcome
        calls = "sessionfold_live_calls_total"
        assert metric(samples, calls, route="context", outcome="changed") == changed
        assert metric(samples, calls, route="compact", outcome="200") == 1
        assert metric(samples, calls, route="recall", outcome="404") == 1
        assert metric(samples, "sessionfold_live_call_seconds_count", route="status") == 2
        fail_opens = "sessionfold_live_fail_opens_total"
        assert [metric(samples, fail_opens, kind=k) for k in ("timeout", "other")] == [1, 1]
    finally:
        grower.close()


def test_a_call_before_its_leaf_is_published_waits_for_it(
    kafka_bootstrap: str, tmp_path: Path, worker: tuple[WorkerProcess, str]
) -> None:
    """A context call naming a leaf not published yet waits, then answers the CLI's render once
    `publish` sends the rest; a leaf never published answers stale past a short wait_ms."""
    process, prefix = worker
    (tmp_path / "fleet").mkdir()
    (tmp_path / "src").mkdir()
    source = write_session(tmp_path / "src", generate_session(11, 40)).path
    grower = Grower(kafka_bootstrap, prefix, source, tmp_path / "fleet", tmp_path / "pub.json")
    session_id = orjson.loads(grower.lines[0])["id"]
    users = _user_lines(grower.lines)
    before, _ = users[len(users) // 2 - 1]
    count, leaf = users[len(users) // 2]
    try:
        grower.write_upto(before)
        warm = {"leaf": orjson.loads(grower.lines[before - 1])["id"], "messages": []}
        assert _context(process.url, session_id, {**warm, "wait_ms": WAIT_MS})["stale"] is False

        started = time.monotonic()
        short = _context(process.url, session_id, {"leaf": leaf, "messages": [], "wait_ms": 300})
        assert short["stale"] is True and short["changed"] is False
        assert 0.3 <= time.monotonic() - started < 30

        answers: list[dict[str, Any]] = []
        waiting = threading.Thread(
            target=lambda: answers.append(
                _context(
                    process.url, session_id, {"leaf": leaf, "messages": [], "wait_ms": WAIT_MS}
                )
            )
        )
        waiting.start()
        time.sleep(1.0)
        assert waiting.is_alive(), "the call did not wait for its leaf"
        grower.write_upto(count)
        waiting.join(180)
        expected, pi_array = _cli_view(grower.path, session_id)
        (answer,) = answers
        assert answer["stale"] is False
        assert orjson.dumps(answer["tokens"]) == orjson.dumps(expected["tokens"])
        again = _context(
            process.url, session_id, {"leaf": leaf, "messages": pi_array, "wait_ms": WAIT_MS}
        )
        assert again["reason"] is None
        assert orjson.dumps(again.get("messages", pi_array)) == orjson.dumps(expected["messages"])
        # pi's array of a long session is megabytes: past aiohttp's 1 MiB default, still read
        big = [{"role": "user", "content": "x" * 1024}] * 3000
        large = _context(process.url, session_id, {"leaf": leaf, "messages": big})
        assert large["reason"] == "mismatch" and large["stale"] is False
    finally:
        grower.close()
