"""Splitting one line of a session file into the JSON values it holds.

A healthy line is one JSON object. A damaged one may hold two objects run together, an object
followed by garbage, or only garbage: every complete value is returned, and what is left is
reported by its size and cause so the caller can dead-letter it. Nothing here logs or keeps text.

A value nested deeper than `MAX_DEPTH` arrays and objects is refused too ("nested too deep"):
orjson writes at most 254 levels and the envelope around an entry adds two, and the folds walk
values recursively, so a deeper one would fail far from where it came in.

Every value returned is one the wire carries unchanged (orjson writes it and reads it back
equal), so every runtime folds the same values: a line orjson refuses goes to the pure-Python
decoder, which is held to orjson's rules. `NaN`, `Infinity` and a number past a double's range
are not JSON (JavaScript's JSON.parse refuses the first two too); an integer past 64 bits is a
float, as orjson reads it; and a lone UTF-16 surrogate escape (`\\ud83d` with no partner, which
JavaScript's JSON.stringify writes for a string cut inside a surrogate pair) becomes U+FFFD, the
replacement character, since UTF-8 cannot carry it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import orjson

#: The deepest nesting of arrays and objects a value may have; real pi entries stay below 20.
MAX_DEPTH = 128

#: An envelope holds an entry two levels down (envelope, payload): its own limit.
ENVELOPE_DEPTH = MAX_DEPTH + 2

DEPTH_ERROR = "DepthError"
DEPTH_REASON = "nested too deep"


#: The integers orjson reads as integers; it reads any other as a float.
_INT_RANGE = range(-(2**63), 2**64)
#: A UTF-16 surrogate left in a decoded string: Python pairs matched escapes, so it is lone.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
#: The escape of a surrogate in JSON text: a line without one decodes to no surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class _NotJson(ValueError):
    """A value the pure-Python decoder reads but orjson (and the wire) does not."""


def _refuse_constant(name: str) -> Any:
    raise _NotJson(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotJson("number out of range")
    return value


def _orjson_int(text: str) -> int | float:
    try:
        value = int(text)
    except ValueError:  # past Python's int_max_str_digits (4300): a float, or out of range
        return _finite_float(text)
    return value if value in _INT_RANGE else _finite_float(text)


_DECODER = json.JSONDecoder(
    parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_orjson_int
)


@dataclass(frozen=True, slots=True)
class Remainder:
    """The unreadable rest of a line: where it starts, how long it is, and why it failed."""

    start: int
    size: int
    error: str
    reason: str


#: Every byte but "[" and "{": deleted from a line, they leave its opening brackets.
NOT_OPENING = bytes(byte for byte in range(256) if byte not in b"[{")


def may_be_too_deep(data: bytes | str, limit: int = MAX_DEPTH) -> bool:
    """False when the text cannot nest past `limit`: it opens too few arrays and objects.

    One pass at C speed, so the exact walk of `too_deep` runs only for the rare line with many
    brackets (inside strings too: code in tool output): the bytes left when every other is
    deleted, about two thirds of two counts' time.
    """
    if isinstance(data, str):
        return data.count("[") + data.count("{") > limit
    return len(data.translate(None, NOT_OPENING)) > limit


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether a decoded value nests more than `limit` arrays and objects (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def nests_within(value: Any, limit: int = MAX_DEPTH) -> bool:
    """`not too_deep(value, limit)`, level by level: a parsed line's containers are walked
    without a tuple per container, and a string (most of a long line's bytes) costs one type
    check, so for a long line it costs less than counting its brackets (`may_be_too_deep`)."""
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return False
        below = []
        for item in level:
            for child in item.values() if type(item) is dict else item:
                kind = type(child)
                if kind is dict or kind is list:
                    below.append(child)
        level = below
    return True


def split_line(line: bytes) -> tuple[list[Any], Remainder | None]:
    """Return the JSON values a line holds, and its unreadable remainder if any."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        pass
    else:
        if may_be_too_deep(line) and too_deep(value):
            return [], Remainder(0, len(line), DEPTH_ERROR, DEPTH_REASON)
        return [value], None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], Remainder(0, len(line), type(exc).__name__, "not UTF-8")
    values: list[Any] = []
    position = 0
    end = len(text)
    deep = may_be_too_deep(line)
    surrogates = _SURROGATE_ESCAPE.search(line) is not None
    while True:
        while position < end and text[position] in " \t\r\n":
            position += 1
        if position >= end:
            return values, None
        start = len(text[:position].encode("utf-8"))
        try:
            value, position = _DECODER.raw_decode(text, position)
        except json.JSONDecodeError as exc:
            reason = "truncated JSON" if exc.pos >= end else "not JSON"
            return values, Remainder(start, len(line) - start, "JSONDecodeError", reason)
        except _NotJson:
            return values, Remainder(start, len(line) - start, "JSONDecodeError", "not JSON")
        except RecursionError:
            # The pure-JSON decoder recurses per level: past orjson's 1024 it runs out of stack.
            return values, Remainder(start, len(line) - start, DEPTH_ERROR, DEPTH_REASON)
        if deep and too_deep(value):
            return values, Remainder(start, len(line) - start, DEPTH_ERROR, DEPTH_REASON)
        values.append(without_lone_surrogates(value) if surrogates else value)


def without_lone_surrogates(value: Any) -> Any:
    """`value` with every lone UTF-16 surrogate in its strings (keys too) replaced by U+FFFD.

    Recursive: it is only given values within `MAX_DEPTH`.
    """
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [without_lone_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {without_lone_surrogates(k): without_lone_surrogates(v) for k, v in value.items()}
    return value
