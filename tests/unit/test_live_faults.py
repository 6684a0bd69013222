"""What one file does never stops the others (docs/live.md, "Faults"): a file whose read or fold
raises is set aside with one warning and a count, and retried when it changes; a file that grows
without end or folds slowly delays the others by a slice per poll; a file replaced, truncated or
rewritten under the tailer is folded afresh as what it now is, so an id never answers with
another session's content."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from serve_process import serving

from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.streams.cli.context import view_from_replay
from sessionfold.streams.publishing.session_file import SessionFileReader
from sessionfold.streams.runtime.live import LiveFolds
from sessionfold.streams.tools.replay import Collector, replay_files
from sessionfold.streams.tools.synthetic import generate_session, write_session

#: issue #39's reproducer: a Codex rollout whose second line has a `type` of the wrong type.
CODEX_BAD = (
    b'{"timestamp":"2026-01-01T00:00:00Z","type":"session_meta","payload":{"id":"s1",'
    b'"timestamp":"2026-01-01T00:00:00Z","cwd":"/tmp"}}\n'
    b'{"timestamp":"2026-01-01T00:00:01Z","type":{},"payload":{}}\n'
)
#: Text a failure's message carries that no log may repeat.
SECRET = "the agent read a secret here"


def _pi(folder: Path, seed: int, turns: int = 6, name: str | None = None) -> tuple[Path, str]:
    """A pi session file written whole under `folder` (named `name`), and its session id."""
    folder.mkdir(parents=True, exist_ok=True)
    path = write_session(folder, generate_session(seed, turns)).path
    if name is not None:
        path = path.rename(folder / name)
    return path, str(orjson.loads(path.read_bytes().splitlines()[0])["id"])


def _fleet(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """A watched directory: a file sorted first (`0-bad.jsonl`, a pi session), then three pi
    sessions; the bad file and the others' ids."""
    watched = tmp_path / "live"
    bad, _ = _pi(watched, 90, name="0-bad.jsonl")
    ids = [_pi(watched, seed, name=f"{seed}-pi.jsonl")[1] for seed in (5, 6, 7)]
    return watched, bad, ids


def _fresh(path: Path, session_id: str) -> bytes:
    """The document a new LiveFolds makes of the file as it is (a restart's)."""
    live = LiveFolds([path], journals=False)
    live.discover()
    live.poll()
    return orjson.dumps(live.document(session_id), option=orjson.OPT_SORT_KEYS)


def _document(live: LiveFolds, session_id: str) -> bytes:
    return orjson.dumps(live.document(session_id), option=orjson.OPT_SORT_KEYS)


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


def _logged(caplog: pytest.LogCaptureFixture) -> str:
    """Every record's message and extra fields, as a log handler could write them."""
    return "\n".join(f"{r.getMessage()} {sorted(vars(r).items())!r}" for r in caplog.records)


# --- item 1: one bad file stops no other ---------------------------------------------------------


def test_the_issues_codex_file_sorted_first_stops_no_pi_session(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """#39's reproducer beside three pi sessions: every pi session folds, and however many
    polls run, at most one warning (it was a failed poll each time, and no pi session ever)."""
    watched = tmp_path / "live"
    watched.mkdir()
    (watched / "0-codex.jsonl").write_bytes(CODEX_BAD)
    ids = [_pi(watched, seed, name=f"{seed}-pi.jsonl")[1] for seed in (5, 6, 7)]
    live = LiveFolds([watched], journals=False)
    stop = threading.Event()
    follower = threading.Thread(target=live.follow, args=(stop, 0.005), daemon=True)
    with caplog.at_level(logging.WARNING):
        follower.start()
        try:
            deadline = time.monotonic() + 20
            while not set(ids) <= set(live.sessions) and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)  # dozens of polls more
        finally:
            stop.set()
            live.wanted.set()
            follower.join(10)
    assert set(ids) <= set(live.sessions)
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) <= 1
    assert live.set_aside_total <= 1 and live.files_set_aside() == live.set_aside_total


