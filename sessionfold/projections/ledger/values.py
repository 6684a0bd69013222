"""Values a later turn may need, read from a command's output (seeds/002: "a timing, a total, a
port"), each with what it is. The offline model names these with the command's id as their
turn; verification keeps one only where it stands verbatim in that turn, as for any model.

Only a few kinds are read, each by a shape that says what it is, never "any number": a line
count (`wc -l`), a compiler's error location, a commit made or the newest one logged, an
address or port a server listens on, a timing the output reports ("took", "Duration"), a test
total. Values in the partial lines around the cut of an output's head and tail are not read.
"""

from __future__ import annotations

import re
from typing import Any

_WC_LINE = re.compile(r"^\s*(\d+\s+\S.*?)\s*$")
_ERROR_LOCATION = re.compile(
    r"(?<![\w./@-])(?P<loc>[\w./@-]+\.\w+(?:\(\d+,\d+\)|:\d+:\d+))\s*[-:]?\s*(?:error|warning)\b",
    re.I,
)
_COMMIT_MADE = re.compile(r"^\[[\w./-]+(?: \(root-commit\))? (?P<hash>[0-9a-f]{7,40})\]", re.M)
_GIT_LOG = re.compile(r"(?:^|\s)git\s+(?:--no-pager\s+)?log\b")
_LOG_LINE = re.compile(r"^(?:\*\s+)?(?:commit\s+)?(?P<hash>[0-9a-f]{7,40})\b")
_ADDRESS = re.compile(r"\b(?:localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1?\]):\d{2,5}\b")
_PORT = re.compile(r"\bport\s+(\d{2,5})\b", re.I)
# A timing the output reports as one ("took 3.2s", "Duration 1.4 s", "Done in 12s"), not every
# "in 122ms" a linter prints on each run.
_TIMING = re.compile(
    r"\b(?:[Tt]ook|[Dd]uration:?|[Ee]lapsed:?|[Tt]ime:|(?:Done|Finished|Completed) in)\s+"
    r"(?P<t>\d+(?:\.\d+)?\s?(?:ms|s|sec|seconds|m|min))\b"
)
# The ledger keeps an output's head and tail joined by " … ": the lines either side of the
# cut are partial, and a value read there could be a fragment ("h.ts(8,49)").
_CUT = re.compile(r"[^\n]* … [^\n]*")
_TESTS = re.compile(r"\b\d+ (?:passed|failed|skipped|errors?|tests?)\b")


def command_values(command: str, output: str) -> list[tuple[str, str]]:
    """(value, what) pairs a command's output shows, in output order, without repeats."""
    found: list[tuple[str, str]] = []
    output = _CUT.sub("", output, count=1)

    def add(value: str, what: str) -> None:
        value = value.strip()
        if value and all(value != v for v, _ in found):
            found.append((value, what))

    if re.search(r"(?:^|[\s;&|])wc\s+-l\b", command):
        for line in output.splitlines():
            match = _WC_LINE.match(line)
            if match:
                add(match.group(1), "lines, wc -l")
    for match in _ERROR_LOCATION.finditer(output):
        add(match.group("loc"), "error location")
    for match in _COMMIT_MADE.finditer(output):
        add(match.group("hash"), "commit made")
    if _GIT_LOG.search(command):
        for line in output.splitlines()[:1]:
            match = _LOG_LINE.match(line.strip())
            if match:
                add(match.group("hash"), "newest commit logged")
    for match in _ADDRESS.finditer(output):
        add(match.group(0), "address")
    for match in _PORT.finditer(output):
        add(match.group(0), "port")
    for match in _TIMING.finditer(output):
        add(match.group("t"), "timing")
    for match in _TESTS.finditer(output):
        add(match.group(0), "test total")
    return found


def span_values(
    commands: list[dict[str, Any]], per_command: int = 4, per_span: int = 16
) -> list[dict[str, str]]:
    """The values a span's commands showed, as answer items (value, turn, what): up to
    `per_command` of each (the ones the fold read from the whole output, else those of its
    excerpt), the newest `per_span` in all; a value seen again counts from its newest turn."""
    found: dict[str, dict[str, str]] = {}
    for command in commands:
        pairs = command.get("values") or command_values(
            command.get("command", ""), command.get("output", "")
        )
        # A few per command, so one long listing cannot crowd out the span's others.
        for value, what in list(pairs)[:per_command]:
            found.pop(value, None)
            found[value] = {"value": value, "turn": command["id"], "what": what}
    return list(found.values())[-per_span:] if per_span else []
