"""The ledger log (seeds/002, "The log") and `sessionfold report`: codes and counts only, a 0600
file in a 0700 directory, rotation with one backup, no symlink or non-regular writes, failures
that never touch a pass, and a digest safe to paste into an issue."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, json_answer
from typer.testing import CliRunner

from sessionfold.streams.cli import app
from sessionfold.streams.runtime.ledger_log import (
    LedgerLog,
    LogObserver,
    default_log_path,
    error_fields,
    log_path,
    read_path,
)

RUNNER = CliRunner()
SECRETS = ("SECRET-RULE-WORDS", "SECRET-COMMAND", "SECRET-OUTPUT", "SECRET-NARRATIVE")


def mode(path: Path) -> int:
    """Permission bits of a path."""
    return stat.S_IMODE(os.stat(path).st_mode)


def lines(path: Path) -> list[dict[str, Any]]:
    """The records of a log file."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_session(path: Path) -> Path:
    """A session with secret words in a user rule, a command and its output, and a pi
    compaction, so the ledger makes two passes."""
    entries: list[dict[str, Any]] = [
        {"type": "session", "version": 3, "id": "log-sess", "timestamp": "t", "cwd": "/w/proj"},
    ]
    said = [{"type": "text", "text": "never push SECRET-RULE-WORDS to main"}]
    call = {
        "type": "toolCall",
        "id": "t1",
        "name": "bash",
        "arguments": {"command": "echo SECRET-COMMAND"},
    }
    result = {
        "role": "toolResult",
        "toolCallId": "t1",
        "toolName": "bash",
        "content": [{"type": "text", "text": "SECRET-OUTPUT\n\nCommand exited with code 1"}],
        "isError": True,
    }
    bodies: list[dict[str, Any]] = [
        {"type": "message", "message": {"role": "user", "content": said}},
        {"type": "message", "message": {"role": "assistant", "content": [call]}},
        {"type": "message", "message": result},
        {"type": "compaction", "summary": "pi's own SECRET-SUMMARY", "tokensBefore": 7},
        {"type": "message", "message": {"role": "user", "content": said}},
    ]
    parent = None
    for index, body in enumerate(bodies, start=1):
        entries.append({"id": f"{index:08x}", "parentId": parent, "timestamp": "t", **body})
        parent = entries[-1]["id"]
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return path


# --- where, and how safely --------------------------------------------------------------------


def test_the_path_comes_from_the_environment_and_off_values_disable_it(tmp_path: Path) -> None:
    """Unset: the session's own file in the state dir; a path: that path; off, none, 0, false,
    no or empty: no log."""
    env = {"HOME": "/h", "XDG_STATE_HOME": "/s"}
    assert log_path(env, "abc-1") == Path("/s/sessionfold/ledger/abc-1.jsonl")
    assert log_path(env) == Path("/s/sessionfold/ledger/no-session.jsonl")
    hashed = log_path(env, "../../etc/passwd")
    assert hashed is not None and hashed.parent == Path("/s/sessionfold/ledger")
    assert hashed.name.startswith("s-") and hashed.suffix == ".jsonl"
    assert read_path(env) == Path("/s/sessionfold/ledger")
    assert default_log_path({}).parts[-3:] == ("state", "sessionfold", "ledger.jsonl")
    assert read_path({"SESSIONFOLD_LEDGER_LOG": str(tmp_path / "x.jsonl")}) == tmp_path / "x.jsonl"
    assert log_path({"SESSIONFOLD_LEDGER_LOG": str(tmp_path / "x.jsonl")}, "abc") == (
        tmp_path / "x.jsonl"
    )
    assert log_path({"SESSIONFOLD_LEDGER_LOG": str(tmp_path / "x.jsonl")}) == tmp_path / "x.jsonl"
    for off in ("off", "NONE", "0", "false", "no", "", "  "):
        assert log_path({"SESSIONFOLD_LEDGER_LOG": off}) is None
    assert LedgerLog(None).write({"event": "x"}) is False


