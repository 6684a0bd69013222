"""Damaged pi session files for tests: the fuzz suite's corpora and mutations.

Not a test module: the fuzz suite (tests/unit/test_fuzz_sessions.py) and the Kafka runtime
tests import it (`from damaged_sessions import ...`; pytest puts `tests/` on sys.path for its
rootdir conftest). A `Corpus` is an intact session (real v1 windows of ../shared, generated
v3, v2 and v1); a mutation turns one into a `Case`: the damaged lines and the file with its
bad lines repaired that it must fold to (see the fuzz suite's docstring for the oracles).
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessionfold.events.envelope import MAX_ENTRY_BYTES
from sessionfold.events.migration import v1_entry_id
from sessionfold.streams.tools.synthetic import dumps_entry, generate_session

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sessions"
WINDOW = 120  # lines of a real session per case: enough for chains, cheap to fold twice
HUGE = 3_000_000

Entry = dict[str, Any]


@dataclass(frozen=True)
class Corpus:
    """An intact session: its parsed objects (header first) and its format version."""

    objects: list[Entry]
    version: int

    @property
    def session_id(self) -> str:
        return self.objects[0]["id"]

    def lines(self) -> list[bytes]:
        return [dumps_entry(o).encode() for o in self.objects]

    def entry_id(self, i: int) -> str:
        """The id the reader gives the object at line index i (header = 0)."""
        if self.version <= 1:
            return v1_entry_id(self.session_id, i)
        return self.objects[i]["id"]

    def parent_id(self, i: int) -> str | None:
        if self.version <= 1:
            return v1_entry_id(self.session_id, i - 1) if i > 1 else None
        return self.objects[i].get("parentId")


@dataclass(frozen=True)
class Case:
    """A damaged file and what it must fold to: `compare` names the view (`views`) or None."""

    damaged: list[bytes]
    repaired: list[bytes] | None = None
    compare: str | None = None
    crlf: bool = False
    bom: bool = False


def outgrowing_line(entry_id: str, parent: str | None, size: int = MAX_ENTRY_BYTES) -> bytes:
    """A custom entry line of exactly `size` bytes whose envelope encodes over 17 MiB.

    Its `data` holds 120,000 numbers written `1e15`, which orjson writes back as
    `1000000000000000.0` (14 bytes more each), then a string that pads the line to `size`.
    """
    numbers = b"[" + b",".join([b"1e15"] * 120_000) + b"]"
    head = {"type": "custom", "customType": "probe", "id": entry_id, "parentId": parent}
    prefix = json.dumps(head).encode()[:-1] + b', "timestamp": "2026-01-01T00:00:02Z", '
    prefix += b'"data": {"n": ' + numbers + b', "pad": "'
    suffix = b'"}}'
    return prefix + b"x" * (size - len(prefix) - len(suffix)) + suffix


# --- corpora ---------------------------------------------------------------------------------


def _generated(seed: int, version: int) -> Corpus:
    objects = generate_session(seed, 12)
    if version == 3:
        return Corpus(objects, 3)
    header = dict(objects[0])
    if version == 2:
        header["version"] = 2
        return Corpus([header, *objects[1:]], 2)
    return Corpus([_v1_header(header), *_v1_entries(objects)], 1)


def _v1_header(header: Entry) -> Entry:
    return {k: v for k, v in header.items() if k != "version"}


def _v1_entries(objects: list[Entry]) -> list[Entry]:
    """A linear v3 session written as v1: no ids, compactions by header-inclusive index."""
    index = {o.get("id"): i for i, o in enumerate(objects)}
    out = []
    for i, entry in enumerate(objects[1:], start=1):
        assert entry.get("parentId") == (objects[i - 1]["id"] if i > 1 else None)
        v1 = {k: v for k, v in entry.items() if k not in ("id", "parentId")}
        if "firstKeptEntryId" in v1:
            v1["firstKeptEntryIndex"] = index[v1.pop("firstKeptEntryId")]
        out.append(v1)
    return out


def _real(name: str, rng: random.Random) -> Corpus:
    lines = (SHARED / name).read_bytes().splitlines()
    start = rng.randrange(1, len(lines) - WINDOW)
    objects = [json.loads(line) for line in [lines[0], *lines[start : start + WINDOW]]]
    return Corpus(objects, 1)


CORPORA: dict[str, Callable[[random.Random], Corpus]] = {
    "real-before": lambda rng: _real("before-compaction.jsonl", rng),
    "real-large": lambda rng: _real("large-session.jsonl", rng),
    "gen-v3": lambda rng: _generated(rng.randrange(1 << 30), 3),
    "gen-v2": lambda rng: _generated(rng.randrange(1 << 30), 2),
    "gen-v1": lambda rng: _generated(rng.randrange(1 << 30), 1),
}


# --- mutations -------------------------------------------------------------------------------


def _line_index(rng: random.Random, corpus: Corpus, last: bool | None = None) -> int:
    """A line after the header; the last one in a quarter of the cases (a leaf)."""
    count = len(corpus.objects)
    if last or (last is None and rng.random() < 0.25):
        return count - 1
    return rng.randrange(1, count - 1)


def _neutral(corpus: Corpus, i: int, parent: str | None) -> bytes:
    """An entry of an unknown type: a tree node with no message (what a placeholder folds as)."""
    node = {"type": "x-neutral", "id": corpus.entry_id(i), "parentId": parent}
    return dumps_entry(node).encode()


def _dead_line(corpus: Corpus, i: int, damaged: bytes, readable_id: bool) -> Case:
    """The case of line i replaced by an object or bytes the reader dead-letters."""
    lines = corpus.lines()
    bad = [*lines[:i], damaged, *lines[i + 1 :]]
    if corpus.version <= 1 or readable_id:
        # The placeholder has the line's id; its parent is the one before (all corpora are linear).
        fixed = [*lines[:i], _neutral(corpus, i, corpus.parent_id(i)), *lines[i + 1 :]]
        return Case(bad, fixed, "state")
    gone = corpus.entry_id(i)
    before = corpus.entry_id(i - 1) if i > 1 else None
    fixed = []
    for j, obj in enumerate(corpus.objects):
        if j == i:
            continue
        if j > i and obj.get("parentId") == gone:
            obj = {**obj, "parentId": before}
        fixed.append(dumps_entry(obj).encode())
    return Case(bad, fixed, "unsequenced" if i == len(lines) - 1 else "branch")


def _inside(rng: random.Random, line: bytes) -> int:
    return rng.randrange(1, len(line) - 1)


def truncated(rng: random.Random, corpus: Corpus) -> Case:
    i = _line_index(rng, corpus)
    line = corpus.lines()[i]
    return _dead_line(corpus, i, line[: _inside(rng, line)], readable_id=False)


def invalid_utf8(rng: random.Random, corpus: Corpus) -> Case:
    i = _line_index(rng, corpus)
    line = corpus.lines()[i]
    at = _inside(rng, line)
    return _dead_line(corpus, i, line[:at] + b"\xff\xfe" + line[at:], readable_id=False)


def nul_byte(rng: random.Random, corpus: Corpus) -> Case:
    i = _line_index(rng, corpus)
    line = corpus.lines()[i]
    at = _inside(rng, line)
    return _dead_line(corpus, i, line[:at] + b"\x00" + line[at:], readable_id=False)


def huge_garbage(rng: random.Random, corpus: Corpus) -> Case:
    i = _line_index(rng, corpus)
    return _dead_line(corpus, i, b"x" * HUGE, readable_id=False)


def huge_valid(rng: random.Random, corpus: Corpus) -> Case:
    """A valid entry with a multi-megabyte unknown field: folded as the entry without it."""
    i = _line_index(rng, corpus)
    lines = corpus.lines()
    padded = {**corpus.objects[i], "x-pad": "y" * HUGE}
    return Case([*lines[:i], dumps_entry(padded).encode(), *lines[i + 1 :]], lines, "state")


def not_an_object(rng: random.Random, corpus: Corpus) -> Case:
    i = _line_index(rng, corpus)
    value = rng.choice([b"[1,2,3]", b"42", b'"text"', b"null"])
    return _dead_line(corpus, i, value, readable_id=False)


def wrong_type(rng: random.Random, corpus: Corpus) -> Case:
    """A field of the wrong type: the object is dead, its id (if any) still readable."""
    i = _line_index(rng, corpus)
    obj = dict(corpus.objects[i])
    field = rng.choice(["timestamp", "parentId", "type", "message"])
    if field == "message" and obj.get("type") != "message":
        field = "timestamp"
    obj[field] = {"timestamp": [1], "parentId": 5, "type": 3, "message": 7}[field]
    return _dead_line(corpus, i, dumps_entry(obj).encode(), readable_id=True)


def unhashable_tag(rng: random.Random, corpus: Corpus) -> Case:
    """An array or object where a union is told by a string: an entry's `type`, a message's
    `role`, a content block's `type`. The object is dead, its id still readable."""
    i = _line_index(rng, corpus)
    obj = copy.deepcopy(corpus.objects[i])
    tag = rng.choice([[], {}, ["message"], {"type": "message"}])
    message = obj.get("message")
    blocks = message.get("content") if isinstance(message, dict) else None
    places = ["type"]
    if isinstance(message, dict):
        places.append("role")
    if isinstance(blocks, list) and any(isinstance(b, dict) for b in blocks):
        places.append("block")
    place = rng.choice(places)
    if place == "type":
        obj["type"] = tag
    elif place == "role":
        message["role"] = tag
    else:
        rng.choice([b for b in blocks if isinstance(b, dict)])["type"] = tag
    return _dead_line(corpus, i, dumps_entry(obj).encode(), readable_id=True)


