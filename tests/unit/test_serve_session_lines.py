"""serve's per-session lines (#40 item 7): a line when a session is first served, one per flush
answered, one when a watched path is missing; ids, counts and codes only, never text."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest

from sessionfold.streams.logs import SESSIONS_LOGGER
from sessionfold.streams.runtime.live import LiveFolds
from sessionfold.streams.tools.synthetic import generate_session, write_session

#: The fields a session line may carry besides logging's own.
FACTS = {"session", "sessions", "kind", "file"}


def test_serve_logs_each_session_its_answers_and_what_it_does_not_watch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = write_session(tmp_path, generate_session(5, 60)).path
    watched = tmp_path / "live"
    watched.mkdir()
    (watched / source.name).write_bytes(source.read_bytes())
    missing = tmp_path / "not-there"
    session_id = orjson.loads(source.read_bytes().splitlines()[0])["id"]
    caplog.set_level(logging.INFO, logger=SESSIONS_LOGGER)
    live = LiveFolds([watched, missing])
    live.discover()
    live.discover()  # a missing path is told once
    live.poll()
    live.poll()
    records = [r for r in caplog.records if r.name == SESSIONS_LOGGER]
    messages = [r.getMessage() for r in records]
    assert messages.count("live: a path is not watched: missing") == 1
    assert messages.count("live: a session is served") == 1
    answered = [r for r in records if r.getMessage() == "live: a flush was answered"]
    assert answered and {r.kind for r in answered} <= {"pruning", "ledger"}  # type: ignore[attr-defined]
    assert all(r.session == session_id for r in answered)  # type: ignore[attr-defined]
    served = next(r for r in records if r.getMessage() == "live: a session is served")
    assert (served.session, served.sessions) == (session_id, 1)  # type: ignore[attr-defined]
    text = source.read_text()
    for record in records:
        facts = set(record.__dict__) - set(logging.makeLogRecord({}).__dict__) - {"message"}
        assert facts <= FACTS, facts
        allowed = (session_id, "pruning", "ledger", str(missing))
        for name in facts:
            value = getattr(record, name)
            assert isinstance(value, int) or value in allowed
        assert record.getMessage() not in text