def test_a_new_log_is_0600_in_a_0700_directory(tmp_path: Path) -> None:
    """Whatever the umask, the directory it creates is 0700 and the file 0600."""
    old = os.umask(0o022)
    try:
        log = LedgerLog(tmp_path / "a" / "b" / "ledger.jsonl")
        assert log.write({"event": "run"})
    finally:
        os.umask(old)
    assert mode(tmp_path / "a" / "b") == 0o700
    assert mode(tmp_path / "a" / "b" / "ledger.jsonl") == 0o600
    [record] = lines(tmp_path / "a" / "b" / "ledger.jsonl")
    assert record["event"] == "run" and record["v"] == 1 and "time" in record


def test_an_existing_log_is_tightened_to_0600(tmp_path: Path) -> None:
    """A log file someone made readable is set back to 0600 on the next write."""
    path = tmp_path / "ledger.jsonl"
    path.write_text("")
    path.chmod(0o644)
    assert LedgerLog(path).write({"event": "run"})
    assert mode(path) == 0o600


def test_the_log_rotates_to_one_backup(tmp_path: Path) -> None:
    """Past the size, the file becomes `.1` (replacing an older one) and a new file starts."""
    path = tmp_path / "ledger.jsonl"
    log = LedgerLog(path, rotate_bytes=300)
    for n in range(12):
        assert log.write({"event": "compaction", "span": n})
    backup = path.with_name("ledger.jsonl.1")
    assert path.stat().st_size <= 300 and backup.stat().st_size <= 300
    assert not path.with_name("ledger.jsonl.2").exists()
    spans = [r["span"] for r in lines(backup)] + [r["span"] for r in lines(path)]
    assert spans == list(range(spans[0], 12))  # in order, the oldest rotated away
    assert mode(backup) == 0o600


def test_the_default_rotation_size_is_five_megabytes() -> None:
    """The seed's size."""
    assert LedgerLog(None).rotate_bytes == 5 * 1024 * 1024


def test_a_symlinked_log_is_never_written_through(tmp_path: Path) -> None:
    """A symlink at the log path (or as its directory) is refused; its target is untouched."""
    target = tmp_path / "target.txt"
    target.write_text("keep\n")
    link = tmp_path / "ledger.jsonl"
    link.symlink_to(target)
    log = LedgerLog(link)
    assert log.write({"event": "run"}) is False
    assert target.read_text() == "keep\n" and log.failed == 1
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    (tmp_path / "linked").symlink_to(real_dir)
    assert LedgerLog(tmp_path / "linked" / "ledger.jsonl").write({"event": "run"}) is False
    assert list(real_dir.iterdir()) == []


def test_a_symlinked_directory_below_the_state_root_is_never_followed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The state root's `sessionfold` directory as a symlink to a directory elsewhere, the log
    one level deeper: refused with the reason `symlink`, warned about once, nothing created or
    written outside the root."""
    state = tmp_path / "state"
    outside = tmp_path / "outside"
    outside.mkdir()
    state.mkdir()
    (state / "sessionfold").symlink_to(outside, target_is_directory=True)
    env = {
        "XDG_STATE_HOME": str(state),
        "SESSIONFOLD_LEDGER_LOG": str(state / "sessionfold" / "logs" / "ledger.jsonl"),
    }
    log = LedgerLog.from_env(env)
    assert log.write({"event": "run"}) is False and log.write({"event": "run"}) is False
    assert list(outside.iterdir()) == []
    assert (log.last_error, log.failed, log.root) == ("symlink", 2, state)
    warnings = [r.getMessage() for r in caplog.records if r.name.endswith("ledger_log")]
    assert warnings == ["ledger log not written: symlink"]


def test_a_symlinked_state_root_itself_is_trusted(tmp_path: Path) -> None:
    """Above the root the user's own layout is trusted (a home or state dir may be a link)."""
    real = tmp_path / "real-state"
    real.mkdir()
    (tmp_path / "state").symlink_to(real, target_is_directory=True)
    log = LedgerLog.from_env({"XDG_STATE_HOME": str(tmp_path / "state")})
    assert log.write({"event": "run"}), log.last_error
    assert [r["event"] for r in lines(real / "sessionfold/ledger/no-session.jsonl")] == ["run"]


