"""Backends over a dict for the fold runtime's unit tests: writes (and record batches of them)
land in `live` at once, and each returns an acknowledgement the test gives (or has given) itself.
Imported by unit tests as `backend_fakes` (pytest puts `tests/` on sys.path for its rootdir
conftest).
"""

from __future__ import annotations

import asyncio
from typing import Any

from sessionfold.streams.kafka.table_store import Write


def acknowledged() -> asyncio.Future[None]:
    """An acknowledgement already given (a write or send the broker has)."""
    done = asyncio.get_running_loop().create_future()
    done.set_result(None)
    return done


class DictBackend:
    """A Backend over `live`, a dict; `written` makes each write's acknowledgement."""

    def __init__(self) -> None:
        self.live: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.live.get(key)

    def keys(self) -> Any:
        return self.live.keys()

    async def write(
        self, key: str, value: bytes | None, partition: int, generation: int = 0
    ) -> Any:
        if value is None:
            self.live.pop(key, None)
        else:
            self.live[key] = value
        return self.written(key, value)

    async def write_groups(
        self, groups: list[list[Write]], partition: int, generation: int = 0
    ) -> Any:
        writes = [write for group in groups for write in group]
        for key, value in writes:
            if value is None:
                self.live.pop(key, None)
            else:
                self.live[key] = value
        return self.written_groups(writes)

    def written(self, key: str, value: bytes | None) -> asyncio.Future[Any]:
        """The acknowledgement of one write, just applied to `live`."""
        raise NotImplementedError

    def written_groups(self, writes: list[Write]) -> asyncio.Future[Any]:
        """The acknowledgement of a record batch's writes (groups in order), just applied."""
        raise NotImplementedError
