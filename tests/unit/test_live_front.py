"""serve's API process answers a caught-up context call from what the fold process handed over
(web/live_front.py): in process, over a pipe, against the fold process' own API on the same
`LiveFolds`. Over a session grown in drawn steps, with calls in drawn forms: whatever the API
process answers is the fold process' answer byte for byte, and once the session folded anything
since, it answers nothing (the call goes to the fold process)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.streams.cli.context import view_from_replay
from sessionfold.streams.runtime.live import LiveFolds
from sessionfold.streams.tools.replay import Collector, replay_files
from sessionfold.streams.tools.synthetic import generate_session, write_session
from sessionfold.streams.web.handover import Handover, read_frame
from sessionfold.streams.web.live_api import LiveApi
from sessionfold.streams.web.live_front import LiveFront

PIPE_BYTES = 1 << 20


async def _frames(fd: int) -> list[Any]:
    """Every frame written to the pipe so far."""
    data = bytearray()
    while True:
        try:
            chunk = os.read(fd, PIPE_BYTES)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    reader = asyncio.StreamReader()
    reader.feed_data(bytes(data))
    reader.feed_eof()
    found = []
    while True:
        try:
            found.append(await read_frame(reader))
        except asyncio.IncompleteReadError:
            return found


def _pi_shape(path: Path, session_id: str) -> list[list[Any]]:
    collector = Collector(session_id)
    replayer = replay_files([path], DEFAULT_CONFIG, [session_id], on_folded=collector)
    view = view_from_replay(replayer, collector, DEFAULT_CONFIG)
    return [[m["role"], m.get("toolCallId")] for m in view.unpruned]


@dataclass
class Rig:
    """The fold process' live folds and API, writing frames to a pipe, and the API process'
    side (`front`) that applies them."""

    live: LiveFolds
    front: LiveFront
    read_end: int
    write_end: int

    def client(self) -> TestClient:
        """A client of the fold process' API, handing its answers over on the pipe."""
        api = LiveApi(self.live, wait_s=5, handover=Handover(self.live, self.write_end))
        return TestClient(TestServer(api.app(None)))

    async def apply_frames(self) -> None:
        """Apply every frame written so far to the API process' side."""
        for frame in await _frames(self.read_end):
            self.front.apply(frame)


@contextlib.contextmanager
def _rig(watched: Path) -> Iterator[Rig]:
    read_end, write_end = os.pipe()
    try:
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        os.set_blocking(read_end, False)
        yield Rig(LiveFolds([watched]), LiveFront("unused"), read_end, write_end)
    finally:
        os.close(read_end)
        os.close(write_end)


SOURCES: dict[int, list[bytes]] = {}


def _lines(seed: int) -> list[bytes]:
    if seed not in SOURCES:
        import tempfile

        with tempfile.TemporaryDirectory() as scratch:
            path = write_session(Path(scratch), generate_session(seed, 14)).path
            SOURCES[seed] = path.read_bytes().splitlines(keepends=True)
    return SOURCES[seed]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.sampled_from([3, 4]),
    steps=st.lists(st.integers(1, 6), min_size=1, max_size=60),
    forms=st.lists(st.sampled_from(["patch", "messages", "mismatch", "none"]), min_size=1),
)
def test_the_api_process_answers_the_fold_process_bytes_or_nothing(
    tmp_path_factory: Any, seed: int, steps: list[int], forms: list[str]
) -> None:
    """Grow the file by drawn steps; after each, a drawn call to the fold process' API, its
    frames applied to the API process' side: the same call there gives the same bytes, or
    nothing (a form not handed over yet); after the next step (a fold), nothing at all."""
    lines = _lines(seed)
    watched = tmp_path_factory.mktemp("live")
    path = watched / "session.jsonl"
    path.write_bytes(b"")
    session_id = str(orjson.loads(lines[0])["id"])

    async def run(rig: Rig) -> None:
        live, front = rig.live, rig.front
        async with rig.client() as client:
            written = 0
            previous: bytes | None = None
            for number, step in enumerate(steps):
                if written >= len(lines):
                    break
                with path.open("ab") as handle:
                    handle.write(b"".join(lines[written : written + step]))
                written += step
                live.discover()
                live.poll()
                await rig.apply_frames()
                if previous is not None:
                    # the session folded lines since the last answer: it is not answered here
                    assert front.caught_up(session_id, previous) is None
                form = forms[number % len(forms)]
                leaf = orjson.loads(lines[min(written, len(lines)) - 1])["id"]
                shape = [] if form == "mismatch" else _pi_shape(path, session_id)
                body: dict[str, Any] = {"leaf": None if form == "none" else leaf, "shape": shape}
                if form != "messages":
                    body["answer"] = "patch"
                encoded = orjson.dumps(body)
                answer = await client.post(f"/sessions/{session_id}/context", data=encoded)
                expected = await answer.read()
                assert not orjson.loads(expected)["stale"]
                await rig.apply_frames()
                here = front.caught_up(session_id, encoded)
                assert here is not None and here.body == expected
                unknown = orjson.dumps({**body, "leaf": "not-folded-yet"})
                assert front.caught_up(session_id, unknown) is None
                previous = encoded

    with _rig(watched) as rig:
        asyncio.run(run(rig))


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.sampled_from([3, 4]), start=st.integers(8, 26), raises_at=st.integers(2, 6))
def test_a_fold_that_raises_partway_still_drops_the_render_handed_over(
    tmp_path_factory: Any, seed: int, start: int, raises_at: int
) -> None:
    """A render handed over, then a poll whose fold raises at a drawn line after folding the
    ones before it: the file is set aside and its session dropped (half a fold answers
    nothing), so the API process answers the call no more (`dropped` was sent)."""
    lines = _lines(seed)
    watched = tmp_path_factory.mktemp("live")
    path = watched / "session.jsonl"
    path.write_bytes(b"".join(lines[:start]))
    session_id = str(orjson.loads(lines[0])["id"])

    async def run(rig: Rig) -> None:
        live, front = rig.live, rig.front
        async with rig.client() as client:
            live.discover()
            live.poll()
            leaf = orjson.loads(lines[start - 1])["id"]
            body = orjson.dumps({"leaf": leaf, "shape": _pi_shape(path, session_id)})
            answer = await client.post(f"/sessions/{session_id}/context", data=body)
            assert answer.status == 200
            await rig.apply_frames()
            assert front.caught_up(session_id, body) is not None
            folds = 0
            fold = live.runtime.fold

            def failing(record: Any) -> Any:
                nonlocal folds
                folds += 1
                if folds == raises_at:
                    raise RuntimeError("a fold failed")
                return fold(record)

            live.runtime.fold = failing  # type: ignore[method-assign]
            with path.open("ab") as handle:
                handle.write(b"".join(lines[start : start + 8]))
            live.poll()  # the file is set aside, the poll goes on (docs/live.md, Faults)
            assert session_id not in live.sessions and live.files_set_aside() == 1
            await rig.apply_frames()
            assert front.caught_up(session_id, body) is None

    with _rig(watched) as rig:
        asyncio.run(run(rig))