def test_a_hard_linked_log_is_never_appended_to(tmp_path: Path) -> None:
    """A log file with another name elsewhere (st_nlink 2) is refused, and not rotated."""
    elsewhere = tmp_path / "someone-elses.txt"
    elsewhere.write_text("keep\n")
    path = tmp_path / "logs" / "ledger.jsonl"
    path.parent.mkdir()
    os.link(elsewhere, path)
    log = LedgerLog(path, rotate_bytes=10)
    assert log.write({"event": "run"}) is False and log.last_error == "hard-linked"
    assert elsewhere.read_text() == "keep\n" and path.read_text() == "keep\n"
    assert not path.with_name("ledger.jsonl.1").exists()


def test_every_directory_the_log_creates_is_0700(tmp_path: Path) -> None:
    """A missing state root and the directories below it are all created 0700 under a loose
    umask; the file lands only below the root."""
    state = tmp_path / "no" / "state"
    old = os.umask(0o002)
    try:
        log = LedgerLog.from_env({"XDG_STATE_HOME": str(state)})
        assert log.write({"event": "run"}), log.last_error
    finally:
        os.umask(old)
    for directory in (tmp_path / "no", state, state / "sessionfold", state / "sessionfold/ledger"):
        assert mode(directory) == 0o700, directory
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written == [state / "sessionfold" / "ledger" / "no-session.jsonl"]


def test_a_non_regular_log_path_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO (with no reader) or a directory at the log path: refused, at once."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert LedgerLog(fifo).write({"event": "run"}) is False
    directory = tmp_path / "dir.jsonl"
    directory.mkdir()
    assert LedgerLog(directory).write({"event": "run"}) is False


def test_a_failed_write_never_affects_a_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the log path unwritable, `sessionfold ledger` prints the same state, exit 0."""
    session = write_session(tmp_path / "s.jsonl")
    monkeypatch.setenv("SESSIONFOLD_LEDGER_LOG", "off")
    quiet = RUNNER.invoke(app, ["ledger", str(session), "--json"])
    (tmp_path / "blocked").write_text("a file where the log directory should be")
    monkeypatch.setenv("SESSIONFOLD_LEDGER_LOG", str(tmp_path / "blocked" / "ledger.jsonl"))
    failing = RUNNER.invoke(app, ["ledger", str(session), "--json"])
    assert failing.exit_code == 0, failing.output
    assert failing.stdout == quiet.stdout


def test_an_observer_that_throws_is_counted_and_ignored(tmp_path: Path) -> None:
    """The driver swallows an observer's exception: the pass and its payload are unchanged."""
    from sessionfold.events.envelope import CompactRequestEnvelope, EntryEnvelope, EntryPayload
    from sessionfold.ports.ledger.model import OfflineModel
    from sessionfold.streams.runtime.ledger_loop import EmbeddedLedger

    class Broken:
        def started(self, request: Any) -> None:
            raise OSError("disk full")

        finished = failed = started

    ledger = EmbeddedLedger(OfflineModel(), observer=Broken())  # type: ignore[arg-type]
    content = [{"type": "text", "text": "never push"}]
    entry = {"id": "e1", "type": "message", "message": {"role": "user", "content": content}}
    ledger.feed(EntryEnvelope(session_id="s", seq=1, payload=EntryPayload(entry=entry)))
    ledger.feed(CompactRequestEnvelope(session_id="s", seq=2))
    assert ledger.payloads[0]["record"]["counts"]["rules"] == 1
    assert ledger.observer_errors == 2


# --- what it says -----------------------------------------------------------------------------


