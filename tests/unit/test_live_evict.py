"""issue #39 item 8 (docs/live.md, "Faults"): a restart's fold holds bounded memory. A session
that is settled, old (not written within `live_within_s`) and that no client asked for keeps
only its file's path; a call for it waits for its file's fold again, and every answer is the
one a `LiveFolds` that never evicts gives, byte for byte."""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.streams.runtime import live as live_module
from sessionfold.streams.runtime.live import LiveFolds
from sessionfold.streams.tools.synthetic import generate_session, write_session
from sessionfold.streams.web import live_contract as contract
from sessionfold.streams.web.live_api import LiveApi

#: A day: older than any `live_within_s` here.
OLD_S = 86_400.0
#: The shared real session compacted twice, beside the checkout (or its worktrees' folder).
REAL_SESSIONS = Path("shared/data/sessions/before-compaction.jsonl")
#: What an evicted session may still hold, bytes (its tail, a fresh reader, its record).
EVICTED_BYTES = 8 * 1024


def _sessions(folder: Path, count: int, turns: int = 40) -> list[tuple[Path, str]]:
    """`count` generated pi sessions in `folder`, last written a day ago."""
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    stamp = time.time() - OLD_S
    for seed in range(count):
        path = write_session(folder, generate_session(seed, turns)).path
        os.utime(path, (stamp, stamp))
        made.append((path, str(orjson.loads(path.read_bytes().splitlines()[0])["id"])))
    return made


def _started(folder: Path, evict: bool) -> tuple[LiveFolds, int, int]:
    """A `LiveFolds` over `folder` after its start's fold, with the bytes it holds then and at
    most during the fold (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    try:
        live = LiveFolds([folder], live_within_s=600, evict=evict)
        live.discover()
        live.poll()
        gc.collect()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return live, held, peak


def test_old_settled_sessions_keep_no_entries_after_a_start(tmp_path: Path) -> None:
    """12 day-old sessions: after the start's fold none holds entries, state rows or a reader's
    position; what stays is a few KiB a session, and the fold's peak is a fraction of what the
    same fold keeps without eviction."""
    kept_dir, evicted_dir = tmp_path / "kept", tmp_path / "evicted"
    files = _sessions(kept_dir, 12)
    shutil.copytree(kept_dir, evicted_dir)
    kept, kept_held, kept_peak = _started(kept_dir, evict=False)
    live, held, peak = _started(evicted_dir, evict=True)
    ids = {session_id for _path, session_id in files}
    assert set(kept.sessions) == ids  # the figure compared with: every session held
    assert live.sessions == {} and set(live.evicted) == ids
    assert live.session_count() == len(ids)
    assert not [key for key in live.runtime.store if key.split("/")[0] in ids]
    assert all(tail.reader.offset == 0 and tail.evicted for tail in live.tails.values())
    assert all(live.holder(session_id) is not None for session_id in ids)
    assert held < EVICTED_BYTES * len(ids), held
    assert held < kept_held / 20, (held, kept_held)
    assert peak < kept_peak / 2, (peak, kept_peak)


def _sliced_peak(folder: Path) -> int:
    """The most bytes a start's fold held (tracemalloc) read as `follow` reads: each file a
    slice at a time (a slice short enough to cut every file many times)."""
    gc.collect()
    tracemalloc.start()
    try:
        live = LiveFolds([folder], live_within_s=600, evict=True)
        live.discover()
        while not live.tails or any(tail.seen is None for tail in live.tails.values()):
            live.poll_due(slice_s=0.002, poll_s=0.0)
        _held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(live.evicted) == len(live.tails)
    return peak


def test_a_sliced_start_reads_a_few_files_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`follow` reads each file a slice at a time: a start over 24 old sessions reads at most
    FIRST_READS of them at once, so its peak is a fraction of taking a slice of every file in
    turn (each session's state half built at once, evicted only at the end)."""
    _sessions(tmp_path / "a", 24, turns=30)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    peak = _sliced_peak(tmp_path / "a")
    monkeypatch.setattr(live_module, "FIRST_READS", 10**6)
    every_file_at_once = _sliced_peak(tmp_path / "b")
    assert peak < every_file_at_once / 2, (peak, every_file_at_once)


def test_live_asked_and_pinned_sessions_are_not_evicted(tmp_path: Path) -> None:
    """A session written now, and an old one a client asked for, stay whole; without
    journals nothing is evicted (a fold again could not answer its flushes as before)."""
    files = _sessions(tmp_path / "live", 3)
    fresh = time.time()
    os.utime(files[0][0], (fresh, fresh))
    live = LiveFolds([tmp_path / "live"], live_within_s=600, evict=True)
    live.asked(files[1][1])
    live.discover()
    live.poll()
    assert set(live.sessions) == {files[0][1], files[1][1]}
    assert set(live.evicted) == {files[2][1]}
    unjournaled = LiveFolds([tmp_path / "live"], live_within_s=600, evict=True, journals=False)
    unjournaled.discover()
    unjournaled.poll()
    assert len(unjournaled.sessions) == 3 and not unjournaled.evicted