@pytest.fixture
def failing_read(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Makes every read of `failing["path"]` raise (while `failing["on"]`)."""
    failing: dict[str, Any] = {"path": None, "on": True}
    lines_of = SessionFileReader.lines

    def lines(self: SessionFileReader, final: bool = True) -> Iterator[list[Any]]:
        if failing["on"] and self.path == failing["path"]:
            raise RuntimeError(SECRET)
        return lines_of(self, final)

    monkeypatch.setattr(SessionFileReader, "lines", lines)
    return failing


def test_a_file_whose_read_raises_is_set_aside_once_and_retried_when_it_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, failing_read: dict[str, Any]
) -> None:
    """Any exception reading one file: the files after it fold; one warning per set-aside (not
    per poll), with the error's class and no message text; a count; retried once the file
    changes, and folded afresh once it reads."""
    watched, bad, ids = _fleet(tmp_path)
    failing_read["path"] = bad
    live = LiveFolds([watched], journals=False)
    live.discover()
    with caplog.at_level(logging.WARNING):
        for _ in range(20):
            live.poll()
    assert set(live.sessions) == set(ids)
    aside = _warnings(caplog, "set aside")
    assert len(aside) == 1 and aside[0].error == "RuntimeError"  # type: ignore[attr-defined]
    assert live.set_aside_total == 1 and live.files_set_aside() == 1
    assert SECRET not in _logged(caplog)
    with bad.open("ab") as handle:  # changed, still failing: retried, set aside again
        handle.write(b"\n")
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            live.poll()
    assert len(_warnings(caplog, "set aside")) == 2 and live.set_aside_total == 2
    failing_read["on"] = False
    os.utime(bad, ns=(time.time_ns(), time.time_ns() + 10**9))  # changed: retried, and reads
    live.poll()
    bad_id = str(orjson.loads(bad.read_bytes().splitlines()[0])["id"])
    assert set(live.sessions) == {*ids, bad_id} and live.files_set_aside() == 0
    assert _document(live, bad_id) == _fresh(bad, bad_id)


def test_a_fold_that_raises_sets_the_file_aside_and_drops_its_half_folded_session(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fold that raises partway through one session's file: that session is dropped (its
    entries and its rows in the store: it answers unknown-session), the others fold."""
    watched, bad, ids = _fleet(tmp_path)
    bad_id = str(orjson.loads(bad.read_bytes().splitlines()[0])["id"])
    live = LiveFolds([watched], journals=False)
    fold = live.runtime.fold
    seen = {"records": 0}

    def failing(envelope: Any) -> Any:
        if envelope.session_id == bad_id:
            seen["records"] += 1
            if seen["records"] == 5:
                raise ValueError(SECRET)
        return fold(envelope)

    monkeypatch.setattr(live.runtime, "fold", failing)
    live.discover()
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            live.poll()
    assert set(live.sessions) == set(ids)
    assert not [k for k in live.runtime.store if k == bad_id or k.startswith(f"{bad_id}/")]
    assert len(_warnings(caplog, "set aside")) == 1 and SECRET not in _logged(caplog)
    for session_id in ids:
        assert _document(live, session_id) == _fresh(
            watched / f"{ids.index(session_id) + 5}-pi.jsonl", session_id
        )


def test_a_file_that_grows_without_end_delays_the_others_by_a_slice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file sorted first whose read never ends (a line every few milliseconds, forever):
    `follow` still folds the files after it (it read that one for good before)."""
    watched, bad, ids = _fleet(tmp_path)
    lines_of = SessionFileReader.lines
    stop = threading.Event()

    def endless(self: SessionFileReader, final: bool = True) -> Iterator[list[Any]]:
        if self.path != bad:
            yield from lines_of(self, final)
            return
        while not stop.is_set():
            time.sleep(0.002)  # a slow line of nothing to fold
            yield []

    monkeypatch.setattr(SessionFileReader, "lines", endless)
    live = LiveFolds([watched], journals=False)
    follower = threading.Thread(target=live.follow, args=(stop, 0.005), daemon=True)
    follower.start()
    try:
        deadline = time.monotonic() + 10
        while not set(ids) <= set(live.sessions) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert set(ids) <= set(live.sessions)
    finally:
        stop.set()
        live.wanted.set()
        follower.join(10)


# --- item 2: a replaced or truncated file is folded as what it now is -------------------------


def _two(tmp_path: Path) -> tuple[LiveFolds, Path, str, Path, str]:
    """Session A (short) and B (longer) folded from one watched directory."""
    watched = tmp_path / "live"
    a, a_id = _pi(watched, 5, turns=4, name="a.jsonl")
    b, b_id = _pi(watched, 6, turns=30, name="b.jsonl")
    live = LiveFolds([watched], journals=False)
    live.discover()
    live.poll()
    assert set(live.sessions) == {a_id, b_id}
    return live, a, a_id, b, b_id


def _no_rows(live: LiveFolds, session_id: str) -> bool:
    return not [k for k in live.runtime.store if k == session_id or k.startswith(f"{session_id}/")]


def test_a_file_moved_over_another_is_folded_as_the_session_it_holds(tmp_path: Path) -> None:
    """`mv b.jsonl a.jsonl`: A's id answers nothing (it answered B's messages as its own, from
    the old offset), B's is the fold of the file it is now at, whichever path is polled first."""
    live, a, a_id, b, b_id = _two(tmp_path)
    os.replace(b, a)
    live.poll()
    assert a_id not in live.sessions and _no_rows(live, a_id)
    assert live.sessions[b_id].path == a
    assert _document(live, b_id) == _fresh(a, b_id)


