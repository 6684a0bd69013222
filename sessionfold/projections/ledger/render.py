"""The rendered state: the compaction summary, bounded in size, sanitized line by line.

Rules come first and are shown with the user's exact words (JSON-quoted, so a quote mark or a
line break inside them cannot be misread). When the whole does not fit the configured size, the
oldest commands go first, then the oldest files read, errors, narrative lines, values, files
modified, lifted rules, dead ends, decisions and the World; rules are cut only as a last
resort. Every omission is said. The files are those pi's file tools read or modified (as pi's
own compaction lists them), a file modified not listed again as read. Room left under the size
once everything fits is spent on the values: each, newest first, gets the line of its command's
output it stands in, verbatim (then more while room lasts).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from sessionfold.projections.ledger.rules import conflicts
from sessionfold.projections.ledger.text import clip, sanitize
from sessionfold.projections.ledger.values import shapes

HEADER = "# Session state (sessionfold rule ledger)"


@dataclass(slots=True)
class _Section:
    key: str
    title: str
    lines: list[str]
    noun: str  # what an omitted item is called
    dropped: int = 0

    def text(self) -> str:
        """The section as text, saying how many items were left out; empty when it has none."""
        if not self.lines and not self.dropped:
            return ""
        body = list(self.lines)
        if self.dropped:
            body.insert(0, f"- ({self.dropped} older {self.noun} left out for size)")
        return "\n".join([self.title, *body])


def quote(words: str) -> str:
    """Exact words as a JSON string: escapes, never rewording."""
    return sanitize(json.dumps(words, ensure_ascii=False))


def _line(text: str) -> str:
    return sanitize(text, newlines=False)


def _rule_lines(state: dict[str, Any]) -> tuple[list[str], list[str]]:
    live, lifted = [], []
    rules = state.get("rules", [])
    in_force = conflicts([(r["id"], r["words"]) for r in rules if not r.get("lifted")])
    for rule in rules:
        origin = f"{rule['u']}, entry {rule.get('entry') or '?'}"
        if rule["id"] in in_force:
            origin += f"; may conflict with {', '.join(in_force[rule['id']])}, both in force"
        if not rule.get("lifted"):
            live.append(f"- {rule['id']} ({_line(origin)}): {quote(rule['words'])}")
            continue
        lift = rule["lifted"]
        how = f"lifted by {lift['by']}"
        if lift.get("replacedBy"):
            how += f", replaced by {lift['replacedBy']}"
        lifted.append(f"- {rule['id']} ({_line(how)}): {quote(clip(rule['words'], 160))}")
    return live, lifted


def _notes(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for row in rows:
        evidence = f" [{', '.join(row['evidence'])}]" if row.get("evidence") else ""
        lines.append(_line(f"- {row['id']}: {row['text']}{evidence}"))
    return lines


def _outcome(command: dict[str, Any]) -> str:
    if command.get("exit") is not None:
        return f"exit {command['exit']}"
    return str(command.get("status") or "?")


def sections(state: dict[str, Any], command_chars: int = 120) -> list[_Section]:
    """The summary's sections, in display order, fully populated."""
    live, lifted = _rule_lines(state)
    now = state.get("now")
    objective = next(
        (r["objective"] for r in reversed(state.get("spans", [])) if r.get("objective")), None
    )
    commands = []
    for command in state.get("commands", []):
        error = f" -> {command['error']}" if command.get("error") else ""
        shown = clip(" ".join(str(command.get("command") or "(unknown)").split()), command_chars)
        who = " (user !)" if command.get("source") == "user" else ""
        commands.append(_line(f"- {command['id']} {_outcome(command)}{who}: `{shown}`{error}"))
    errors = []
    for error in state.get("errors", []):
        origin = ", ".join(x for x in (error.get("tool"), error.get("command")) if x)
        errors.append(_line(f"- {error['id']} ({origin}): {error.get('head') or ''}"))
    narrative = [
        _line(f"- Span {record['span']}: {record.get('narrative') or ''}")
        for record in state.get("spans", [])
    ]
    values = [
        _line(
            f"- {row['id']} {row['value']}"
            + (f" ({row['what']})" if row.get("what") else "")
            + f" [{row['turn']}]"
        )
        for row in state.get("values", [])
    ]
    modified = [row["path"] for row in state.get("files", []) if row["op"] == "modified"]
    changed = set(modified)
    read = [
        row["path"]
        for row in state.get("files", [])
        if row["op"] == "read" and row["path"] not in changed
    ]
    world = [
        _line(f"- {name}: {value if isinstance(value, str) else json.dumps(value)}")
        for name, value in (state.get("world") or {}).items()
    ]
    return [
        _Section("rules", "## Rules in force (the user's exact words)", live, "rules"),
        _Section("lifted", "## Lifted rules", lifted, "lifted rules"),
        _Section("decisions", "## Decisions", _notes(state.get("decisions", [])), "decisions"),
        _Section("deadEnds", "## Dead ends", _notes(state.get("deadEnds", [])), "dead ends"),
        _Section(
            "now",
            "## Now",
            ([_line(f"Objective: {objective}")] if objective else [])
            + ([_line(now)] if now else []),
            "lines",
        ),
        _Section("values", "## Values", values, "values"),
        _Section("modified", "## Files modified", [_line(f"- {p}") for p in modified], "files"),
        _Section("read", "## Files read", [_line(f"- {p}") for p in read], "files"),
        _Section("narrative", "## Narrative", narrative, "narrative lines"),
        _Section("errors", "## Errors", errors, "errors"),
        _Section("commands", "## Commands", commands, "commands"),
        _Section("world", "## World", world, "facts"),
    ]