class _PaidModel:
    """A ledger model that is not the offline one (it answers as that one does)."""

    name = "paid"

    def __init__(self) -> None:
        self.calls = 0
        self._offline = OfflineModel()

    def diff(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """The offline answer, counted."""
        self.calls += 1
        return self._offline.diff(prompt)


def _real_session(folder: Path) -> tuple[Path, str]:
    """The shared real pi session with two compactions (its ledger passes), copied into
    `folder` and made a day old; the test is skipped where the shared data is absent."""
    here = Path(__file__).resolve().parents[2]
    found = [root / REAL_SESSIONS for root in (here.parent, here.parent.parent)]
    source = next((path for path in found if path.is_file()), None)
    if source is None:
        pytest.skip(f"the shared real sessions are absent (looked for {found[0]})")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / source.name
    path.write_bytes(source.read_bytes())
    stamp = time.time() - OLD_S
    os.utime(path, (stamp, stamp))
    return path, str(orjson.loads(path.read_bytes().splitlines()[0])["id"])


def test_a_session_with_ledger_passes_stays_when_they_go_to_a_model(tmp_path: Path) -> None:
    """No journal keeps a ledger pass: with a ledger model other than the offline one, an old
    session that raised passes (a real one, compacted twice) is kept whole, since a fold again,
    once asked for, would ask that model. With the offline one it is evicted, and folded again
    it renders the very bytes the kept one does."""
    path, session_id = _real_session(tmp_path / "paid")
    paid = LiveFolds([path.parent], diff_model=_PaidModel(), live_within_s=600, evict=True)
    paid.discover()
    paid.poll()
    assert paid.sessions[session_id].pinned and not paid.evicted
    shutil.copytree(path.parent, tmp_path / "kept")
    shutil.copytree(path.parent, tmp_path / "evicted")
    kept = LiveFolds([tmp_path / "kept"], live_within_s=600)
    live = LiveFolds([tmp_path / "evicted"], live_within_s=600, evict=True)
    for folds in (kept, live):
        folds.discover()
        folds.poll()
    assert session_id in live.evicted
    for folds in (kept, live):
        folds.asked(session_id)
        folds.want(session_id)
        folds.poll()
    assert _seen(live, session_id) == _seen(kept, session_id)


def test_a_session_grown_old_is_evicted_at_its_next_stat(tmp_path: Path) -> None:
    """A session live at the start is evicted once its file is older than `live_within_s`
    (the back-off's stat finds it unchanged and old), and its log line names ids only."""
    [(path, session_id)] = _sessions(tmp_path / "live", 1)
    fresh = time.time()
    os.utime(path, (fresh, fresh))
    live = LiveFolds([tmp_path / "live"], live_within_s=600, evict=True)
    live.discover()
    live.poll()
    assert session_id in live.sessions
    os.utime(path, (fresh, fresh))  # unchanged: the same stat
    live.live_within_s = 0.0
    live.poll()
    assert session_id in live.evicted and session_id not in live.sessions


def test_an_evicted_sessions_copy_is_set_aside_and_a_move_is_followed(tmp_path: Path) -> None:
    """As for a session held: a copy of an evicted session's file (the same id) is set aside,
    and the session is folded again from its own file when asked for; moved (renamed), it is
    served from its new path; its file removed, it is no longer counted."""
    [(path, session_id)] = _sessions(tmp_path / "live", 1)
    live = LiveFolds([tmp_path / "live"], live_within_s=600, evict=True)
    live.discover()
    live.poll()
    assert session_id in live.evicted
    copy = path.with_name("copy.jsonl")
    copy.write_bytes(path.read_bytes())
    live.discover()
    live.poll()
    assert live.files_set_aside() == 1 and live.evicted == {session_id: path}
    moved = path.with_name("moved.jsonl")
    copy.unlink()
    path.rename(moved)
    live.discover()
    live.poll()
    assert live.evicted == {session_id: moved}  # read from its new path, evicted again
    live.asked(session_id)
    live.want(session_id)
    live.poll()
    assert live.sessions[session_id].path == moved and not live.evicted
    [(other_path, other_id)] = _sessions(tmp_path / "other", 1)
    other = LiveFolds([tmp_path / "other"], live_within_s=600, evict=True)
    other.discover()
    other.poll()
    assert other.session_count() == 1
    other_path.unlink()
    other.poll()
    assert other.session_count() == 0 and other.holder(other_id) is None


@contextmanager
def _following(live: LiveFolds) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=live.follow, args=(stop, 0.005), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        live.wanted.set()
        thread.join(5)


def _answers(live: LiveFolds, session_id: str, leaf: str) -> dict[str, bytes]:
    """The bodies of every route that reads a session's state, asked in turn of a served
    `live` (its tailer running), the first one while its session is evicted."""

    async def run() -> dict[str, bytes]:
        base = f"/sessions/{session_id}"
        async with TestClient(TestServer(LiveApi(live, wait_s=20).app(None))) as client:
            with _following(live):
                bodies = {}
                calls = {
                    "compact": ("POST", f"{base}/compact", {}),  # from the file alone
                    "status": ("GET", f"{base}/status", None),
                    "context": ("POST", f"{base}/context", {"leaf": leaf, "shape": []}),
                    "document": ("GET", base, None),
                    "plan": ("GET", f"{base}/plan", None),
                    "recall": ("POST", f"{base}/recall", {"ids": ["t1", "t2"]}),
                    "ref": ("GET", f"{base}/refs/t1", None),
                    "health": ("GET", "/health", None),
                }
                for name, (method, url, body) in calls.items():
                    answer = await client.request(method, url, json=body)
                    bodies[name] = b"%d " % answer.status + await answer.read()
                return bodies

    return asyncio.run(run())


def test_every_route_answers_an_evicted_session_as_if_it_were_kept(tmp_path: Path) -> None:
    """The compact, status, context, document, plan, recall and ref routes of a day-old
    session (the first two calls made while it is evicted) answer the same status and bytes as
    a LiveFolds that keeps every session; the session is kept afterwards (asked for)."""
    kept_dir, evicted_dir = tmp_path / "kept", tmp_path / "evicted"
    files = _sessions(kept_dir, 4)
    shutil.copytree(kept_dir, evicted_dir)
    path, session_id = files[2]
    leaf = str(orjson.loads(path.read_bytes().splitlines()[-1])["id"])
    kept = LiveFolds([kept_dir], live_within_s=600)
    live = LiveFolds([evicted_dir], live_within_s=600, evict=True)
    for folds in (kept, live):
        folds.discover()
        folds.poll()
    assert session_id in live.evicted
    expected = _answers(kept, session_id, leaf)
    assert all(body.startswith(b"200 ") for body in expected.values()), expected
    assert b'"t1"' in expected["ref"] and b'"known":false' not in expected["status"]
    assert _answers(live, session_id, leaf) == expected
    assert session_id in live.sessions and session_id not in live.evicted


# --- the oracle: random appends, ages and asks, against a LiveFolds that never evicts ---------

#: Sessions in each example, and the turns each is generated with.
ORACLE_SESSIONS = 3
ORACLE_TURNS = 25

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["append", "age", "ask", "poll"]),
        st.integers(0, ORACLE_SESSIONS - 1),
        st.integers(1, 40),
    ),
    min_size=1,
    max_size=14,
)


