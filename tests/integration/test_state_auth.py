"""The state API's guard on real workers (docs/security.md): two fold workers of one app on a
two-partition topic, each bound to 127.0.0.1 by default, with the test run's API token.

- every state route refuses a request without the token or with a wrong one (401), and serves
  it with the token; /metrics and /health need none; Faust's raw /table routes are off;
- a worker asked for a session the other one owns proxies the request with the token (200),
  and the owner itself refuses it without one; the live routes' POSTs go with their bodies;
- ids over the API's limit are a 400, and a request line or a token header over aiohttp's
  8190-byte limit a 400 logged as one line, with no traceback, id or token in the log.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import unique_topic_prefix
from kafka_workers import API_TOKEN, WorkerProcess, auth, fetch_state, generate_fleet, publish_tree

from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file, session_files
from sessionfold.streams.web.state_api import MAX_ID_CHARS

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: Generous bounds against hangs (the machine is shared); nothing is timed.
READY_TIMEOUT_S = 240.0


def _wait_for(condition: Callable[[], bool], what: str, workers: list[WorkerProcess]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        for worker in workers:
            worker._check_alive()
        try:
            if condition():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    tails = "\n".join(f"--- {w.name}\n{w.log_tail(30)}" for w in workers)
    pytest.fail(f"{what} within {READY_TIMEOUT_S:.0f}s\n{tails}")


def _owner(worker: WorkerProcess, session_id: str) -> str:
    """The URL of the worker owning the session's partition, as Faust's router says."""
    response = httpx.get(f"{worker.url}/router/state/{session_id}/", headers=auth(), timeout=10)
    response.raise_for_status()
    return str(response.json()).rstrip("/")


def _each_owns_a_partition(workers: list[WorkerProcess]) -> bool:
    views = []
    for worker in workers:
        response = httpx.get(f"{worker.url}/router/", headers=auth(), timeout=10)
        if response.status_code != 200:
            return False
        owned = {url.rstrip("/") for url, topics in response.json().items() if any(topics.values())}
        views.append(owned)
    return all(view == {w.url for w in workers} for view in views)


def _listening_addresses(port: int) -> set[str]:
    """Local addresses of the sockets listening on `port` (IPv4 and IPv6, /proc/net)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def _raw_status(port: int, request: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        raw.sendall(request.encode())
        return raw.recv(64).split(b" ")[1]


def _sessions(root: Path) -> list[str]:
    ids = []
    for path in session_files([root]):
        for record in read_session_file(path):
            if not isinstance(record, DeadLetter):
                ids.append(record.session_id)
                break
    return ids


def test_the_state_api_asks_for_the_token_and_forwards_it(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """401 without or with a wrong token, 200 with it, also through the non-owner; long ids
    are clean 400s; the workers listen on loopback only and never log the token."""
    prefix = unique_topic_prefix()
    generate_fleet(tmp_path / "fleet", 6, 4, seed=11)
    sessions = _sessions(tmp_path / "fleet")
    publish_tree(kafka_bootstrap, prefix, 2, [tmp_path / "fleet"], tmp_path / "publish.json")
    workers = [WorkerProcess(kafka_bootstrap, prefix, "all", 2, tmp_path, name=n) for n in "ab"]
    for worker in workers:
        worker.start()
    try:
        for worker in workers:
            worker.wait_web(READY_TIMEOUT_S)
        _wait_for(lambda: _each_owns_a_partition(workers), "no even assignment", workers)
        by_url = {w.url: w for w in workers}
        owners = {sid: _owner(workers[0], sid) for sid in sessions}
        _wait_for(
            lambda: all(fetch_state(owners[sid], sid)[0] == 200 for sid in sessions),
            "sessions not folded",
            workers,
        )
        assert set(owners.values()) == set(by_url), "both workers own sessions"
        for session_id, owner_url in owners.items():
            owner = by_url[owner_url]
            other = next(w for w in workers if w is not owner)
            _check_forwarding(session_id, owner, other)
        _check_routes(workers[0], sessions[0])
        _check_long_ids(workers[0])
        for worker in workers:
            assert _listening_addresses(worker.port) == {"0100007F"}  # 127.0.0.1 only
            log = worker.log_path.read_text(errors="replace")
            assert API_TOKEN not in log
            assert "without a token" not in log  # loopback: no exposure warning
    finally:
        for worker in workers:
            worker.stop()


def _check_forwarding(session_id: str, owner: WorkerProcess, other: WorkerProcess) -> None:
    """The non-owner proxies with the caller's token; the owner refuses a request without."""
    status, body = fetch_state(other.url, session_id)
    assert (status, body) == fetch_state(owner.url, session_id)
    assert status == 200 and "frontier" in body
    assert fetch_state(other.url, session_id, token=None)[0] == 401
    assert fetch_state(owner.url, session_id, token=None)[0] == 401
    flushes = httpx.get(f"{other.url}/sessions/{session_id}/flushes", headers=auth(), timeout=60)
    assert flushes.status_code == 200 and flushes.json()["session_id"] == session_id
    # The live routes' POSTs reach the owner with their bodies (Faust's proxy drops a body).
    live = {"context": {"leaf": None, "messages": [], "wait_ms": 60_000}, "recall": {"ids": ["t1"]}}
    for route, sent in {**live, "compact": {}}.items():
        answers = [
            httpx.post(
                f"{w.url}/sessions/{session_id}/{route}", json=sent, headers=auth(), timeout=120
            )
            for w in (other, owner)
        ]
        assert [a.status_code for a in answers] == [200, 200], (route, answers[0].text)
        assert answers[0].json() == answers[1].json(), route
    refused = httpx.post(f"{other.url}/sessions/{session_id}/recall", json=live["recall"])
    assert refused.status_code == 401
    status = httpx.get(f"{other.url}/sessions/{session_id}/status", headers=auth(), timeout=60)
    assert status.status_code == 200 and status.json()["known"] is True


def _check_routes(worker: WorkerProcess, session_id: str) -> None:
    """Every route but /metrics and /health asks for the token; /table is off."""
    wrong = {"Authorization": f"Bearer {API_TOKEN}-not"}
    for path in (
        f"/sessions/{session_id}",
        f"/sessions/{session_id}/flushes",
        f"/sessions/{session_id}/refs/t1",
        f"/sessions/{session_id}/status",
        "/router/",
        "/",
    ):
        for headers in ({}, wrong):
            refused = httpx.get(f"{worker.url}{path}", headers=headers, timeout=30)
            assert refused.status_code == 401, path
            assert refused.headers["WWW-Authenticate"].startswith('Bearer realm="sessionfold"')
            assert refused.json() == {"error": "unauthorized"}
    for path in ("/metrics", "/health"):
        assert httpx.get(f"{worker.url}{path}", timeout=30).status_code == 200
    table = httpx.get(f"{worker.url}/table/state/", headers=auth(), timeout=30)
    assert table.status_code == 404


def _check_long_ids(worker: WorkerProcess) -> None:
    """Over the API's limit: a JSON 400; over aiohttp's: a 400 and one log line, no text."""
    at_limit = httpx.get(f"{worker.url}/sessions/{'x' * MAX_ID_CHARS}", headers=auth(), timeout=30)
    assert at_limit.status_code == 404
    over: Any = httpx.get(
        f"{worker.url}/sessions/{'x' * (MAX_ID_CHARS + 1)}", headers=auth(), timeout=30
    )
    assert (over.status_code, over.json()["error"]) == (400, "id too long")
    long_ref = httpx.get(
        f"{worker.url}/sessions/s/refs/{'t' * (MAX_ID_CHARS + 1)}", headers=auth(), timeout=30
    )
    assert long_ref.status_code == 400
    header = f"Authorization: Bearer {API_TOKEN}\r\n"
    line = f"GET /sessions/{'Q' * 9000} HTTP/1.1\r\nHost: x\r\n{header}\r\n"
    padded = (
        f"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_TOKEN}{'Q' * 9000}\r\n\r\n"
    )
    assert _raw_status(worker.port, line) == b"400"
    assert _raw_status(worker.port, padded) == b"400"
    deadline = time.monotonic() + 30
    while worker.log_path.read_text(errors="replace").count("LineTooLong") < 2:
        assert time.monotonic() < deadline, worker.log_tail()
        time.sleep(0.2)
    log = worker.log_path.read_text(errors="replace")
    assert log.count("refused a malformed HTTP request: LineTooLong") == 2
    assert "Traceback" not in log and "QQQQ" not in log
    assert httpx.get(f"{worker.url}/health", timeout=30).status_code == 200  # still serving