# Which sections give way first when the summary is over its size.
_GIVE_WAY = (
    "commands",
    "read",
    "errors",
    "narrative",
    "values",
    "modified",
    "lifted",
    "deadEnds",
    "decisions",
    "world",
)


#: A value's context (a line of its turn it stands in) is cut to this around the value.
CONTEXT_CHARS = 140
#: At most this many context lines per value.
CONTEXT_LINES = 3


def value_lines(value: str, output: str, limit: int = CONTEXT_CHARS) -> list[str]:
    """The lines of a command's output (its head and tail as the ledger keeps them) that hold
    `value` verbatim, whitespace folded and cut to `limit` characters around it ("…" where
    cut): the line that shows the most other values first. Not the partial lines either side
    of the excerpt's cut, nor a line that is the value alone."""
    found: list[tuple[int, int, str]] = []
    for index, raw in enumerate(output.splitlines()):
        if " … " in raw:
            continue
        line = " ".join(raw.split())
        at = line.find(value)
        if at < 0 or line == value:
            continue
        if len(line) > limit:
            room = max(limit - len(value), 0)
            start = max(0, min(at - room // 2, len(line) - limit))
            end = start + max(limit, len(value))
            line = ("…" if start else "") + line[start:end] + ("…" if end < len(line) else "")
        others = sum(1 for shape in shapes(line) if shape not in value)
        found.append((-others, index, line))
    return [line for _, _, line in sorted(found)]


def _spend_spare(state: dict[str, Any], section: _Section, spare: int) -> bool:
    """Spend `spare` characters on the values shown, newest first: each gets a line of its
    turn's output it stands in, verbatim; then, while room is left, another, up to
    `CONTEXT_LINES`. A line shown once is not shown again. True when any value line changed."""
    if spare <= 0 or not section.lines:
        return False
    outputs = {row["id"]: str(row.get("excerpt") or "") for row in state.get("commands", [])}
    rows = state.get("values", [])[-len(section.lines) :]
    lines = [value_lines(str(row["value"]), outputs.get(str(row.get("turn")), "")) for row in rows]
    shown: set[str] = set()
    given = [0] * len(rows)  # context lines each value got
    for round_ in range(CONTEXT_LINES):
        for index in range(len(rows) - 1, -1, -1):
            context = next((line for line in lines[index] if line not in shown), None)
            if context is None or given[index] != round_:
                continue
            addition = _line(f"{': ' if round_ == 0 else ' | '}`{context}`")
            if len(addition) <= spare:
                section.lines[index] += addition
                spare -= len(addition)
                shown.add(context)
                given[index] += 1
    return any(given)


def _join(parts: list[_Section], header: str = HEADER) -> str:
    return "\n\n".join([header, *(t for s in parts if (t := s.text()))]) + "\n"


def render(
    state: dict[str, Any],
    limit: int = 12_000,
    command_chars: int = 120,
    *,
    leave_out: frozenset[str] = frozenset(),
    header: str = HEADER,
) -> tuple[str, dict[str, int]]:
    """The summary of a state, at most `limit` characters, and what was left out per section.

    `leave_out` names sections not shown at all (the hook's shorter view); `header` heads it.
    """
    parts = sections(state, command_chars)
    for section in parts:
        if section.key in leave_out:
            section.lines = []
    by_key = {s.key: s for s in parts}
    join = functools.partial(_join, header=header)
    text = join(parts)
    for key in _GIVE_WAY:
        section = by_key[key]
        while len(text) > limit and section.lines:
            # Drop the oldest lines in one go when far over, one by one near the limit.
            over = len(text) - limit
            count = 1
            total = 0
            for line in section.lines:
                total += len(line) + 1
                if total >= over:
                    break
                count += 1
            count = min(count, len(section.lines))
            del section.lines[:count]
            section.dropped += count
            text = join(parts)
        if len(text) <= limit:
            break
    if len(text) > limit:
        rules = by_key["rules"]
        rules.lines = [clip(line, 300) for line in rules.lines]
        text = join(parts)
    if len(text) > limit:
        text = clip(text, limit - 1) + "\n"
    elif not any(s.dropped for s in parts):
        plain = list(by_key["values"].lines)
        if _spend_spare(state, by_key["values"], limit - len(text)):
            spent = join(parts)
            if len(spent) <= limit:
                text = spent
            else:  # each addition is counted; this only guards the bound
                by_key["values"].lines = plain
    return text, {s.key: s.dropped for s in parts if s.dropped}