def _seen(live: LiveFolds, session_id: str) -> tuple[Any, ...]:
    """What the routes answer from: the render (messages, tokens, identities, epoch) and
    the session's document, encoded."""
    rendered = live.rendered(session_id, contract.epoch_of)
    return (
        rendered.messages_json,
        rendered.patch_json,
        orjson.dumps(rendered.tokens),
        orjson.dumps(rendered.identities),
        rendered.epoch,
        rendered.settled,
        orjson.dumps(live.document(session_id)),
    )


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS, cut=st.integers(5, 60), seed=st.integers(0, 50))
def test_answers_equal_those_of_a_folds_that_never_evicts(
    ops: list[tuple[str, int, int]], cut: int, seed: int
) -> None:
    """For a random run of appends to a file (it is live, then folded again from its start),
    time passing (the file grows old: evicted) and asks (a context call: folded again, kept),
    every asked session's render and document equal the never-evicting oracle's bytes."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "src").mkdir()
        sources = [
            write_session(root / "src", generate_session(seed + n, ORACLE_TURNS)).path
            for n in range(ORACLE_SESSIONS)
        ]
        lines = [source.read_bytes().splitlines(keepends=True) for source in sources]
        ids = [str(orjson.loads(found[0])["id"]) for found in lines]
        written = [min(cut, len(found)) for found in lines]
        folders = [root / "kept", root / "evicted"]
        stamp = time.time() - OLD_S
        for folder in folders:
            folder.mkdir()
            for source, found, count in zip(sources, lines, written, strict=True):
                target = folder / source.name
                target.write_bytes(b"".join(found[:count]))
                os.utime(target, (stamp, stamp))
        kept = LiveFolds([folders[0]], live_within_s=600)
        live = LiveFolds([folders[1]], live_within_s=600, evict=True)
        both = (kept, live)
        for folds in both:
            folds.discover()
            folds.poll()
        assert not live.sessions  # all old: evicted at the start
        for op, n, count in ops:
            name = sources[n].name
            if op == "append":
                more = lines[n][written[n] : written[n] + count]
                written[n] += len(more)
                for folder in folders:
                    with (folder / name).open("ab") as handle:
                        handle.write(b"".join(more))
            elif op == "age":
                stamp = time.time() - OLD_S
                for folder in folders:
                    os.utime(folder / name, (stamp, stamp))
            elif op == "ask":
                for folds in both:
                    folds.asked(ids[n])
                    folds.want(ids[n])
            for folds in both:
                folds.poll()
            if op == "ask":
                assert ids[n] in live.sessions
                assert _seen(live, ids[n]) == _seen(kept, ids[n])
        for session_id in ids:
            for folds in both:
                folds.asked(session_id)
                folds.want(session_id)
                folds.poll()
            assert _seen(live, session_id) == _seen(kept, session_id)
