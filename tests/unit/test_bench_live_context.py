"""bench/live_context.py on tiny settings, so it cannot rot: a real `sessionfold serve` answers
every call of a growing session neither stale nor as a mismatch (the bench's pi arrays are the
file's), and the tables come out."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import orjson
import pytest

# bench/ holds scripts, not a package: its helpers are imported the way the scripts import them.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from live_context import body, main, serving, template

from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.streams.cli.context import view_from_replay
from sessionfold.streams.tools.replay import Collector, replay_files
from sessionfold.streams.tools.synthetic import write_session


def test_pi_arrays_are_the_files_context_at_each_leaf(tmp_path: Path) -> None:
    """The array a call sends is `sessionfold context FILE`'s unpruned one at that leaf."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    tmpl = template(11, 30, every=True, scratch=scratch)
    assert len(tmpl.calls) == len(tmpl.fold_us) == len(tmpl.render_us) > 30
    session_id = str(tmpl.entries[0]["id"])
    for call in tmpl.calls[:: max(1, len(tmpl.calls) // 6)]:
        cut = tmp_path / "cut"
        cut.mkdir(exist_ok=True)
        path = write_session(cut, tmpl.entries[: call.line + 1]).path
        collector = Collector(session_id)
        replayer = replay_files([path], DEFAULT_CONFIG, [session_id], on_folded=collector)
        unpruned = view_from_replay(replayer, collector, DEFAULT_CONFIG).unpruned
        sent = orjson.loads(body(tmpl, call, "messages"))
        assert sent == {"leaf": call.leaf, "messages": unpruned}
        shape = [[m["role"], m.get("toolCallId")] for m in unpruned]
        slim = {"leaf": call.leaf, "answer": "patch", "shape": shape}
        assert orjson.loads(body(tmpl, call, "shape")) == slim


def test_the_bench_runs_on_tiny_settings(capsys: pytest.CaptureFixture[str]) -> None:
    """Two levels over two short sessions: no bad answer, every table printed."""
    code = main(["--levels", "1,2", "--messages", "40", "--distinct", "2", "--poll-ms", "5"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "load average" in out
    lines = out.splitlines()
    header = next(n for n, line in enumerate(lines) if line.split()[:2] == ["N", "calls"])
    rows = [line.split() for line in lines[header + 2 : header + 4]]
    assert [row[0] for row in rows] == ["1", "2"]
    assert all(int(row[1]) > 0 and row[-1] == "0" for row in rows)  # no stale or bad call
    assert "calls by pi's array length" in out


def test_files_written_before_serve_starts_are_caught_up_on_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With `--start-at`, serve folds what the files hold before the timed calls, which are only
    those past that length: none of them stale or a mismatch."""
    code = main(["--levels", "2", "--messages", "60", "--distinct", "2", "--start-at", "30"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    header = next(n for n, line in enumerate(lines) if line.split()[:2] == ["N", "calls"])
    row = lines[header + 2].split()
    assert row[0] == "2" and int(row[1]) > 0 and row[-1] == "0"


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc")
def test_serves_log_goes_to_a_file_no_pipe_left_unread(tmp_path: Path) -> None:
    """serve logs a line per flush answered: into a pipe read only at the end, 64 KB of them
    blocked serve's logging and its fold (a context call hung past 900 s at 200 sessions)."""
    watched = tmp_path / "sessions"
    watched.mkdir()
    with serving(watched, 20, None) as (_url, pid):
        stderr = os.readlink(f"/proc/{pid}/fd/2")
    assert stderr == str(tmp_path / "serve.log")
