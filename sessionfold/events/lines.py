"""Splitting one line of a session file into the JSON values it holds.

A healthy line is one JSON object. A damaged one may hold two objects run together, an object
followed by garbage, or only garbage: every complete value is returned, and what is left is
reported by its size and cause so the caller can dead-letter it. Nothing here logs or keeps text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class Remainder:
    """The unreadable rest of a line: where it starts, how long it is, and why it failed."""

    start: int
    size: int
    error: str
    reason: str


def split_line(line: bytes) -> tuple[list[Any], Remainder | None]:
    """Return the JSON values a line holds, and its unreadable remainder if any."""
    try:
        return [orjson.loads(line)], None
    except orjson.JSONDecodeError:
        pass
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], Remainder(0, len(line), type(exc).__name__, "not UTF-8")
    values: list[Any] = []
    position = 0
    end = len(text)
    while True:
        while position < end and text[position] in " \t\r\n":
            position += 1
        if position >= end:
            return values, None
        try:
            value, position = _DECODER.raw_decode(text, position)
        except json.JSONDecodeError as exc:
            start = len(text[:position].encode("utf-8"))
            reason = "truncated JSON" if exc.pos >= end else "not JSON"
            return values, Remainder(start, len(line) - start, "JSONDecodeError", reason)
        values.append(value)
