"""The web server's guard (streams/web/auth.py) on a real aiohttp server: the bearer token on
every route but /metrics and /health, loopback by default, and refused requests logged without
their text.
The same guard on real workers, with forwarding between them: tests/integration/test_state_auth.py.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pydantic import ValidationError
from typer.testing import CliRunner

from sessionfold.streams.cli import app as cli_app
from sessionfold.streams.web.auth import (
    QuietBadRequests,
    exposure_warning,
    is_loopback,
    token_matches,
    token_middleware,
)
from sessionfold.streams.worker.app import WorkerSettings, faust_options

TOKEN = "t0ken-for-the-unit-tests-0123456789"


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"path": request.path})


def _app(token: str | None) -> web.Application:
    server = web.Application(middlewares=[token_middleware(token)])
    for path in ("/metrics", "/health", "/sessions/{sid}", "/", "/router/"):
        server.router.add_get(path, _ok)
    return server


def _with_client(
    token: str | None, check: Callable[[TestClient[Any, Any]], Awaitable[None]]
) -> None:
    async def run() -> None:
        async with TestClient(TestServer(_app(token))) as client:
            await check(client)

    asyncio.run(run())


def test_every_route_but_metrics_and_health_asks_for_the_token() -> None:
    """No header or a wrong token: 401 with a Bearer challenge and a JSON error; the right
    token: 200; /metrics and /health answer without one."""

    async def check(client: TestClient[Any, Any]) -> None:
        for path in ("/sessions/s1", "/", "/router/"):
            missing = await client.get(path)
            assert missing.status == 401
            assert missing.headers["WWW-Authenticate"] == 'Bearer realm="sessionfold"'
            assert await missing.json() == {"error": "unauthorized"}
            wrong = await client.get(path, headers={"Authorization": f"Bearer {TOKEN}x"})
            assert wrong.status == 401
            assert 'error="invalid_token"' in wrong.headers["WWW-Authenticate"]
            basic = await client.get(path, headers={"Authorization": f"Basic {TOKEN}"})
            assert basic.status == 401
            right = await client.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
            assert right.status == 200
        for path in ("/metrics", "/health"):
            assert (await client.get(path)).status == 200

    _with_client(TOKEN, check)


def test_without_a_token_the_routes_are_open() -> None:
    """No token configured: everyone who reaches the server is served (loopback by default)."""

    async def check(client: TestClient[Any, Any]) -> None:
        assert (await client.get("/sessions/s1")).status == 200

    _with_client(None, check)


def test_token_matches_only_the_bearer_scheme_and_the_exact_token() -> None:
    """Case-insensitive scheme, exact token, nothing else."""
    assert token_matches(f"Bearer {TOKEN}", TOKEN)
    assert token_matches(f"bearer  {TOKEN} ", TOKEN)
    assert not token_matches(None, TOKEN)
    assert not token_matches(TOKEN, TOKEN)
    assert not token_matches(f"Bearer {TOKEN[:-1]}", TOKEN)
    assert not token_matches("Bearer ", TOKEN)


def test_loopback_binds_need_no_token_and_wider_ones_are_warned_about() -> None:
    """127.0.0.0/8, ::1 and localhost are loopback; every address or a host name is not."""
    assert all(is_loopback(a) for a in ("127.0.0.1", "127.1.2.3", "::1", "localhost"))
    assert not any(is_loopback(a) for a in ("0.0.0.0", "::", "", "10.0.0.5", "worker-1"))
    assert exposure_warning("127.0.0.1", None) is None
    assert exposure_warning("0.0.0.0", TOKEN) is None
    warning = exposure_warning("0.0.0.0", None)
    assert warning is not None and "every address" in warning
    assert "10.0.0.5" in (exposure_warning("10.0.0.5", None) or "")


def test_workers_bind_loopback_by_default_and_hide_faust_table_reads(tmp_path: Path) -> None:
    """The default bind is 127.0.0.1 (advertised as such), Faust's /table routes are off, the
    token guard is installed before the not-ready 503s, and the token never shows in the
    settings' repr."""
    settings = WorkerSettings(data_dir=tmp_path, api_token=TOKEN)
    assert settings.web_bind == "127.0.0.1"
    options = faust_options(settings)
    assert options["web_bind"] == "127.0.0.1"
    assert options["canonical_url"] == "http://127.0.0.1:6066"
    assert options["web_tables_enabled"] is False
    # The token guard first: a request without the token learns nothing (not even a 503).
    middlewares = options["web_application_options"]["middlewares"]
    assert [m.__name__ for m in middlewares] == ["require_token", "answer_503"]
    assert TOKEN not in repr(settings) and TOKEN not in str(settings.model_dump())
    assert settings.token == TOKEN
    with pytest.raises(ValidationError):
        WorkerSettings(api_token="short")


