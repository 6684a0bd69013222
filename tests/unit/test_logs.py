"""Log lines show the facts of `extra=`: in the CLI, and in the worker's Faust logging."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import orjson
from typer.testing import CliRunner

from sessionfold.streams.cli import app
from sessionfold.streams.logs import FactsFormatter, format_value, record_facts

HEADER = {"type": "session", "version": 3, "id": "s-log", "timestamp": "2025-01-01T00:00:00Z"}
SECRET = "hunter2-do-not-print"


def _record(**extra: object) -> logging.LogRecord:
    logger = logging.getLogger("sessionfold.test")
    return logger.makeRecord(
        logger.name, logging.WARNING, __file__, 1, "dead letter", (), None, extra=extra
    )


def test_formatter_appends_grouped_and_plain_facts() -> None:
    """A group's keys are flattened; values with spaces or controls are quoted as JSON."""
    record = _record(
        dead_letter={"source": "/a b/s.jsonl", "line": 3, "error": "JSONDecodeError"},
        offset=7,
        reason="not JSON",
        session=None,
    )
    line = FactsFormatter().format(record)
    assert line == (
        'WARNING: dead letter source="/a b/s.jsonl" line=3 error=JSONDecodeError offset=7 '
        'reason="not JSON" session=null'
    )


def test_facts_never_hold_a_raw_control_character() -> None:
    """A path with a newline or an escape stays on one line (a terminal sees no raw control)."""
    for value in ("a\nb", "\x1b[2J", "tab\there", "\u202eevil"):
        text = format_value(value)
        assert "\n" not in text and "\x1b" not in text and "\t" not in text
        assert orjson.loads(text) == value


def test_grouped_key_that_collides_keeps_its_group_name() -> None:
    """A group's key never hides a plain fact of the same name."""
    facts = record_facts(_record(offset=1, ledger={"offset": 2}))
    assert facts == {"offset": 1, "ledger.offset": 2}


def test_cli_dead_letter_names_file_line_error_and_reason(tmp_path: Path) -> None:
    """`fold` prints each dead letter with its file, line, error class and reason, no content."""
    path = tmp_path / "s.jsonl"
    path.write_bytes(orjson.dumps(HEADER) + b"\n" + f'{{"type": "{SECRET}"'.encode() + b"\n")
    result = CliRunner().invoke(app, ["fold", str(path), "--json"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if "dead letter" in line]
    assert len(lines) == 1
    assert f"source={path}" in lines[0]
    assert "line=2" in lines[0]
    assert "error=JSONDecodeError" in lines[0]
    assert 'reason="truncated JSON"' in lines[0]
    assert SECRET not in result.stderr


def test_worker_logging_shows_the_facts(tmp_path: Path) -> None:
    """The config the worker hands to Faust's logging setup keeps the facts on each line."""
    script = (
        "import logging\n"
        "from mode.utils.logging import setup_logging\n"
        "from sessionfold.streams.logs import worker_logging_config\n"
        f"setup_logging(loglevel='info', logfile={str(tmp_path / 'w.log')!r},"
        " logging_config=worker_logging_config())\n"
        "logging.getLogger('sessionfold.streams.worker.agents').warning('record dead-lettered',"
        " extra={'topic': 't.session-events', 'partition': 2, 'offset': 41,"
        " 'reason': 'undecodable'})\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    text = (tmp_path / "w.log").read_text()
    assert "record dead-lettered topic=t.session-events partition=2 offset=41" in text
    assert "reason=undecodable" in text


def test_ledger_anomalies_name_file_line_error_and_reason(tmp_path: Path) -> None:
    """`ledger --anomalies` lists each unreadable line by file, line, error class and reason."""
    path = tmp_path / "s.jsonl"
    path.write_bytes(orjson.dumps(HEADER) + b"\n" + f"[{SECRET}\n".encode())
    result = CliRunner().invoke(app, ["ledger", str(path), "--anomalies"])
    assert result.exit_code == 0, result.output
    expected = f"{path}:2 unreadable: JSONDecodeError: not JSON ({len(SECRET) + 1} bytes)"
    assert expected in result.stdout
    assert SECRET not in result.stdout + result.stderr


def test_cli_shows_only_sessionfold_loggers() -> None:
    """A library's log (a Kafka client's retries) stays off the CLI's stderr; ours shows."""
    script = (
        "import logging\n"
        "from sessionfold.streams.logs import configure_cli_logging\n"
        "configure_cli_logging()\n"
        "logging.getLogger('kafka.producer.sender').error('Error sending produce request')\n"
        "logging.getLogger('sessionfold.streams.publishing.publisher').warning('file skipped')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert "file skipped" in result.stderr
    assert "produce request" not in result.stderr
