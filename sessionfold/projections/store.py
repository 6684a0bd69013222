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


_NO_PART: object = object()


def key(session_id: str, first: object = _NO_PART, second: object = _NO_PART, *rest: object) -> str:
    """The store key of one of a session's rows, e.g. key(sid, "msg", 12)."""
    # Every event builds dozens of keys, nearly all of one or two parts (str or int, which an
    # f-string formats as str() does): an f-string makes them without a join, a str() call or
    # a count of the parts.
    if second is _NO_PART:
        return session_id if first is _NO_PART else f"{session_id}/{first}"
    if not rest:
        return f"{session_id}/{first}/{second}"
    return "/".join((session_id, str(first), str(second), *map(str, rest)))


class KeyFunction(Protocol):
    """`key` for the rows of one namespace of a session (its first part fixed)."""

    def __call__(self, session_id: str, /, *parts: object) -> str:
        """The store key of one of the namespace's rows."""
        ...


def key_in(namespace: str) -> KeyFunction:
    """`key` with the first part fixed: key_in("pr")(sid, "h") == key(sid, "pr", "h")."""

    # One frame per key instead of two (a wrapper calling `key`), as `key` does it.
    def namespaced(
        session_id: str, first: object = _NO_PART, second: object = _NO_PART, /, *rest: object
    ) -> str:
        if second is _NO_PART:
            if first is _NO_PART:
                return f"{session_id}/{namespace}"
            return f"{session_id}/{namespace}/{first}"
        if not rest:
            return f"{session_id}/{namespace}/{first}/{second}"
        return "/".join((session_id, namespace, str(first), str(second), *map(str, rest)))

    return namespaced


class DictStore(dict[str, Any]):
    """The embedded runtime's store: a plain dict with the Store methods.

    `get` is dict's own and `put` is item assignment, bound without a Python frame of their
    own: the folds call them dozens of times per event.
    """

    put = dict.__setitem__

    def delete(self, key: str) -> None:
        """Remove `key` if present."""
        self.pop(key, None)
