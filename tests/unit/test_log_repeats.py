"""RepeatFilter: one line per kind per interval from the Kafka clients, counts that add up, and
one recovery line once the failures stop (a broker outage in a fold worker's log)."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.streams.logs import RECOVERED, FactsFormatter, RepeatFilter

INTERVAL_S = 30.0
QUIET_S = 5.0
SECRET = "hunter2-message-text"
#: (logger, line) call sites: three of the clients', one of sessionfold's own.
SITES = [
    ("aiokafka", 435),
    ("aiokafka.consumer.fetcher", 749),
    ("kafka.client", 12),
    ("sessionfold.streams.worker.agents", 99),
]


@dataclass
class Clock:
    """A clock the test moves."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Recoveries:
    """The recovery lines the filter emits, with the time they were emitted at."""

    clock: Clock
    #: Times of the failures judged so far (the one being judged is not in it yet).
    failures: list[float] = field(default_factory=list)
    #: (time, facts, time of the last failure before it)
    lines: list[tuple[float, dict[str, Any], float]] = field(default_factory=list)

    def __call__(self, message: str, facts: dict[str, Any]) -> None:
        assert message == RECOVERED
        self.lines.append((self.clock.now, facts, max(self.failures, default=0.0)))


def _record(site: tuple[str, int], level: int) -> logging.LogRecord:
    name, line = site
    # The text and its arguments may hold anything: nothing of it may reach the added facts.
    return logging.LogRecord(name, level, "x.py", line, "failed: %s", (SECRET,), None)


steps = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=40.0),  # seconds since the previous step
        st.sampled_from(SITES),
        st.sampled_from([logging.INFO, logging.WARNING, logging.ERROR]),
        st.booleans(),  # a tick instead of a record
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_one_line_per_kind_per_interval_counts_add_up_and_recovery_follows(
    sequence: list[tuple[float, tuple[str, int], int, bool]],
) -> None:
    """For any timing: a kind's shown lines are an interval apart, every held record is counted
    once (on the kind's next line or on a recovery line), and once the failures have been quiet
    for the quiet period a recovery line says what was still held."""
    clock = Clock()
    recoveries = Recoveries(clock)
    repeat = RepeatFilter(INTERVAL_S, quiet_s=QUIET_S, clock=clock, emit=recoveries)
    shown: dict[str, list[float]] = {}
    held = 0
    pending = 0  # held since the last recovery line
    told = 0
    failures = recoveries.failures
    for delay, site, level, tick in sequence:
        clock.now += delay
        before = len(recoveries.lines)
        if tick:
            repeat.tick()
            pending = 0 if len(recoveries.lines) > before else pending
            continue
        record = _record(site, level)
        passed = repeat.filter(record)
        pending = 0 if len(recoveries.lines) > before else pending
        if level < logging.WARNING or not repeat.watches(record.name):
            assert passed  # the libraries' info and sessionfold's own lines are never held
            continue
        failures.append(clock.now)
        if passed:
            shown.setdefault(f"{site[0]}:{site[1]}", []).append(clock.now)
            told += getattr(record, "suppressed", 0)
        else:
            held += 1
            pending += 1
        assert repeat.filter(record) == passed  # a second handler gets the same verdict
    clock.now += QUIET_S + 1
    before = len(recoveries.lines)
    repeat.tick()
    for times in shown.values():
        assert all(b - a >= INTERVAL_S for a, b in itertools.pairwise(times))
    told += sum(facts["suppressed"] for _, facts, _ in recoveries.lines)
    assert told == held
    for at, facts, last_failure in recoveries.lines:
        assert sum(facts["kinds"].values()) == facts["suppressed"]
        assert at - last_failure >= QUIET_S  # never while the failures go on
        assert SECRET not in repr(facts)
    # The failures stopped: a recovery line comes when anything was held since the last one,
    # and none for a lone failure (nothing held).
    assert len(recoveries.lines) - before == (1 if pending else 0)


def test_an_outage_logs_its_first_line_the_count_then_the_recovery() -> None:
    """100 connection failures a second for 70 s: three lines of the kind, then the all-clear
    with the count of the last interval; the text appears only where the library put it."""
    clock = Clock()
    recoveries = Recoveries(clock)
    repeat = RepeatFilter(INTERVAL_S, clock=clock, emit=recoveries)
    lines = []
    for step in range(7000):
        clock.now = step / 100
        record = _record(SITES[0], logging.ERROR)
        if repeat.filter(record):
            lines.append(FactsFormatter().format(record))
    clock.now += 10
    repeat.tick()
    assert len(lines) == 3
    assert "suppressed" not in lines[0]
    assert lines[1].endswith("suppressed=2999 kind=aiokafka:435")
    assert lines[2].endswith("suppressed=2999 kind=aiokafka:435")
    assert [facts for _, facts, _ in recoveries.lines] == [
        {"seconds": 70.0, "logged": 7000, "suppressed": 999, "kinds": {"aiokafka:435": 999}}
    ]


def test_the_recovery_line_goes_through_the_handlers_it_guards() -> None:
    """On a logger's handlers, the filter holds repeats and the recovery line reaches them."""
    clock = Clock()
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    top = logging.getLogger("test_log_repeats")
    top.propagate = False
    top.addHandler(Keep())
    repeat = RepeatFilter(INTERVAL_S, clock=clock, loggers=("test_log_repeats",))
    repeat.attach(top)
    recovery_logger = logging.getLogger("sessionfold.streams.logs")
    recovery_logger.addHandler(top.handlers[0])
    try:
        client = logging.getLogger("test_log_repeats.aiokafka")
        for step in range(50):
            clock.now = step / 10
            client.error("Unable connect to node with id %s", 1)
        clock.now += QUIET_S
        repeat.tick()
    finally:
        recovery_logger.removeHandler(top.handlers[0])
        top.handlers.clear()
    assert [r.getMessage() for r in seen] == ["Unable connect to node with id 1", RECOVERED]
    assert seen[1].__dict__["recovery"]["suppressed"] == 49
