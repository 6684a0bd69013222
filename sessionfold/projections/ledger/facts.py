"""Facts kept: at each compaction point, how many values a summary kept that the work needed.

A value (a path, a number, a hash, a port, an identifier) counts for a compaction point when it
was first seen in the tool output of that point's span (nothing earlier in the session showed
it) and is used again after the point (in a later user message, assistant text or tool call).
Each summary is scored by how many of those values it holds verbatim: pi's own summary of that
compaction entry, and our rendered state at the same point. No model, no I/O: entries and
payloads are handed in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from sessionfold.projections.ledger.text import message_text, user_words

# paths: absolute, home- or dot-relative, or relative with a file extension (`path_matches`)
_PATH = re.compile(
    r"(?<![\w.@/-])(?:~|\.{1,2})?/(?:[\w.@+-]+/)*[\w.@+-]+"
    r"|\b[\w.@-]+(?:/[\w.@-]+)+\.\w+\b"
)
# Where an absolute or dot-relative path may start, and the runs of path characters joined by
# single slashes in which a relative one stands.
_ROOTED_START = re.compile(r"(?<![\w.@/-])[~./]")
_CHAIN = re.compile(r"(?<![\w.@-])[\w.@-]++(?:/[\w.@-]++)+")
_EXTENSION = re.compile(r"(?<=[\w.@-])\.\w")
_WORD_CHAR = re.compile(r"\w")
_PATTERNS = (
    _PATH,
    # hashes: 7 to 64 hex digits with both a letter and a digit
    re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,64}\b"),
    # ports after a host or a colon
    re.compile(r"(?:localhost|127\.0\.0\.1|0\.0\.0\.0|\]):\d{2,5}\b|(?<=port )\d{2,5}\b"),
    # numbers of three digits or more, or with a decimal part
    re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])|(?<![\w./-])\d{3,}(?![\w./-])"),
    # identifiers: camelCase, PascalCase with an inner capital, snake_case
    re.compile(r"\b[a-z]+(?:[A-Z][a-z0-9]*)+\b|\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b"),
    re.compile(r"\b[A-Za-z][a-z0-9]*(?:_[A-Za-z0-9]+)+\b"),
)
_MIN_CHARS = 3


def _path_starts(text: str) -> list[int]:
    """Every position `_PATH` can match at that a left-to-right scan reaches.

    A relative path (the second branch) is a run of path characters, then segments after
    single slashes, the last holding an extension. From any word boundary of one run the
    pattern reads the same segments, so it matches from the run's first boundary or from
    none; it matches when a later segment of the chain holds a "." after its first
    character and before a word character. `_PATH.finditer` tried every boundary of every
    run and read the rest of the chain again from each: quadratic in one long chain.
    """
    starts = [m.start() for m in _ROOTED_START.finditer(text)]
    for chain in _CHAIN.finditer(text):
        runs: list[tuple[int, int]] = []
        offset = chain.start()
        for run in chain.group(0).split("/"):
            runs.append((offset, offset + len(run)))
            offset += len(run) + 1
        extension_after = False  # does a segment after the run hold an extension?
        for index in range(len(runs) - 1, 0, -1):
            start, end = runs[index]
            extension_after = extension_after or _EXTENSION.search(text, start, end) is not None
            first_start, first_end = runs[index - 1]
            word = _WORD_CHAR.search(text, first_start, first_end)
            if extension_after and word is not None:
                starts.append(word.start())
    return sorted(starts)


def path_matches(text: str) -> Iterator[re.Match[str]]:
    """`_PATH.finditer(text)`, in time linear in the text: the pattern is tried only where a
    scan can reach a match (`_path_starts`), once each."""
    position = 0
    for start in _path_starts(text):
        if start < position:
            continue
        match = _PATH.match(text, start)
        if match is not None:
            yield match
            position = match.end()


def values_in(text: str) -> set[str]:
    """Every value the patterns find in a text."""
    found: set[str] = set()
    for pattern in _PATTERNS:
        matches = path_matches(text) if pattern is _PATH else pattern.finditer(text)
        for match in matches:
            value = match.group(0).rstrip(".:,")
            if len(value) >= _MIN_CHARS and value not in ("/", "./", "../"):
                found.add(value)
    return found


def _outputs_and_uses(entry: dict[str, Any]) -> tuple[str, str]:
    """(tool output text, used text) of one entry: what it showed, and what it used."""
    if entry.get("type") != "message" or not isinstance(entry.get("message"), dict):
        return "", ""
    message = entry["message"]
    role = message.get("role")
    if role == "toolResult":
        return message_text(message), ""
    if role == "bashExecution":
        return str(message.get("output") or ""), str(message.get("command") or "")
    if role == "user":
        return "", user_words(message)
    if role == "assistant":
        parts = []
        for block in message.get("content") or []:
            if isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif isinstance(block, dict) and block.get("type") == "toolCall":
                arguments = block.get("arguments")
                if isinstance(arguments, dict):
                    parts += [str(v) for v in arguments.values()]
        return "", "\n".join(parts)
    return "", ""


@dataclass(frozen=True, slots=True)
class FactsRow:
    """One compaction point: the values that mattered and how many each summary kept."""

    point: int
    entry: str | None
    values: int  # first seen in the span's tool output and used again afterwards
    pi: int | None  # kept by pi's own summary (None: the file has none here)
    ours: int | None  # kept by our rendered state at the same point
    piChars: int | None
    oursChars: int | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def facts(entries: Iterable[dict[str, Any]], payloads: Iterable[dict[str, Any]]) -> list[FactsRow]:
    """The facts table of one session: `entries` in file order, `payloads` of our passes."""
    entries = list(entries)
    ours = {
        p["record"]["entry"]: p["summary"]
        for p in payloads
        if p.get("record") and p["record"].get("entry")
    }
    points = [i for i, e in enumerate(entries) if e.get("type") == "compaction"]
    seen: set[str] = set()
    first_in_span: list[set[str]] = []
    start = 0
    for index in points:
        fresh: set[str] = set()
        for entry in entries[start:index]:
            output, used = _outputs_and_uses(entry)
            shown = values_in(output) if output else set()
            fresh |= shown - seen
            seen |= shown
            seen |= values_in(used) if used else set()
        first_in_span.append(fresh)
        start = index + 1
    # Values used after each point: accumulate uses from the end backwards.
    used_after: list[set[str]] = [set() for _ in points]
    later: set[str] = set()
    bounds = [*points, len(entries)]
    for k in range(len(points) - 1, -1, -1):
        for entry in entries[bounds[k] + 1 : bounds[k + 1]]:
            _, used = _outputs_and_uses(entry)
            if used:
                later |= values_in(used)
        used_after[k] = set(later)
    rows = []
    for k, index in enumerate(points):
        entry = entries[index]
        wanted = first_in_span[k] & used_after[k]
        pi_summary = entry.get("summary") if not _is_ours(entry) else None
        our_summary = ours.get(entry.get("id"))
        rows.append(
            FactsRow(
                point=k + 1,
                entry=entry.get("id"),
                values=len(wanted),
                pi=_kept(wanted, pi_summary),
                ours=_kept(wanted, our_summary),
                piChars=len(pi_summary) if isinstance(pi_summary, str) else None,
                oursChars=len(our_summary) if isinstance(our_summary, str) else None,
            )
        )
    return rows


def _is_ours(entry: dict[str, Any]) -> bool:
    details = entry.get("details")
    return isinstance(details, dict) and details.get("producer") == "sessionfold-ledger"


def _kept(values: set[str], summary: Any) -> int | None:
    if not isinstance(summary, str):
        return None
    return sum(1 for value in values if value in summary)
