"""A seeded fuzzer over other agents' files: generated Codex rollouts and Claude Code transcripts
with damaged lines never crash the reader, a translator or the folds, and never log a traceback.

Each case damages one line (never the first: with no header the file is not detected as the
format) of a generated file. What must hold, whatever the damage:
- every JSON object the file holds (`split_line` over its non-blank lines, counted here) is fed
  to the translator once, or dead-lettered with its line's reason; every other dead letter is
  an entry's (MappingError, EntryError, DuplicateId, DepthError, ...);
- entry and placeholder seqs run 1..N without a hole, each placeholder right after its dead
  letter;
- each envelope decodes from its wire bytes (what a Kafka worker reads is what the embedded
  runtime folds), and the embedded runtime folds them;
- a tail stopped at any byte and resumed by new readers from saved positions reads the same
  records as one read, byte for byte.

`SESSIONFOLD_FUZZ_CASES` (default 2) sets how many cases each format and damage gets,
`SESSIONFOLD_FUZZ_SEED` (default 0) the seed, as in test_fuzz_sessions.py.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from format_sessions import TRANSLATED, tail_in_pieces, wire, write_format_session

from sessionfold.events.envelope import EntryEnvelope, PlaceholderEnvelope, decode, encode
from sessionfold.events.formats import translator_for
from sessionfold.events.lines import MAX_DEPTH, split_line
from sessionfold.streams.publishing import session_file
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.runtime.embedded import EmbeddedRuntime

SEED = int(os.environ.get("SESSIONFOLD_FUZZ_SEED", "0"))
CASES = int(os.environ.get("SESSIONFOLD_FUZZ_CASES", "2"))
HUGE = 3_000_000

Line = dict[str, Any]
Damage = Callable[[random.Random, list[Line], int], list[bytes]]


def _dumps(line: Any) -> bytes:
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode()


def _lines(lines: list[Line]) -> list[bytes]:
    return [_dumps(line) for line in lines]


def _replaced(lines: list[Line], i: int, *new: bytes) -> list[bytes]:
    raw = _lines(lines)
    return [*raw[:i], *new, *raw[i + 1 :]]


def _containers(value: Any, depth: int = 1) -> list[tuple[Any, int]]:
    """Every dict and list inside `value`, with its depth (the line itself is 1)."""
    found: list[tuple[Any, int]] = []
    if isinstance(value, dict | list):
        found.append((value, depth))
        for child in value.values() if isinstance(value, dict) else value:
            found += _containers(child, depth + 1)
    return found


def _strings(value: Any) -> list[tuple[Any, Any]]:
    """(container, key) of every string inside `value`."""
    places: list[tuple[Any, Any]] = []
    for container, _depth in _containers(value):
        keys = container.keys() if isinstance(container, dict) else range(len(container))
        places += [(container, k) for k in keys if isinstance(container[k], str)]
    return places


_OTHER_TYPES: list[Any] = [7, "text", [1], {"k": 1}, None, True, -1.5]


def wrong_type(rng: random.Random, lines: list[Line], i: int) -> list[bytes]:
    """A value anywhere in the line (a type, a payload, an id, a count) of another JSON type."""
    line = copy.deepcopy(lines[i])
    places = [(c, k) for c, _d in _containers(line) if isinstance(c, dict) for k in c]
    container, key = rng.choice(places)
    container[key] = rng.choice([v for v in _OTHER_TYPES if type(v) is not type(container[key])])
    return _replaced(lines, i, _dumps(line))


def unknown_type(rng: random.Random, lines: list[Line], i: int) -> list[bytes]:
    """A line kind, item kind or block kind no reader knows yet."""
    line = copy.deepcopy(lines[i])
    typed = [c for c, _d in _containers(line) if isinstance(c, dict) and "type" in c]
    rng.choice(typed)["type"] = rng.choice(["x_future_kind", "future.kind", "t" * 300])
    return _replaced(lines, i, _dumps(line))


def deep_line(rng: random.Random, lines: list[Line], i: int) -> list[bytes]:
    """A field nested to exactly the reader's limit: the line is valid, and an entry that
    wraps it (as `raw`) must not come out deeper than the wire carries."""
    line = copy.deepcopy(lines[i])
    dicts = [(c, d) for c, d in _containers(line) if isinstance(c, dict) and d < MAX_DEPTH - 2]
    container, depth = rng.choice(dicts)
    deep: Any = []
    for _ in range(MAX_DEPTH - depth - 1):
        deep = [deep]
    container["x-deep"] = deep
    return _replaced(lines, i, _dumps(line))


def _parsed(line: Line) -> list[tuple[Any, Any]]:
    """The strings of a line Codex's translator reads as JSON: a call's arguments, an output."""
    return [(c, k) for c, k in _strings(line) if k in ("arguments", "output")]


def json_text(rng: random.Random, lines: list[Line], i: int) -> list[bytes]:
    """A string (a call's arguments, an output) holding JSON text a translator may parse:
    nested far past any limit, with a non-finite number, or an object with an exit code."""
    parsed_at = [j for j in range(1, len(lines)) if _parsed(lines[j])]
    if parsed_at and rng.random() < 0.8:
        i = rng.choice(parsed_at)
    line = copy.deepcopy(lines[i])
    places = _strings(line)
    depth = rng.choice([MAX_DEPTH, 300, 5_000, 200_000])
    text = rng.choice(
        [
            "[" * depth + "]" * depth,
            '{"a":' + "[" * depth + "]" * depth + "}",
            '{"metadata":' + "{" * depth + "}" * depth + "}",
            '{"a": NaN, "metadata": {"exit_code": Infinity}}',
            '{"output": "x", "metadata": {"exit_code": 99999999999999999999999}}',
        ]
    )
    parsed = _parsed(line)
    if parsed or places:
        container, key = rng.choice(parsed or places)
        container[key] = text
    return _replaced(lines, i, _dumps(line))


def huge_valid(rng: random.Random, lines: list[Line], i: int) -> list[bytes]:
    """A valid line with a multi-megabyte string somewhere in it."""
    line = copy.deepcopy(lines[i])
    places = _strings(line)
    if places and rng.random() < 0.7:
        container, key = rng.choice(places)
        container[key] = "y" * HUGE
    else:
        line["x-pad"] = "y" * HUGE
    return _replaced(lines, i, _dumps(line))


DAMAGE: dict[str, Damage] = {
    "truncated": lambda rng, lines, i: _replaced(
        lines, i, _dumps(lines[i])[: rng.randrange(1, len(_dumps(lines[i])) - 1)]
    ),
    "not-utf8": lambda rng, lines, i: _replaced(
        lines, i, _dumps(lines[i])[:7] + b"\xff\xfe" + _dumps(lines[i])[7:]
    ),
    "nul-byte": lambda rng, lines, i: _replaced(
        lines, i, _dumps(lines[i])[:9] + b"\x00" + _dumps(lines[i])[9:]
    ),
    "garbage": lambda rng, lines, i: _replaced(lines, i, b"}{" * rng.randrange(1, 50)),
    "huge-garbage": lambda rng, lines, i: _replaced(lines, i, b"x" * HUGE),
    "not-an-object": lambda rng, lines, i: _replaced(
        lines, i, rng.choice([b"[1,2,3]", b"42", b'"text"', b"null"])
    ),
    "two-objects": lambda rng, lines, i: _replaced(lines, i, _dumps(lines[i]) * 2),
    "duplicate-line": lambda rng, lines, i: _replaced(
        lines, i, *([_dumps(lines[i])] * rng.randrange(2, 4))
    ),
    "copied-later": lambda rng, lines, i: [*_lines(lines), _dumps(lines[i])],
    "blank": lambda rng, lines, i: _replaced(lines, i, _dumps(lines[i]), b"  \t"),
    "crlf": lambda rng, lines, i: [line + b"\r" for line in _lines(lines)],
    "wrong-type": wrong_type,
    "unknown-type": unknown_type,
    "deep-line": deep_line,
    "json-text": json_text,
    "huge-valid": huge_valid,
}
#: The dead letters an entry (not its line) gets: the line was fed to the translator.
ENTRY_ERRORS = {"MappingError", "EntryError", "DuplicateId", "DepthError", "EntryTooLarge"}


class _Counting:
    """A translator that counts the objects it is fed."""

    fed = 0

    def __init__(self, file_format: str) -> None:
        inner = translator_for(file_format)
        assert inner is not None
        self.inner = inner
        self.format = inner.format

    def feed(self, value: dict[str, Any], line: int) -> list[dict[str, Any]]:
        _Counting.fed += 1
        return self.inner.feed(value, line)

    def close(self) -> list[dict[str, Any]]:
        return self.inner.close()

    @property
    def open_since(self) -> int | None:
        return self.inner.open_since


def _source_objects(data: bytes) -> tuple[int, list[tuple[int, str]]]:
    """The JSON objects of a file's lines, and (line, error) of each value or remainder that
    is not one, counted the way the reader splits lines."""
    objects = 0
    refused: list[tuple[int, str]] = []
    for number, line in enumerate(data.split(b"\n")[:-1], start=1):
        line = line.rstrip(b"\r")
        if not line.strip():
            continue
        values, remainder = split_line(line)
        objects += sum(isinstance(v, dict) for v in values)
        refused += [(number, "TypeError") for v in values if not isinstance(v, dict)]
        if remainder is not None:
            refused.append((number, remainder.error))
    return objects, refused


def _check(path: Path, data: bytes, file_format: str, rng: random.Random) -> None:
    _Counting.fed = 0
    records = list(read_session_file(path))
    objects, refused = _source_objects(data)
    assert _Counting.fed == objects
    letters = [(r.line, r.error) for r in records if isinstance(r, DeadLetter)]
    rest = list(letters)
    for found in refused:
        rest.remove(found)  # each refused value or remainder is one dead letter of its line
    assert {error for _line, error in rest} <= ENTRY_ERRORS
    sequenced = [r for r in records if isinstance(r, EntryEnvelope | PlaceholderEnvelope)]
    assert [r.seq for r in sequenced] == list(range(1, len(sequenced) + 1))
    for n, record in enumerate(records):
        if isinstance(record, PlaceholderEnvelope):
            before = records[n - 1]
            assert isinstance(before, DeadLetter) and before.line == record.payload.line
    runtime = EmbeddedRuntime()
    for record in records:
        runtime.publish(record if isinstance(record, DeadLetter) else decode(encode(record)))
    assert list(runtime.sessions())
    cuts = [rng.randrange(len(data) + 1) for _ in range(rng.randrange(1, 4))]
    assert wire(tail_in_pieces(path.with_suffix(".tail"), data, cuts)) == wire(records)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("file_format", TRANSLATED)
def test_damaged_files_read_fold_and_resume_without_error(
    tmp_path: Path,
    file_format: str,
    damage: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One damaged line: no exception, no traceback logged, every object accounted for, seqs
    without a hole, what Kafka carries decodes, a resumed tail reads as one read."""
    monkeypatch.setattr(session_file, "translator_for", _Counting)
    caplog.set_level(logging.DEBUG)
    for n in range(CASES):
        rng = random.Random(f"{SEED}/{file_format}/{damage}/{n}")
        source = write_format_session(
            tmp_path / f"src{n}", file_format, rng.randrange(2**32), rng.randrange(2, 6)
        )
        lines = [json.loads(line) for line in source.read_bytes().splitlines()]
        damaged = DAMAGE[damage](rng, lines, rng.randrange(1, len(lines)))
        data = b"\n".join(damaged) + b"\n"
        path = tmp_path / f"damaged{n}.jsonl"
        path.write_bytes(data)
        _check(path, data, file_format, rng)
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