def test_the_state_command_sends_the_token(tmp_path: Path) -> None:
    """`sessionfold state` with the token (flag, variable or file) reads the session; without
    it the worker's 401 is exit 1 with a hint; a short token is a usage error."""
    seen: list[str | None] = []

    async def session(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"session_id": request.match_info["sid"]})

    async def run() -> list[Any]:
        server = web.Application(middlewares=[token_middleware(TOKEN)])
        server.router.add_get("/sessions/{sid}", session)
        async with TestServer(server) as test_server:
            url = str(test_server.make_url(""))
            token_file = tmp_path / "token"
            token_file.write_text(TOKEN + "\n")
            runner = CliRunner()
            calls = [
                ["state", "s1", "--url", url, "--json", "--api-token", TOKEN],
                ["state", "s1", "--url", url, "--json", "--api-token-file", str(token_file)],
                ["state", "s1", "--url", url, "--json"],
                ["state", "s1", "--url", url, "--json", "--api-token", "short"],
            ]
            results = [await asyncio.to_thread(runner.invoke, cli_app, c) for c in calls]
            by_env = await asyncio.to_thread(
                runner.invoke,
                cli_app,
                ["state", "s1", "--url", url, "--json"],
                env={"SESSIONFOLD_API_TOKEN": TOKEN},
            )
            return [*results, by_env]

    flag, file, none, short, env = asyncio.run(run())
    assert flag.exit_code == 0 and '"session_id": "s1"' in flag.stdout
    assert file.exit_code == 0 and env.exit_code == 0
    assert none.exit_code == 1 and "401" in none.output and "SESSIONFOLD_API_TOKEN" in none.output
    assert short.exit_code == 2
    assert seen == [f"Bearer {TOKEN}"] * 3
    assert TOKEN not in none.output


def _status(request: str, port: int) -> bytes:
    """The status code a raw request gets."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(request.encode())
        return raw.recv(200).split(b" ")[1]


def _long_requests(port: int) -> list[bytes]:
    """A request line, then a token header, each over aiohttp's 8190-byte limit."""
    line = f"GET /sessions/{'S' * 9000} HTTP/1.1\r\nHost: x\r\n\r\n"
    header = f"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}{'A' * 9000}\r\n\r\n"
    return [_status(line, port), _status(header, port)]


