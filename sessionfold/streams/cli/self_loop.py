"""Whether a model URL is serve's own gateway: a summarizer pointed there would send every
summary call back through serve (a Claude Code user's `ANTHROPIC_BASE_URL` often is serve)."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

#: Addresses a bind on which listens on every interface.
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def calls_itself(url: str, bind: str, port: int) -> bool:
    """True when `url` reaches a server bound to `bind`:`port` on this machine.

    The ports must match (a URL without one has its scheme's); the hosts match when equal, when
    both are loopback, or when serve listens on every interface and the URL's host is loopback
    or this machine's name. A port of 0 (chosen at bind time) is never matched: it is unknown
    before serve listens.
    """
    parts = urlsplit(url)
    try:
        url_port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return False
    if port == 0 or url_port != port:
        return False
    host = (parts.hostname or "").lower()
    bound = bind.strip("[]").lower()
    if host == bound:
        return True
    if _loopback(host):
        return _loopback(bound) or bound in _WILDCARDS
    return bound in _WILDCARDS and host == socket.gethostname().lower()


def _loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