def test_a_file_of_another_session_written_over_one_is_folded_as_that_session(
    tmp_path: Path,
) -> None:
    """Another session's file moved in from outside the watched paths over A (a new inode),
    or A's file rewritten in place with it (the same inode, longer: only its first bytes
    differ): A's id answers nothing, the other's is the fold of that file."""
    for in_place in (False, True):
        live, a, a_id, _b, _b_id = _two(tmp_path / str(in_place))
        other, other_id = _pi(tmp_path / str(in_place) / "elsewhere", 8, turns=30)
        if in_place:
            a.write_bytes(other.read_bytes())  # truncated, then written longer than before
        else:
            os.replace(other, a)
        live.poll()
        assert a_id not in live.sessions and _no_rows(live, a_id), in_place
        assert _document(live, other_id) == _fresh(a, other_id), in_place


def test_a_truncated_file_appended_to_folds_again(tmp_path: Path) -> None:
    """A's file truncated to its first lines, then written on: its state is the fold of the
    file as it is at each step (it never folded again, read at the old offset)."""
    live, a, a_id, _b, b_id = _two(tmp_path)
    b_before = _document(live, b_id)
    lines = a.read_bytes().splitlines(keepends=True)
    with a.open("r+b") as handle:
        handle.truncate(len(b"".join(lines[:3])))
    live.poll()
    assert _document(live, a_id) == _fresh(a, a_id)
    assert len(live.sessions[a_id].entries) == 3
    with a.open("ab") as handle:
        handle.write(b"".join(lines[3:]))
    live.poll()
    assert _document(live, a_id) == _fresh(a, a_id)
    assert _document(live, b_id) == b_before  # the other session untouched


def test_a_copy_of_a_live_session_is_set_aside_not_folded_into_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A second file naming a session another live file holds (`cp a.jsonl c.jsonl`): folding
    it too would double every entry; it is set aside, and the session stays the first file's."""
    live, a, a_id, _b, _b_id = _two(tmp_path)
    before = _document(live, a_id)
    (a.parent / "c.jsonl").write_bytes(a.read_bytes())
    live.discover()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            live.poll()
    assert _document(live, a_id) == before and live.sessions[a_id].path == a
    assert live.files_set_aside() == 1 and len(_warnings(caplog, "set aside")) == 1


