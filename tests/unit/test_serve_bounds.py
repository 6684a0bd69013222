"""A request's memory and time are bounded in `sessionfold serve` (docs/live.md, "Faults"): a
body past its route's bound is answered 413 without being read whole, and never reaches the fold
process; a connection that does not send its headers, or its body, within `--read-timeout` is
closed."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
from serve_process import Serve, fold_process, serving

from sessionfold.streams.tools.synthetic import generate_session, write_session

#: The context route's bound and a small route's (live_contract.MAX_CONTEXT_BODY_BYTES and
#: MAX_SMALL_BODY_BYTES, spelled out so that the test runs against a serve without them).
MAX_CONTEXT_BODY_BYTES = 32 * 1024 * 1024
MAX_SMALL_BODY_BYTES = 64 * 1024
TOKEN = "t" * 32
AUTH = f"Authorization: Bearer {TOKEN}\r\n"
#: The read timeout the slow-client test asks for, seconds.
READ_TIMEOUT_S = 1.0
#: How many oversize bodies, per route, the memory test sends.
OVERSIZE = 3
#: Each one's size: past the context route's bound (and far past the others').
OVERSIZE_BYTES = MAX_CONTEXT_BODY_BYTES + 8 * 1024 * 1024
#: How much a process' peak resident memory may grow while they are refused, besides the one
#: context body the API process reads up to its bound before it refuses it.
GROWTH_BOUND = 16 * 1024 * 1024


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Serve, str]]:
    """A serve over one session file, with a short read timeout; the session's id."""
    source = write_session(tmp_path, generate_session(7, 20)).path
    watched = tmp_path / "sessions"
    watched.mkdir()
    (watched / source.name).write_bytes(source.read_bytes())
    session_id = str(orjson.loads(source.read_bytes().splitlines()[0])["id"])
    with serving(watched, TOKEN, args=["--read-timeout", str(READ_TIMEOUT_S)]) as serve:
        yield serve, session_id


def _address(serve: Serve) -> tuple[str, int]:
    url = urlsplit(serve.url)
    assert url.hostname is not None and url.port is not None
    return url.hostname, url.port


def _peak(pid: int) -> int:
    """A process' peak resident memory (VmHWM), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _status(data: bytes) -> int | None:
    """The status code of an HTTP answer's first bytes."""
    if not data.startswith(b"HTTP/1.1 "):
        return None
    return int(data[9:12])


def _chunked(serve: Serve, route: str, size: int) -> int | None:
    """POST a JSON array of `size` bytes, chunked (no length said), the way a client that
    does not stop writes it; the answer's status, None when the connection was cut first."""
    chunk = b"1," * 32768
    with socket.create_connection(_address(serve), timeout=30) as sock:
        sock.sendall(
            f"POST {route} HTTP/1.1\r\nHost: x\r\n{AUTH}Content-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        sent = 0
        answer = b""
        try:
            first = b"[" + chunk
            sock.sendall(b"%x\r\n%s\r\n" % (len(first), first))
            while sent < size:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
                if select.select([sock], [], [], 0)[0]:
                    break  # answered before the end: stop writing
            else:
                sock.sendall(b"2\r\n1]\r\n0\r\n\r\n")
            answer = sock.recv(65536)
        except (BrokenPipeError, ConnectionResetError):
            return None
        return _status(answer)


def test_oversize_bodies_are_refused_unread_and_never_reach_the_fold_process(
    served: tuple[Serve, str],
) -> None:
    """A context call declaring a body past its bound is answered 413 at its headers; bodies
    sent without a length past the context route's bound, and past a small route's, are cut
    at the bound (413). The API process' peak memory grows by one context body's bound at most,
    the fold process' hardly (before, the API process read each one whole, and the fold
    process read and parsed it again: 129 MB more for each 63 MB one)."""
    serve, session_id = served
    api, fold = serve.process.pid, fold_process(serve)
    before = _peak(api), _peak(fold)
    with socket.create_connection(_address(serve), timeout=5) as sock:
        sock.sendall(
            f"POST /sessions/{session_id}/context HTTP/1.1\r\nHost: x\r\n{AUTH}"
            f"Content-Type: application/json\r\nContent-Length: {OVERSIZE_BYTES}\r\n\r\n".encode()
        )
        assert _status(sock.recv(65536)) == 413  # answered with no byte of the body sent
    for route in ("context", "client-events", "recall"):
        for _ in range(OVERSIZE):
            status = _chunked(serve, f"/sessions/{session_id}/{route}", OVERSIZE_BYTES)
            assert status in (413, None), (route, status)
    grown = _peak(api) - before[0], _peak(fold) - before[1]
    assert grown[0] < MAX_CONTEXT_BODY_BYTES + GROWTH_BOUND and grown[1] < GROWTH_BOUND, grown
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=serve.url, headers=headers, timeout=30) as client:
        small = client.post(f"/sessions/{session_id}/client-events", json={"kind": "timeout"})
        assert small.status_code == 204
        past = client.post(
            f"/sessions/{session_id}/client-events", content=b" " * MAX_SMALL_BODY_BYTES + b"{}"
        )
        assert past.status_code == 413
        junk = client.post(f"/sessions/{session_id}/context", content=b"\xff" * 1000)
        assert junk.status_code == 400 and junk.json() == {"error": "the body is not JSON"}
        assert "sessionfold_live_calls_total" in client.get("/metrics").text
    serve.stop()


def test_slow_clients_are_closed_within_the_read_timeout(served: tuple[Serve, str]) -> None:
    """Connections that send nothing, a part of their headers, or their headers and a part of
    their body (with the token or without) are closed within `--read-timeout` (1 s here;
    before, all were still open minutes later), and serve answers meanwhile."""
    serve, session_id = served
    address = _address(serve)
    route = f"/sessions/{session_id}/context"
    starts = [
        b"",
        b"POST " + route.encode() + b" HTTP/1.1\r\nHost: x\r\n",
        b"GET /health HTTP/1.1\r\nHo",
        f"POST {route} HTTP/1.1\r\nHost: x\r\n{AUTH}Content-Length: 1000\r\n\r\n{{".encode(),
        f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{{".encode(),
        f"POST {route} HTTP/1.1\r\nHost: x\r\n{AUTH}Transfer-Encoding: chunked\r\n\r\n"
        "1\r\n".encode(),
    ]
    socks = []
    for start in starts * 5:
        sock = socket.create_connection(address, timeout=5)
        sock.sendall(start)
        socks.append(sock)
    opened = time.monotonic()
    closed: dict[int, float] = {}
    try:
        assert httpx.get(f"{serve.url}/health", timeout=5).status_code == 200
        while len(closed) < len(socks) and time.monotonic() - opened < READ_TIMEOUT_S + 4:
            ready, _, _ = select.select([s for s in socks if s.fileno() not in closed], [], [], 0.1)
            for sock in ready:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                if not data:
                    closed[sock.fileno()] = time.monotonic() - opened
    finally:
        for sock in socks:
            sock.close()
    assert len(closed) == len(socks), f"{len(socks) - len(closed)} of {len(socks)} still open"
    assert max(closed.values()) < READ_TIMEOUT_S + 2, closed
    serve.stop()