def test_records_carry_codes_and_counts_never_message_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run over a session full of secret words, offline and over HTTP with a model whose
    narrative is secret too: the log names events, ids and counts, and no secret."""
    path = tmp_path / "log" / "ledger.jsonl"
    monkeypatch.setenv("SESSIONFOLD_LEDGER_LOG", str(path))
    session = write_session(tmp_path / "s.jsonl")
    assert RUNNER.invoke(app, ["ledger", str(session)]).exit_code == 0
    answer = {
        "labels": [{"message": "u1", "label": "rule"}, {"message": "u2", "label": "rule"}],
        "narrative": "SECRET-NARRATIVE",
        "now": "SECRET-NARRATIVE",
        "decisions": [{"text": "SECRET-NARRATIVE", "evidence": ["C1"]}],
    }
    with FakeOpenAI(json_answer(answer)) as fake:
        monkeypatch.setenv("SESSIONFOLD_MODEL_BASE_URL", fake.base_url)
        result = RUNNER.invoke(app, ["ledger", "compact", str(session), "--model", "m"])
        assert result.exit_code == 0, result.output
    text = path.read_text()
    assert not [secret for secret in (*SECRETS, "SECRET-SUMMARY") if secret in text]
    events = [r["event"] for r in lines(path)]
    assert events[:4] == ["run", "compacted", "compaction", "compaction"]
    assert events.count("run") == 2
    compaction = lines(path)[-1]
    assert compaction["model"] == "m" and compaction["narrative"]["kind"] == "model"
    assert compaction["narrative"]["accepted"] >= 1 and compaction["summaryChars"] > 0
    assert compaction["session"]["id"] == "log-sess" and compaction["session"]["cwd"] == "/w/proj"
    assert isinstance(compaction["durationMs"], int)


def test_a_pass_that_throws_writes_a_fallback_record() -> None:
    """`failed` writes event, reason and error class; another library's message is left out."""
    written: list[dict[str, Any]] = []

    class Memory(LedgerLog):
        def write(self, record: dict[str, Any]) -> bool:
            written.append(record)
            return True

    observer = LogObserver(Memory(None), {"id": "s"})
    observer.failed({"span": 2, "request": "s/ledger/9"}, KeyError("SECRET-RULE-WORDS"))
    [record] = written
    assert (record["event"], record["span"], record["errorClass"]) == ("fallback", 2, "KeyError")
    assert record["error"] is None
    from sessionfold.ports.ledger_http import DiffModelError

    assert error_fields(DiffModelError("unusable:schema"))["error"] == (
        "diff call failed: unusable:schema"
    )


def test_an_interrupted_run_writes_an_aborted_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during a pass: an `aborted` record naming the pass, exit 130."""
    from sessionfold.streams.runtime import step

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("SESSIONFOLD_LEDGER_LOG", str(path))
    monkeypatch.setattr(step, "run_pass", interrupted)
    result = RUNNER.invoke(app, ["ledger", str(write_session(tmp_path / "s.jsonl"))])
    assert result.exit_code == 130
    aborted = lines(path)[-1]
    assert (aborted["event"], aborted["span"], aborted["reason"]) == ("aborted", 1, "interrupted")
    assert aborted["errorClass"] == "KeyboardInterrupt"


# --- sessionfold report -----------------------------------------------------------------------


def test_report_digests_the_newest_eight_records_with_paths_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight newest records (the backup read when the file has fewer), ids and paths hashed,
    home as ~, unknown fields and free text left out."""
    home = str(Path.home())
    path = tmp_path / "ledger.jsonl"
    log = LedgerLog(path, rotate_bytes=1_500)
    session = {"id": "sess-1", "cwd": f"{home}/work/secret-project", "file": "/data/s.jsonl"}
    for n in range(12):
        log.write(
            {
                "event": "compaction",
                "span": n,
                "session": {**session, "model": "offline"},
                "narrative": {"kind": "model", "calls": 1, "accepted": 2, "dropped": {"x": 1}},
                "note": "free text the digest does not know",
                "reason": "has spaces and text",
            }
        )
    log.write({"event": "fallback", "errorClass": "OSError", "error": f"no {home}/a/b.txt here"})
    assert path.with_name("ledger.jsonl.1").exists()
    result = RUNNER.invoke(app, ["report", "--log", str(path), "--json"])
    assert result.exit_code == 0, result.output
    digest = json.loads(result.stdout)
    records = digest["records"]
    assert len(records) == 8 and records[-1]["event"] == "fallback"
    assert [r["span"] for r in records[:-1]] == list(range(5, 12))
    out = result.stdout
    for leaked in ("secret-project", "sess-1", "/data/s.jsonl", home, "free text", "has spaces"):
        assert leaked not in out
    first = records[0]
    assert first["cwd"].startswith("~/…#") and first["file"].startswith("/…#")
    assert first["reason"] == "?" and "note" not in first
    assert records[-1]["error"].startswith("no ~") and "/a/b.txt" not in records[-1]["error"]
    human = RUNNER.invoke(app, ["report", "--log", str(path)])
    assert human.exit_code == 0 and "the 8 newest records" in human.stdout
    assert "secret-project" not in human.stdout


