"""Log formatting that shows the facts a record carries in `extra=`.

Every log call of sessionfold puts its facts (ids, offsets, counts, sizes, reason codes; never
message text, tool output or rule words) in `extra=`, often grouped under one name
(`extra={"dead_letter": {...}}`). The standard formatters drop them; `FactsFormatter` appends
them as `key=value` pairs, a group's keys flattened, so a line reads
`WARNING: dead letter source=s.jsonl line=3 error=JSONDecodeError reason="not JSON" size=9`.
The CLI installs it on stderr (`configure_cli_logging`); the worker hands it to Faust's logging
setup (`worker_logging_config`).

While a broker is away the Kafka client libraries retry several times a second and log each
failure (a fold worker wrote 12,090 lines in a 200 s outage). `RepeatFilter`, on the worker's
handlers, lets one warning or error of each kind (one logging call site) through per interval,
adds `suppressed=N` to it for the ones held back since, and logs one line when they stop.
"""

from __future__ import annotations

import atexit
import json
import logging
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
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
    if any(isinstance(handler, _STDERR_HANDLERS) for handler in root.handlers):
        return
    handler = _StderrHandler()
    handler.setFormatter(FactsFormatter(CLI_FORMAT))
    handler.setLevel(level)
    handler.addFilter(logging.Filter("sessionfold"))
    root.addHandler(handler)


#: serve's per-session lines (a session first served, a flush answered, a path not watched):
#: ids, counts and codes, never text. Shown at INFO once `show_session_lines` ran.
SESSIONS_LOGGER = "sessionfold.sessions"


