"""Message text as the ledger reads it, and the sanitizer every rendered string goes through."""

from __future__ import annotations

import re
from bisect import bisect_left
from typing import Any

# C0 controls but tab and newline, DEL, C1 controls, bidi overrides and isolates, and the
# Unicode line separators: none of them may reach a terminal or reorder what it shows.
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]"
)
# pi-goal's tags, `<goal ...>objective</goal>` (or `objective`), read by `goal_objectives`.
_GOAL_OPEN = re.compile(r"<(goal|objective)\b", re.I)
_GOAL_CLOSE = re.compile(r"</(goal|objective)\s*>", re.I)
# Two tag names alike as a case-blind back reference compares them ("<Goal>" ... "</goal>").
_SAME_NAME = re.compile(r"([^\0]*)\0\1\Z", re.I)
_GOAL_COMMAND = re.compile(r"\A\s*/goal\b[ \t]*")

Region = tuple[int, int]


def message_text(message: dict[str, Any]) -> str:
    """The text a user (or custom) message carries: a string, or its text blocks joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            block["text"]
            for block in content
            if isinstance(block, dict)
            and block.get("type") == "text"
            and isinstance(block.get("text"), str)
        ]
        return "\n".join(parts)
    return ""


# Context an agent injects into a user turn (Claude Code's reminders): not the user's words.
_INJECTED_BLOCK = re.compile(r"<system-reminder>.*?(?:</system-reminder>|\Z)", re.S)
# Codex's VS Code extension sends the open tabs, the active file and the selection above the
# user's request: context the model saw, not the user's words. The request follows its heading.
_IDE_CONTEXT = re.compile(r"\s*# Context from my IDE setup:[ \t]*\r?\n")
_IDE_REQUEST = re.compile(r"^## My request for Codex:[ \t]*\r?\n?", re.M)


def user_words(message: dict[str, Any]) -> str:
    """The words a user message holds, without the reminders an agent injects into it, and of
    an IDE-wrapped turn its request alone."""
    text = message_text(message)
    if "<system-reminder>" in text:
        text = _INJECTED_BLOCK.sub("", text).rstrip()
    if _IDE_CONTEXT.match(text):
        request = _IDE_REQUEST.search(text)
        if request is not None:  # without the heading, where the words start is not known
            text = text[request.end() :]
    return text


def _trimmed(text: str, start: int, end: int) -> Region | None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if end > start else None


def goal_objectives(text: str) -> list[Region]:
    """(start, end) of the text inside each pair of goal tags, left to right.

    What `<(goal|objective)\\b[^>]*>(.*?)</\\1\\s*>` (dot-all, any case) finds as its second
    group, without that pattern's read to the end of the text from every tag left open: a tag
    runs to the first ">" after its name and closes at the first closing tag of its name
    after that; a name that finds no closing tag is not looked for again.
    """
    found: list[Region] = []
    closings: list[tuple[int, int, str]] | None = None
    closing_starts: list[int] = []
    unclosed: set[str] = set()
    bracket = -2  # the first ">" at or after the last tag name read (-1: none)
    position = 0
    while (opening := _GOAL_OPEN.search(text, position)) is not None:
        if bracket != -1 and bracket < opening.end():
            bracket = text.find(">", opening.end())
        if bracket == -1:
            break  # no ">" after this name, so after no later one either
        name = opening.group(1)
        position = opening.start() + 1
        if name in unclosed:
            continue
        if closings is None:
            closings = [(m.start(), m.end(), m.group(1)) for m in _GOAL_CLOSE.finditer(text)]
            closing_starts = [start for start, _, _ in closings]
        index = bisect_left(closing_starts, bracket + 1)
        while index < len(closings) and not _SAME_NAME.match(f"{name}\0{closings[index][2]}"):
            index += 1
        if index == len(closings):
            unclosed.add(name)
            continue
        found.append((bracket + 1, closings[index][0]))
        position = closings[index][1]
    return found


def quotable_regions(text: str) -> list[Region]:
    """Where in a message the user's own words stand, as (start, end) offsets.

    In a pi-goal `/goal` message only the objective is the user's: the text inside the goal
    tags, or what follows `/goal` when there are no tags; pi-goal's template is not quotable.
    Any other message is quotable whole (surrounding whitespace left out).
    """
    tagged = [
        region
        for start, end in goal_objectives(text)
        if (region := _trimmed(text, start, end)) is not None
    ]
    if tagged:
        return tagged
    command = _GOAL_COMMAND.match(text)
    start = command.end() if command else 0
    region = _trimmed(text, start, len(text))
    return [region] if region else []


def quotable_text(text: str) -> str:
    """The user's own words of a message: its quotable regions joined by a blank line."""
    return "\n\n".join(text[a:b] for a, b in quotable_regions(text))


def is_word_char(char: str) -> bool:
    """Letters, digits and underscore: what a quote must not start or end inside of."""
    return char.isalnum() or char == "_"


def at_word_boundaries(text: str, start: int, end: int) -> bool:
    """True when text[start:end] neither starts nor ends inside a word."""
    if start < 0 or end > len(text) or start >= end:
        return False
    if start > 0 and is_word_char(text[start - 1]) and is_word_char(text[start]):
        return False
    return not (end < len(text) and is_word_char(text[end - 1]) and is_word_char(text[end]))


def sanitize(text: str, *, newlines: bool = True) -> str:
    """Replace every character that could drive a terminal with U+FFFD; tabs become spaces.

    With `newlines` false the result is one line: line breaks become " ↵ ".
    """
    text = _UNSAFE.sub("\ufffd", text.replace("\r\n", "\n").replace("\t", " "))
    if not newlines:
        text = text.replace("\n", " ↵ ")
    return text


def clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, with "…" where it was cut."""
    if len(text) <= limit:
        return text
    return text[: max(limit - 1, 0)] + "…"