def missing_id(rng: random.Random, corpus: Corpus) -> Case:
    """v2/v3: no `id` (a gap); v1: no `type` (dead, its position names it)."""
    i = _line_index(rng, corpus)
    obj = dict(corpus.objects[i])
    obj.pop("type" if corpus.version <= 1 else "id")
    return _dead_line(corpus, i, dumps_entry(obj).encode(), readable_id=False)


def duplicate_id(rng: random.Random, corpus: Corpus) -> Case:
    """A later entry reuses an earlier id (v2/v3): dead-lettered, as if it were not there."""
    lines = corpus.lines()
    if corpus.version <= 1:
        return Case(lines, lines, "state")  # v1 ids come from positions: none can repeat
    j = max(2, _line_index(rng, corpus))
    i = rng.randrange(1, j)
    reused = {**corpus.objects[j], "id": corpus.entry_id(i)}
    return Case(
        [*lines[:j], dumps_entry(reused).encode(), *lines[j + 1 :]],
        [
            *lines[:j],
            *lines[j + 1 :],
        ],
        "state",
    )


def parent_cycle(rng: random.Random, corpus: Corpus) -> Case:
    """Entries pointing at later ones or at themselves: no oracle, but no hang and no crash."""
    objects = [dict(o) for o in corpus.objects]
    for _ in range(3):
        i = rng.randrange(1, len(objects))
        j = rng.randrange(i, len(objects))
        objects[i]["parentId"] = corpus.entry_id(j)  # j == i: its own parent
        objects[j]["parentId"] = corpus.entry_id(i)
    return Case([dumps_entry(o).encode() for o in objects])


