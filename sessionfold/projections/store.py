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
    # Every event builds dozens of keys: `map(str, ...)` skips a generator frame per part.
    return "/".join((session_id, *map(str, parts)))


class DictStore(dict[str, Any]):
    """The embedded runtime's store: a plain dict with the Store methods.

    `get` is dict's own and `put` is item assignment, bound without a Python frame of their
    own: the folds call them dozens of times per event.
    """

    put = dict.__setitem__

    def delete(self, key: str) -> None:
        """Remove `key` if present."""
        self.pop(key, None)
