"""The keyed store every fold reads and writes: the only state a fold is handed.

Values are JSON-ready (dicts, lists, str, int, float, bool, None). Keys are strings built by
`key(session_id, *parts)`, so one session's rows share a prefix. The embedded runtime backs this
with a dict; the Kafka runtime with a Faust table, where each `put` is one changelog record: keep
what one event writes small (a head record per session, rows per message and per call).
"""

from __future__ import annotations

from typing import Any, Protocol


class Store(Protocol):
    """A keyed store of JSON-ready values."""

    def get(self, key: str) -> Any | None:
        """The value at `key`, or None."""
        ...

    def put(self, key: str, value: Any) -> None:
        """Set `key` to `value`."""
        ...

    def delete(self, key: str) -> None:
        """Remove `key` if present."""
        ...


def key(session_id: str, *parts: object) -> str:
    """The store key of one of a session's rows, e.g. key(sid, "msg", 12)."""
    return "/".join([session_id, *(str(p) for p in parts)])


class DictStore(dict):
    """The embedded runtime's store: a plain dict with the Store methods."""

    def get(self, key: str, default: Any = None) -> Any | None:  # type: ignore[override]
        return super().get(key, default)

    def put(self, key: str, value: Any) -> None:
        """Set `key` to `value`."""
        self[key] = value

    def delete(self, key: str) -> None:
        """Remove `key` if present."""
        self.pop(key, None)