def unknown_type(rng: random.Random, corpus: Corpus) -> Case:
    i = _line_index(rng, corpus)
    lines = corpus.lines()
    obj = {**corpus.objects[i], "type": "x-future-kind"}
    damaged = [*lines[:i], dumps_entry(obj).encode(), *lines[i + 1 :]]
    fixed = [*lines[:i], _neutral(corpus, i, corpus.parent_id(i)), *lines[i + 1 :]]
    if corpus.version <= 1:
        # A v1 object keeps its own keys: the neutral node only stands in for the ids.
        return Case(damaged)
    return Case(damaged, fixed, "state")


def two_objects(rng: random.Random, corpus: Corpus) -> Case:
    lines = corpus.lines()
    i = rng.randrange(1, len(lines) - 1)
    return Case([*lines[:i], lines[i] + lines[i + 1], *lines[i + 2 :]], lines, "state")


def crlf(rng: random.Random, corpus: Corpus) -> Case:
    lines = corpus.lines()
    return Case(lines, lines, "state", crlf=True)


def blank_lines(rng: random.Random, corpus: Corpus) -> Case:
    lines = list(corpus.lines())
    for _ in range(3):
        lines.insert(rng.randrange(1, len(lines) + 1), rng.choice([b"", b"   ", b"\t"]))
    return Case(lines, corpus.lines(), "state")