# --- serve, both processes -----------------------------------------------------------------------

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _until(check: Any, within_s: float = 30.0) -> Any:
    """`check()`'s first truthy value, polled for `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def _asked(path: Path, session_id: str) -> tuple[dict[str, Any], bytes]:
    """A context call at the file's last entry, as the extension makes it; and the answer's
    `messages` as `sessionfold context FILE` renders them."""
    collector = Collector(session_id)
    replayer = replay_files([path], DEFAULT_CONFIG, [session_id], on_folded=collector)
    view = view_from_replay(replayer, collector, DEFAULT_CONFIG)
    leaf = orjson.loads(path.read_bytes().splitlines()[-1])["id"]
    shape = [[m["role"], m.get("toolCallId")] for m in view.unpruned]
    expected = orjson.dumps(view.messages if view.messages != view.unpruned else None)
    return {"leaf": leaf, "shape": shape, "wait_ms": 20_000}, expected


def test_serve_goes_on_past_a_bad_file_and_folds_a_replaced_one_afresh(tmp_path: Path) -> None:
    """A real serve: #39's Codex file sorted first stops no pi session (/health counted one);
    a file that faults later (a symlink loop in its place) is set aside and counted on serve's
    /metrics; `mv b.jsonl a.jsonl` has A's id answer unknown-session (not B's messages from a
    render kept in the API process) and B's the context of the file now at A's path."""
    watched = tmp_path / "live"
    watched.mkdir()
    (watched / "0-codex.jsonl").write_bytes(CODEX_BAD)
    looped, looped_id = _pi(watched, 9, name="0-loop.jsonl")
    a, a_id = _pi(watched, 5, turns=4, name="a.jsonl")
    b, b_id = _pi(watched, 6, turns=40, name="b.jsonl")
    with (
        serving(watched, TOKEN) as serve,
        httpx.Client(base_url=serve.url, headers=AUTH, timeout=60) as client,
    ):

        def health() -> dict[str, Any]:
            return dict(client.get("/health").json())

        assert _until(lambda: health()["sessions"] >= 3), health()

        def context(session_id: str, asked: dict[str, Any]) -> dict[str, Any]:
            return dict(client.post(f"/sessions/{session_id}/context", json=asked).json())

        for path, session_id in ((looped, looped_id), (a, a_id), (b, b_id)):
            asked, _ = _asked(path, session_id)
            assert context(session_id, asked)["reason"] != "unknown-session"
        seen = health()["files_set_aside_total"]
        looped.unlink()
        looped.symlink_to(looped.name)  # stat: ELOOP, a fault that is no missing file
        assert _until(lambda: health()["files_set_aside_total"] == seen + 1), health()
        metrics = client.get("/metrics").text
        assert f"sessionfold_live_files_set_aside_total {float(seen + 1)}" in metrics
        asked_a, _ = _asked(a, a_id)
        assert context(a_id, asked_a)["reason"] is None  # rendered: handed to the API process
        assert context(a_id, asked_a)["reason"] is None
        asked_b, expected_b = _asked(b, b_id)
        os.replace(b, a)
        assert _until(lambda: context(a_id, asked_a)["reason"] == "unknown-session")
        answer = context(b_id, asked_b)
        assert answer["stale"] is False and answer["reason"] is None
        assert orjson.dumps(answer.get("messages")) == expected_b
        raw = httpx.get(
            f"{serve.url}/sessions/{a_id}/status", headers={"Authorization": b"Bearer \xff"}
        )
        assert raw.status_code == 401
        serve.stop()  # exit 0, no traceback


# --- item 3: serve reads and writes regular files inside the watched folders ------------------


def _polled(live: LiveFolds, polls: int = 3, within_s: float = 10.0) -> None:
    """`live.discover()` and `polls` polls on a thread of their own, failing the test when they
    do not end within `within_s` (an open that blocks would hang it for good)."""
    done = threading.Event()

    def run() -> None:
        live.discover()
        for _ in range(polls):
            live.poll()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(within_s), "a poll blocked"


@pytest.mark.parametrize("kind", ["fifo", "link", "directory", "too-large"])
def test_an_answers_journal_that_is_no_regular_file_is_set_aside_and_the_session_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """`<file>.sessionfold-answers` as a FIFO (no poll blocks), a link to a file outside the
    watched folders (not read, nothing appended to it), a directory, or a sparse file past the
    bound (not read into memory): one warning naming the reason, and the session is folded
    without it, its flush answered by the model, the same state as with no journal."""
    watched = tmp_path / "live"
    path, session_id = _pi(watched, 5, name="a.jsonl")
    journal = path.with_name(path.name + ".sessionfold-answers")
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"not serve's\n")
    if kind == "fifo":
        os.mkfifo(journal)
    elif kind == "link":
        journal.symlink_to(outside)
    elif kind == "directory":
        journal.mkdir()
    else:
        with journal.open("wb") as handle:  # sparse: no disk, though read whole it is 64 MiB
            handle.truncate(64 * 1024 * 1024 + 1)  # answer_journal.MAX_JOURNAL_BYTES + 1
    live = LiveFolds([watched], answer_threads=0)
    with caplog.at_level(logging.WARNING):
        _polled(live)
    assert session_id in live.sessions and live.sessions[session_id].journal is None
    warned = _warnings(caplog, "answers journal set aside")
    assert len(warned) == 1
    reason = {"fifo": "FIFO", "link": "link", "directory": "directory"}.get(kind, "too-large")
    assert warned[0].reason == reason  # type: ignore[attr-defined]
    assert outside.read_bytes() == b"not serve's\n"
    assert _document(live, session_id) == _fresh(path, session_id)
    assert live.files_set_aside() == 0


def test_an_answers_journal_turned_into_a_link_is_not_written_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A journal read as a regular file, then swapped for a link to a file outside before the
    next answer is written: nothing is appended there (one warning); the answer is folded."""
    from sessionfold.streams.runtime.answer_journal import AnswerJournal

    watched = tmp_path / "live"
    path, session_id = _pi(watched, 5, name="a.jsonl")
    journal = AnswerJournal.open(path, writable=True)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"")
    journal.path.symlink_to(outside)
    live = LiveFolds([watched], answer_threads=0)
    live.runtime.answerer = type(live.runtime.answerer)(  # this very journal, as serve holds it
        live.runtime.answerer.port,
        live.runtime.answerer.diff_model,
        live.runtime.answerer.ledger,
        live.runtime.answerer.max_answer_bytes,
        journals=lambda _session: journal,
    )
    with caplog.at_level(logging.WARNING):
        _polled(live)
    assert outside.read_bytes() == b"" and journal.answers  # answered, and kept in memory only
    assert len(_warnings(caplog, "answers journal set aside: no regular file")) == 1
    assert _document(live, session_id) == _fresh(path, session_id)