def _serve_long_lines(
    logger_filter: logging.Filter | None,
) -> tuple[list[bytes], list[logging.LogRecord]]:
    """Lines over aiohttp's limit, sent to a real server; the statuses and the log records."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("aiohttp.server")
    keep = Keep()
    logger.addHandler(keep)
    if logger_filter is not None:
        logger.addFilter(logger_filter)

    async def run() -> list[bytes]:
        async with TestServer(_app(TOKEN)) as server:
            assert server.port is not None
            return await asyncio.to_thread(_long_requests, server.port)

    try:
        answer = asyncio.run(run())
    finally:
        logger.removeHandler(keep)
        if logger_filter is not None:
            logger.removeFilter(logger_filter)
    return answer, records


def test_a_request_line_over_the_limit_is_a_400_logged_without_its_text() -> None:
    """aiohttp answers 400; unfiltered it logs a traceback quoting the line (the id, or a header
    with the token); filtered, one warning naming the error class."""
    statuses, raw_records = _serve_long_lines(None)
    assert statuses == [b"400", b"400"]
    raw_text = "".join(logging.Formatter().format(r) for r in raw_records)
    assert "SSSS" in raw_text and TOKEN in raw_text  # what the filter is for
    statuses, records = _serve_long_lines(QuietBadRequests())
    assert statuses == [b"400", b"400"]
    assert len(records) == 2, "each refusal is still logged"
    for record in records:
        text = logging.Formatter().format(record)
        assert "SSSS" not in text and TOKEN not in text and record.exc_info is None
        assert text == "refused a malformed HTTP request: LineTooLong"
        assert record.levelno == logging.WARNING


#: Authorization values that are not a bearer token, as raw bytes on the wire.
MALFORMED_AUTHORIZATION = (
    b"Bearer \xff",  # a byte that is not UTF-8 (a surrogate escape to aiohttp)
    b"Bearer " + TOKEN.encode() + b"\xff",
    b"\xff\xfe",  # no scheme
    TOKEN.encode(),  # no scheme, the token itself
    b"Bearer",  # no token
    b"Bearer    ",
    b"Bearer \xc3\xa9\xe2\x82\xac",  # UTF-8, not ASCII
    b"Basic \xff",
    b"Bearer " + b"\xff" * 4000,  # long, under aiohttp's line limit
    b"Bearer " + b"A" * 8000,
)


def _raw_status(port: int, path: str, authorization: bytes) -> bytes:
    """The status line a GET of `path` with this Authorization header's bytes gets."""
    request = (
        f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode()
        + b"Authorization: "
        + authorization
        + b"\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(request)
        return raw.recv(200).split(b"\r\n")[0]


def _live_apps() -> dict[str, web.Application]:
    """The guard as the workers mount it, and serve's two processes' apps."""
    from sessionfold.streams.runtime.live import LiveFolds
    from sessionfold.streams.web.live_api import LiveApi
    from sessionfold.streams.web.live_front import LiveFront

    return {
        "worker": _app(TOKEN),
        "serve-fold": LiveApi(LiveFolds([])).app(TOKEN),
        "serve-api": LiveFront("/nonexistent/fold.sock").app(TOKEN),
    }


@pytest.mark.parametrize("which", ["worker", "serve-fold", "serve-api"])
def test_a_malformed_authorization_header_is_a_401(which: str) -> None:
    """A header that is no bearer token (a byte that is not UTF-8, no scheme, no token,
    non-ASCII, long) is refused 401 like a wrong token, on every protected route; it was a 500
    (an encode of aiohttp's surrogate escapes raised in the guard)."""
    app = _live_apps()[which]
    path = "/sessions/s1" if which == "worker" else "/sessions/s1/status"

    async def run() -> list[bytes]:
        async with TestServer(app) as server:
            assert server.port is not None
            port = server.port
            return await asyncio.to_thread(
                lambda: [_raw_status(port, path, value) for value in MALFORMED_AUTHORIZATION]
            )

    statuses = asyncio.run(run())
    assert statuses == [b"HTTP/1.1 401 Unauthorized"] * len(MALFORMED_AUTHORIZATION)


def test_token_matches_refuses_bytes_that_are_not_utf8() -> None:
    """aiohttp's surrogate escapes of undecodable bytes, and lone surrogates, are no token."""
    assert not token_matches("Bearer \udcff", TOKEN)
    assert not token_matches(f"Bearer {TOKEN}\udcff", TOKEN)
    assert not token_matches("Bearer \ud800", TOKEN)
    assert not token_matches("\udcff", TOKEN)
