"""Log formatting that shows the facts a record carries in `extra=`.

Every log call of sessionfold puts its facts (ids, offsets, counts, sizes, reason codes; never
message text, tool output or rule words) in `extra=`, often grouped under one name
(`extra={"dead_letter": {...}}`). The standard formatters drop them; `FactsFormatter` appends
them as `key=value` pairs, a group's keys flattened, so a line reads
`WARNING: dead letter source=s.jsonl line=3 error=JSONDecodeError reason="not JSON" size=9`.
The CLI installs it on stderr (`configure_cli_logging`); the worker hands it to Faust's logging
setup (`worker_logging_config`).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Any

#: Attributes every LogRecord has, or that formatters add: everything else came from `extra=`.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "extra",  # mode's formatters set it
    "log_color",  # colorlog's
    "taskName",
}
_PLAIN = re.compile(r"[\w.,:/@+\-]+")

CLI_FORMAT = "%(levelname)s: %(message)s"
WORKER_FORMAT = "[%(asctime)s] [%(process)s] [%(levelname)s]: %(message)s"


def record_facts(record: logging.LogRecord) -> dict[str, Any]:
    """The facts a record carries in `extra=`, one level of grouping flattened."""
    facts: dict[str, Any] = {}
    for key, value in record.__dict__.items():
        if key in _STANDARD or key.startswith("_"):
            continue
        if isinstance(value, dict):
            for inner, item in value.items():
                # A group's keys stand alone unless one would hide a fact of the same name.
                name = str(inner) if str(inner) not in record.__dict__ else f"{key}.{inner}"
                facts[name] = item
        else:
            facts[key] = value
    return facts


def format_value(value: Any) -> str:
    """A fact as text: plain tokens as they are, anything else JSON-quoted (no raw controls)."""
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)
    if isinstance(value, str) and _PLAIN.fullmatch(value):
        return value
    if isinstance(value, str):
        return json.dumps(value)
    return json.dumps(value, default=str, separators=(",", ":"))


def format_facts(facts: dict[str, Any]) -> str:
    """`key=value` pairs separated by spaces, in the order given."""
    return " ".join(f"{key}={format_value(value)}" for key, value in facts.items())


class FactsFormatter(logging.Formatter):
    """A formatter that appends the record's `extra=` facts as `key=value` pairs."""

    def __init__(self, fmt: str = CLI_FORMAT, datefmt: str | None = None) -> None:
        super().__init__(fmt=fmt, datefmt=datefmt)

    def format(self, record: logging.LogRecord) -> str:
        """The standard line, then the facts (if any) after one space."""
        text = super().format(record)
        facts = format_facts(record_facts(record))
        if not facts:
            return text
        head, newline, rest = text.partition("\n")  # a traceback stays below the facts
        return f"{head} {facts}{newline}{rest}"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is at the time (a test runner swaps it)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass  # always the current sys.stderr


def configure_cli_logging(level: int = logging.WARNING) -> None:
    """Send sessionfold's warnings and errors to stderr with their facts; once per process.

    Only sessionfold's own loggers are shown: a command reports a library's failure (a Kafka
    client's retries and cancelled requests) itself, in one line, so their logs would only
    repeat it.
    """
    root = logging.getLogger()
    if any(isinstance(handler, _StderrHandler) for handler in root.handlers):
        return
    handler = _StderrHandler()
    handler.setFormatter(FactsFormatter(CLI_FORMAT))
    handler.setLevel(level)
    handler.addFilter(logging.Filter("sessionfold"))
    root.addHandler(handler)


def worker_logging_config() -> dict[str, Any]:
    """A logging config Faust's worker merges into its own: its formatters show the facts."""
    formatter = {"()": f"{__name__}.FactsFormatter", "fmt": WORKER_FORMAT}
    return {"merge": True, "formatters": {"default": formatter, "colored": dict(formatter)}}
