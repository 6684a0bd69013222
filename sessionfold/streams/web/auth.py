"""Who may read a worker's web server: a bearer token, loopback by default, quiet bad requests.

The state API serves every session's state and the original tool outputs, which hold whatever
the agent read (secrets included), so:
- with a token configured (`--api-token`, `SESSIONFOLD_API_TOKEN`, `--api-token-file`), every
  route but `OPEN_PATHS` (`/metrics`, which carries counts only, and `/health`) answers 401
  without `Authorization: Bearer <token>`; the token is compared in constant time;
- without one the server answers everyone who can reach it, which is why workers bind
  127.0.0.1 by default and `exposure_warning` names a wider bind without a token;
- a request aiohttp's parser refuses (a request line or header longer than its 8190-byte
  limit, say) is answered 400 by aiohttp and logged as one line naming the error class
  (`QuietBadRequests`): aiohttp would log a traceback whose message quotes the offending line,
  which may hold a session id or the token itself.

Requests one worker proxies to the partition owner (Faust's router, state_api.py) carry the
caller's headers, token included, so every fold worker of an app must run with the same token.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # aiohttp comes with Faust: the commands without a worker do not load it
    from aiohttp import web

#: Routes served without the token: neither carries session content.
OPEN_PATHS = frozenset({"/metrics", "/health"})
#: The model API routes of serve's gateway, which check the token themselves.
GATEWAY_PREFIX = "/v1/"
#: Addresses that mean "every interface".
ALL_ADDRESSES = frozenset({"", "0.0.0.0", "::"})
#: The realm named in 401 answers.
REALM = "sessionfold"
#: Shortest token a worker or client accepts.
MIN_TOKEN_CHARS = 16
#: The header a gateway call carries serve's token in (the agent's `Authorization` holds its
#: provider key).
GATEWAY_TOKEN_HEADER = "X-Sessionfold-Token"


class TokenProblem(ValueError):
    """An API token that cannot be used; the message says why, never the token."""


def read_token(token: str | None, path: Path | None) -> str | None:
    """The API token from a value or a file (not both), stripped; None for none."""
    if token is not None and path is not None:
        raise TokenProblem("--api-token and --api-token-file exclude each other")
    if path is not None:
        try:
            token = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenProblem(f"cannot read the API token file: {type(exc).__name__}") from None
    if token is None:
        return None
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise TokenProblem(
            f"the API token must be at least {MIN_TOKEN_CHARS} characters, no spaces"
        )
    return token


Handler = Callable[["web.Request"], Awaitable["web.StreamResponse"]]


def is_loopback(address: str) -> bool:
    """Whether binding `address` keeps the server reachable from this machine only."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name, or every address
        return False


def exposure_warning(bind: str, token: str | None) -> str | None:
    """Why binding `bind` without a token exposes session content, or None if it does not."""
    if token is not None or is_loopback(bind):
        return None
    where = "every address" if bind in ALL_ADDRESSES else bind
    return (
        f"the state API listens on {where} without a token: anyone who can reach the port "
        "can read every session and its tool outputs (set SESSIONFOLD_API_TOKEN or "
        "--api-token-file)"
    )


def token_matches(header: str | None, token: str) -> bool:
    """Whether an `Authorization` header carries the bearer `token` (constant-time compare).

    Any header that is not one (no scheme, no token, bytes that are not UTF-8) is a plain no:
    aiohttp hands undecodable bytes over as surrogate escapes, which a strict encode refused
    with a 500 on every protected route.
    """
    if header is None:
        return False
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    try:
        presented = value.strip().encode("utf-8", "surrogateescape")  # the bytes as sent
    except UnicodeError:  # a lone surrogate no byte escaped to: no token's
        return False
    return hmac.compare_digest(presented, token.encode())


def unauthorized(presented: bool) -> web.Response:
    """A 401 with `WWW-Authenticate: Bearer` (RFC 6750) and a JSON error body."""
    from aiohttp import web

    challenge = f'Bearer realm="{REALM}"'
    if presented:
        challenge += ', error="invalid_token"'
    return web.json_response(
        {"error": "unauthorized"}, status=401, headers={"WWW-Authenticate": challenge}
    )


def token_middleware(token: str | None) -> Any:
    """An aiohttp middleware asking every route but `OPEN_PATHS` for the token (none: open).

    It runs before Faust's views, so a request without the token is refused by the worker it
    reaches, before any is proxied to the partition owner.
    """
    from aiohttp import web

    @web.middleware
    async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        if token is None or request.path in OPEN_PATHS or request.path.startswith(GATEWAY_PREFIX):
            # the gateway's calls carry the agent's own key in Authorization: they show the
            # token in a header of their own, checked by the gateway (gateway.py)
            return await handler(request)
        header = request.headers.get("Authorization")
        if token_matches(header, token):
            return await handler(request)
        return unauthorized(presented=header is not None)

    return require_token


class QuietBadRequests(logging.Filter):
    """Turns aiohttp's traceback for a request its parser refused into one line of codes.

    The exception's message quotes the refused line (a path with a session id, a header with
    the token), so the record keeps only its class name, and no arguments or traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite a bad-request record in place; every record is kept."""
        from aiohttp.http_exceptions import BadHttpMessage

        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, BadHttpMessage):
            record.msg = "refused a malformed HTTP request: %s"
            record.args = (type(error).__name__,)
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def quiet_bad_requests(logger: logging.Logger | None = None) -> None:
    """Install `QuietBadRequests` on aiohttp's server logger (once)."""
    logger = logger or logging.getLogger("aiohttp.server")
    if not any(isinstance(f, QuietBadRequests) for f in logger.filters):
        logger.addFilter(QuietBadRequests())


__all__ = [
    "GATEWAY_TOKEN_HEADER",
    "MIN_TOKEN_CHARS",
    "OPEN_PATHS",
    "QuietBadRequests",
    "TokenProblem",
    "exposure_warning",
    "is_loopback",
    "quiet_bad_requests",
    "read_token",
    "token_matches",
    "token_middleware",
    "unauthorized",
]