def test_a_session_file_linked_from_outside_the_watched_folders_is_not_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`b.jsonl` a link to a session file outside the watched folders: not served, one warning
    however often its target grows, counted as set aside; a link to a file inside the folders
    is served; a served file replaced by a link to outside has its session dropped."""
    watched = tmp_path / "live"
    a, a_id = _pi(watched, 5, name="a.jsonl")
    inner, inner_id = _pi(watched / "sub", 6, name="inner.json")  # not *.jsonl itself
    (watched / "c.jsonl").symlink_to(inner)
    outside, outside_id = _pi(tmp_path / "elsewhere", 7, name="b.jsonl")  # not served
    (watched / "b.jsonl").symlink_to(outside)
    live = LiveFolds([watched], journals=False)
    with caplog.at_level(logging.WARNING):
        _polled(live)
        with outside.open("ab") as handle:  # its target grows: looked at again, not served
            handle.write(outside.read_bytes().splitlines(keepends=True)[-1])
        _polled(live)
    assert set(live.sessions) == {a_id, inner_id} and outside_id not in live.sessions
    assert len(_warnings(caplog, "set aside")) == 1 and live.files_set_aside() == 1
    other, _ = _pi(tmp_path / "elsewhere2", 8, name="d.jsonl")
    a.unlink()
    a.symlink_to(other)
    _polled(live)
    assert set(live.sessions) == {inner_id} and _no_rows(live, a_id)
