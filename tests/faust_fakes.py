"""Stand-ins for the parts of a Faust table a FaustBackend touches: its store, the app's producer
and the changelog topic's name; and a real Faust app that is never started. Imported by unit
tests as `faust_fakes` (pytest puts `tests/` on sys.path for its rootdir conftest).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import faust
from faust.types import TP


def unstarted_app(tmp_path: Path, app_id: str = "unstarted", **options: Any) -> faust.App:
    """A real Faust app that is never started (its broker does not exist)."""
    return faust.App(
        app_id,
        broker="kafka://127.0.0.1:1",
        autodiscover=False,
        web_enabled=False,
        datadir=str(tmp_path),
        **options,
    )


class FakeStore(dict):
    def __init__(self) -> None:
        super().__init__()
        self.persisted: dict[Any, int] = {}

    def set_persisted_offset(self, tp: Any, offset: int) -> None:
        self.persisted[tp] = offset


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []
        self.headers: list[Any] = []  # each send's headers
        self.pending: list[asyncio.Future[Any]] = []

    async def send(self, topic: str, key: Any, value: Any, partition: Any, *rest: Any) -> Any:
        self.sent.append((topic, key, value, partition))
        self.headers.append(rest[1] if len(rest) > 1 else None)
        future = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        return future


class FakeTable:
    def __init__(self) -> None:
        self.data = FakeStore()
        self.app = type("App", (), {"producer": FakeProducer()})()
        self.changelog_topic = type("Topic", (), {"get_topic_name": lambda self: "app-state-cl"})()


class Acked:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self.topic_partition = TP(topic, partition)
        self.offset = offset