def bom(rng: random.Random, corpus: Corpus) -> Case:
    lines = corpus.lines()
    return Case(lines, lines, "state", bom=True)


def deep_array(rng: random.Random, corpus: Corpus) -> Case:
    i = _line_index(rng, corpus)
    depth = rng.randrange(2_000, 100_000)
    return _dead_line(corpus, i, b"[" * depth + b"]" * depth, readable_id=False)


def deep_field(rng: random.Random, corpus: Corpus) -> Case:
    """An entry with a field nested past the reader's limit: dead-lettered whole, no ids read."""
    i = _line_index(rng, corpus)
    line = corpus.lines()[i]
    depth = rng.randrange(2_000, 20_000)
    deep = line[:-1] + b',"x-deep":' + b"[" * depth + b"]" * depth + b"}"
    return _dead_line(corpus, i, deep, readable_id=False)


_CUT = "@@lone-surrogate@@"


def _texts(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths of the `text` strings in an entry (pi's text and thinking blocks)."""
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return []
    found = []
    for key, item in items:
        if key == "text" and isinstance(item, str):
            found.append((*path, key))
        found += _texts(item, (*path, key))
    return found


def _with_text_end(obj: Entry, path: tuple[Any, ...], end: str) -> Entry:
    """A copy of `obj` with `end` added to the string at `path`."""
    copy = json.loads(json.dumps(obj))
    holder = copy
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] += end
    return copy  # type: ignore[no-any-return]


def lone_surrogate(rng: random.Random, corpus: Corpus) -> Case:
    """A text cut inside a surrogate pair, as JavaScript writes it (`\\ud83d`): read as U+FFFD."""
    lines = corpus.lines()
    candidates = [(i, p) for i in range(1, len(lines)) for p in _texts(corpus.objects[i])]
    if not candidates:
        return Case(lines, lines, "state")
    i, path = rng.choice(candidates)
    cut = dumps_entry(_with_text_end(corpus.objects[i], path, _CUT)).encode()
    damaged = cut.replace(_CUT.encode(), b"\\ud83d")
    fixed = dumps_entry(_with_text_end(corpus.objects[i], path, "\ufffd")).encode()
    return Case(
        [*lines[:i], damaged, *lines[i + 1 :]], [*lines[:i], fixed, *lines[i + 1 :]], "state"
    )


def non_finite(rng: random.Random, corpus: Corpus) -> Case:
    """A number JSON has no text for (`NaN`, `Infinity`, past a double): a dead line."""
    i = _line_index(rng, corpus)
    line = corpus.lines()[i]
    number = rng.choice([b"NaN", b"Infinity", b"-Infinity", b"1e400"])
    return _dead_line(corpus, i, line[:-1] + b',"x-n":' + number + b"}", readable_id=False)


MUTATIONS: dict[str, Callable[[random.Random, Corpus], Case]] = {
    f.__name__: f
    for f in (
        truncated,
        invalid_utf8,
        nul_byte,
        huge_garbage,
        huge_valid,
        not_an_object,
        wrong_type,
        unhashable_tag,
        missing_id,
        duplicate_id,
        parent_cycle,
        unknown_type,
        two_objects,
        crlf,
        blank_lines,
        bom,
        deep_array,
        deep_field,
        lone_surrogate,
        non_finite,
    )
}


def write_case(tmp: Path, lines: list[bytes], case: Case) -> Path:
    """Write a case's lines (CRLF, BOM as it asks) as a new file under `tmp`."""
    newline = b"\r\n" if case.crlf else b"\n"
    path = tmp / f"s{len(list(tmp.iterdir()))}.jsonl"
    path.write_bytes((b"\xef\xbb\xbf" if case.bom else b"") + newline.join(lines) + newline)
    return path