def show_session_lines() -> None:
    """Send `SESSIONS_LOGGER`'s lines, INFO and up, to stderr with their facts; once."""
    logger = logging.getLogger(SESSIONS_LOGGER)
    if any(isinstance(handler, _STDERR_HANDLERS) for handler in logger.handlers):
        return
    handler = _StderrHandler()
    handler.setFormatter(FactsFormatter(CLI_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # its warnings too go out once, through this handler


#: Log lines held for a stderr that does not take them (a pipe nobody reads); past this, lines
#: are dropped and counted, and the count is written once stderr takes lines again.
MAX_HELD_LINES = 10_000
#: How long a process' exit waits for its held lines to be written.
EXIT_FLUSH_S = 1.0


class _StderrWriter:
    """Writes log lines to stderr from a thread of its own, so that a stderr that blocks (a
    pipe nobody reads fills at 64 KB) holds up that thread only, never one that logs: serve's
    fold logs under its lock, and a blocked write there stalled every session."""

    def __init__(self, on_start: Callable[[], None] | None = None) -> None:
        self._lines: deque[str] = deque()
        self._ready = threading.Condition()
        self._pending = 0  # lines taken and not yet written
        self.dropped = 0
        self._on_start = on_start
        threading.Thread(target=self._run, name="stderr-writer", daemon=True).start()
        atexit.register(self.flush, EXIT_FLUSH_S)

    def put(self, line: str) -> None:
        """Hold `line` for the writer; drop it (counted) when too many are held already."""
        with self._ready:
            if len(self._lines) >= MAX_HELD_LINES:
                self.dropped += 1
                return
            self._lines.append(line)
            self._pending += 1
            self._ready.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for every line held to be written; whether they were."""
        with self._ready:
            return self._ready.wait_for(lambda: self._pending == 0, timeout_s)

    def _run(self) -> None:
        if self._on_start is not None:
            self._on_start()
        while True:
            with self._ready:
                self._ready.wait_for(lambda: bool(self._lines))
                lines = list(self._lines)
                self._lines.clear()
                dropped, self.dropped = self.dropped, 0
            text = "".join(lines)
            if dropped:
                text += f"WARNING: log lines dropped: stderr was not read dropped={dropped}\n"
            try:
                sys.stderr.write(text)
                sys.stderr.flush()
            except (OSError, ValueError):
                pass  # a closed stderr: nothing to tell it
            with self._ready:
                self._pending -= len(lines)
                self._ready.notify_all()


class _BackgroundStderrHandler(logging.Handler):
    """A `_StderrHandler` whose lines are written by `_StderrWriter`'s thread."""

    def __init__(self, writer: _StderrWriter) -> None:
        super().__init__()
        self.writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        """Format the record now (its facts as they are) and hand the line to the writer."""
        try:
            line = self.format(record) + "\n"
        except Exception:
            self.handleError(record)
            return
        self.writer.put(line)


_writer: _StderrWriter | None = None
#: The handlers that write to stderr, in the caller's thread or the writer's.
_STDERR_HANDLERS = (_StderrHandler, _BackgroundStderrHandler)


def write_stderr_in_background(on_start: Callable[[], None] | None = None) -> None:
    """From now on, this process' log lines to stderr (`configure_cli_logging`,
    `show_session_lines`) are written by a thread of their own: a long-running process (serve)
    never blocks on a stderr nobody reads. Once per process; `on_start` runs first in that
    thread (serve's fold process lowers its priority)."""
    global _writer
    if _writer is None:
        _writer = _StderrWriter(on_start)
    for logger in (logging.getLogger(), logging.getLogger(SESSIONS_LOGGER)):
        for handler in list(logger.handlers):
            if not isinstance(handler, _StderrHandler):
                continue
            background = _BackgroundStderrHandler(_writer)
            background.setFormatter(handler.formatter)
            background.setLevel(handler.level)
            for found in handler.filters:
                background.addFilter(found)
            logger.removeHandler(handler)
            logger.addHandler(background)


def worker_logging_config() -> dict[str, Any]:
    """A logging config Faust's worker merges into its own: its formatters show the facts."""
    formatter = {"()": f"{__name__}.FactsFormatter", "fmt": WORKER_FORMAT}
    return {"merge": True, "formatters": {"default": formatter, "colored": dict(formatter)}}


#: Loggers (and their children) of the Kafka client libraries, whose retries repeat a warning or
#: an error several times a second for as long as a broker is away.
CLIENT_LOGGERS = ("aiokafka", "kafka", "faust", "mode")
DEFAULT_REPEAT_INTERVAL_S = 30.0
#: Longest quiet the recovery line waits for: the clients retry every 0.1 s or so while a broker
#: is away, so a few seconds without a failure means they reach it again.
MAX_QUIET_S = 5.0
#: What the recovery line says; a test looks for it.
RECOVERED = "kafka clients recovered"
_VERDICT = "_sessionfold_repeat"  # the filter's verdict on a record, for its other handlers


@dataclass
class _Kind:
    """One kind of repeated record: when its last line went out, how many were held back since."""

    shown_at: float
    suppressed: int = 0


class RepeatFilter(logging.Filter):
    """At most one warning or error per kind (logger and line) per interval from the client
    libraries; the line that ends a hold says how many it held (`suppressed=`), and once they
    have been quiet for `quiet_s`, one line says they recovered and what was still held back.

    One instance may sit on several handlers: a record is judged once. The recovery line needs
    a record or a `tick()` after the quiet; the worker ticks it every second.
    """

    def __init__(
        self,
        interval_s: float = DEFAULT_REPEAT_INTERVAL_S,
        quiet_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        loggers: tuple[str, ...] = CLIENT_LOGGERS,
        emit: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.quiet_s = min(interval_s, MAX_QUIET_S) if quiet_s is None else quiet_s
        self._clock = clock
        self._loggers = loggers
        self._emit = emit or _log_recovery
        self._lock = threading.Lock()
        self._kinds: dict[str, _Kind] = {}
        #: The current run of failures: when it began, the last one, records, records held.
        self._began: float | None = None
        self._last = 0.0
        self._records = 0
        self._held = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether the record goes out: a held repeat does not; a line that ends a hold says
        how many it held."""
        verdict = getattr(record, _VERDICT, None)
        if verdict is not None:
            return bool(verdict)
        verdict = self._judge(record)
        setattr(record, _VERDICT, verdict)
        return verdict

    def tick(self) -> None:
        """Log the recovery line if the failures have been quiet long enough."""
        with self._lock:
            recovery = self._recovery(self._clock())
        if recovery is not None:
            self._emit(RECOVERED, recovery)

    def attach(self, logger: logging.Logger) -> None:
        """Put this filter on every handler of `logger` (the root: the libraries' records
        propagate to its handlers; a filter on a logger would miss its children's)."""
        for handler in logger.handlers:
            handler.addFilter(self)

    def watches(self, name: str) -> bool:
        """Whether records of the logger `name` are limited."""
        return any(name == root or name.startswith(root + ".") for root in self._loggers)

    def _judge(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not self.watches(record.name):
            self.tick()
            return True
        now = self._clock()
        kind = f"{record.name}:{record.lineno}"  # a call site: a code, never the text
        with self._lock:
            recovery = self._recovery(now)
            if self._began is None:
                self._began = now
            self._last = now
            self._records += 1
            seen = self._kinds.get(kind)
            if seen is not None and now - seen.shown_at < self.interval_s:
                seen.suppressed += 1
                self._held += 1
                shown = False
            else:
                if seen is not None and seen.suppressed:
                    record.suppressed = seen.suppressed
                    record.kind = kind
                self._kinds[kind] = _Kind(shown_at=now)
                shown = True
        if recovery is not None:
            self._emit(RECOVERED, recovery)
        return shown

    def _recovery(self, now: float) -> dict[str, Any] | None:
        """End the run of failures if it has been quiet for `quiet_s`; the recovery line's
        facts when it held anything back (a lone failure needs no all-clear)."""
        if self._began is None or now - self._last < self.quiet_s:
            return None
        counts = {kind: seen.suppressed for kind, seen in self._kinds.items() if seen.suppressed}
        facts: dict[str, Any] | None = None
        if self._held:
            facts = {
                "seconds": round(self._last - self._began, 1),
                "logged": self._records,
                "suppressed": sum(counts.values()),
                "kinds": counts,
            }
        for seen in self._kinds.values():
            seen.suppressed = 0  # told now; the interval per kind still runs
        self._began, self._records, self._held = None, 0, 0
        return facts


def _log_recovery(message: str, facts: dict[str, Any]) -> None:
    # A warning, so that it shows at the levels that showed the failures.
    logging.getLogger(__name__).warning(message, extra={"recovery": facts})