def test_report_without_a_log_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An off log and no --log: exit 1 with the reason; a symlinked log is not read."""
    monkeypatch.setenv("SESSIONFOLD_LEDGER_LOG", "off")
    assert RUNNER.invoke(app, ["report"]).exit_code == 1
    target = tmp_path / "real.jsonl"
    LedgerLog(target).write({"event": "run"})
    (tmp_path / "link.jsonl").symlink_to(target)
    result = RUNNER.invoke(app, ["report", "--log", str(tmp_path / "link.jsonl")])
    assert result.exit_code == 1 and "cannot read the ledger log" in result.output
    empty = RUNNER.invoke(app, ["report", "--log", str(tmp_path / "none.jsonl"), "--json"])
    assert json.loads(empty.stdout)["records"] == []


def test_report_names_the_log_it_read_and_filters_by_project(tmp_path: Path) -> None:
    """Runs of two projects in one log: the digest counts both and says so, names the log on
    stderr (home as ~), and `--cwd` keeps one project's records (its subdirectories too)."""
    alpha, beta = tmp_path / "alpha", tmp_path / "beta"
    (alpha / "sub").mkdir(parents=True)
    beta.mkdir()
    path = tmp_path / "ledger.jsonl"
    log = LedgerLog(path)
    for span, cwd in enumerate([alpha, beta, alpha / "sub", beta, beta]):
        log.write({"event": "compaction", "span": span, "session": {"id": "s", "cwd": str(cwd)}})
    everything = RUNNER.invoke(app, ["report", "--log", str(path), "--json"])
    assert everything.exit_code == 0, everything.output
    assert f"reading {path}" in everything.stderr
    digest = json.loads(everything.stdout)
    assert (digest["projects"], digest["project"], len(digest["records"])) == (3, None, 5)
    for flag in ("--cwd", "--project"):
        only = RUNNER.invoke(app, ["report", "--log", str(path), "--json", flag, str(alpha)])
        assert only.exit_code == 0, only.output
        filtered = json.loads(only.stdout)
        assert [r["span"] for r in filtered["records"]] == [0, 2]
        assert filtered["project"].startswith("/…#") and str(alpha) not in only.stdout
    human = RUNNER.invoke(app, ["report", "--log", str(path)])
    assert "several projects share this log" in human.stderr
    assert "span 3" in human.stdout


def test_each_session_has_its_own_log_and_report_reads_them_all_and_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#40 item 7: with the log unset, `sessionfold ledger` writes the session's own file under
    the state directory, not one file for every run on the machine; `sessionfold report`
    reads the per-session files and the single file older versions wrote, newest records
    first by time."""
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    monkeypatch.delenv("SESSIONFOLD_LEDGER_LOG", raising=False)
    old = LedgerLog(state / "sessionfold" / "ledger.jsonl", clock=lambda: 1.0)
    old.write({"event": "run", "command": "ledger", "session": {"id": "old", "cwd": "/w/old"}})
    first = write_session(tmp_path / "first.jsonl")
    second = tmp_path / "second.jsonl"
    second.write_text(first.read_text().replace('"log-sess"', '"other-sess"'))
    for path in (first, second):
        assert RUNNER.invoke(app, ["ledger", str(path)]).exit_code == 0
    logs = state / "sessionfold" / "ledger"
    assert sorted(p.name for p in logs.iterdir()) == ["log-sess.jsonl", "other-sess.jsonl"]
    assert mode(logs) == 0o700 and mode(logs / "log-sess.jsonl") == 0o600
    assert {r["session"]["id"] for r in lines(logs / "other-sess.jsonl")} == {"other-sess"}
    assert [r["event"] for r in lines(state / "sessionfold" / "ledger.jsonl")] == ["run"]
    result = RUNNER.invoke(app, ["report", "--json"])
    assert result.exit_code == 0, result.output
    assert f"reading {logs}" in result.stderr
    records = json.loads(result.stdout)["records"]
    assert len(records) == 8 and records[-1]["event"] == "compaction"
    times = [r["time"] for r in records]
    assert times == sorted(times)
    everything = RUNNER.invoke(app, ["report", "--json", "--cwd", "/w/old"])
    assert [r["event"] for r in json.loads(everything.stdout)["records"]] == ["run"]
