"""The reader's fast path for common lines (`SessionFileReader._common_line`) reads every file as
its general path does: the same records (envelopes, dead letters, placeholders), positions after
every line, ids, and resumed readers, over drawn pi files of every version with damaged,
duplicate, deep, blank, oversized and odd lines, and over the fuzz suite's damaged corpora. The
general path (the reader with `_fast` off) is the oracle."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path
from typing import Any

from damaged_sessions import CORPORA, MUTATIONS, SHARED, write_case
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.events.envelope import encode
from sessionfold.events.lines import MAX_DEPTH
from sessionfold.streams.publishing.session_file import (
    DeadLetter,
    ReadPosition,
    SessionFileReader,
    bound_fits_up_to,
    most_envelope_bytes,
    record_fits,
)
from sessionfold.streams.tools.synthetic import dumps_entry, generate_session

IDS = ["a1", "b2", "c3", "d4", "e5", "f6"]

#: Values of every JSON type, for a field a damaged entry holds in place of its own.
ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.sampled_from(["type", "x"]), st.integers(), max_size=2),
)

BLOCKS = st.sampled_from(
    [
        {"type": "text", "text": "hi"},
        {"type": "thinking", "thinking": "hmm", "thinkingSignature": "s"},
        {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {"command": "ls"}},
        {"type": "image", "data": "AAAA", "mimeType": "image/png"},
        {"type": "future"},
    ]
)


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    """A message of a common role (or one that is not), its fields sometimes odd."""
    roles = ["user", "assistant", "toolResult", "bashExecution", "hookMessage"]
    role = draw(st.sampled_from(roles))
    message: dict[str, Any] = {"role": role}
    blocks = draw(st.lists(BLOCKS, max_size=3))
    if role == "user":
        message["content"] = draw(st.sampled_from(["do it", blocks]))
    elif role == "assistant":
        message["content"] = blocks
        message["usage"] = {"input": 1, "output": 2, "cost": {"total": 0.5}}
        message["stopReason"] = "stop"
    elif role == "toolResult":
        message.update(toolCallId="c1", toolName="bash", content=blocks, isError=False)
    elif role == "bashExecution":
        message.update(command="ls", output="", exitCode=0)
    else:
        message.update(customType="x", content="note")
    message["timestamp"] = draw(st.sampled_from([1, 1.5, None]))
    if draw(st.booleans()):
        message[draw(st.sampled_from([*message, "extra"]))] = draw(ODD)
    return message


@st.composite
def entries(draw: st.DrawFn, version: int) -> dict[str, Any]:
    """An entry of the file's version: mostly messages, some of other types, a few damaged."""
    kind = draw(st.sampled_from(["message"] * 4 + ["thinking_level_change", "compaction", "x"]))
    entry: dict[str, Any] = {"type": kind}
    if version >= 2 or draw(st.integers(0, 9)) == 0:
        entry["id"] = draw(st.sampled_from(IDS))
        entry["parentId"] = draw(st.sampled_from([None, *IDS]))
    entry["timestamp"] = "2025-01-01T00:00:00Z"
    if kind == "message":
        entry["message"] = draw(messages())
    elif kind == "thinking_level_change":
        entry["thinkingLevel"] = "high"
    elif kind == "compaction":
        entry["summary"] = "s"
        entry["firstKeptEntryIndex"] = draw(st.integers(0, 5))
    if draw(st.integers(0, 4)) == 0:
        entry[draw(st.sampled_from([*entry, "z"]))] = draw(ODD)
    return entry


def deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@st.composite
def lines(draw: st.DrawFn, version: int) -> bytes:
    """One line of a pi file: an entry mostly, else something the reader must dead-letter."""
    entry = draw(entries(version))
    shape = draw(st.sampled_from(["entry"] * 8 + ["blank", "junk", "cut", "two", "array"]))
    text = json.dumps(entry)
    if shape == "blank":
        return draw(st.sampled_from([b"", b"  ", b"\t"]))
    if shape == "junk":
        return draw(st.sampled_from([b"not json", b"NaN", b"{]", b'{"a":1} x', b"\xff\xfe"]))
    if shape == "cut":
        return text.encode()[: draw(st.integers(1, len(text) - 1))]
    if shape == "two":
        return (text + json.dumps(draw(entries(version)))).encode()
    if shape == "array":
        return draw(st.sampled_from([b"[1]", b"3", b'"s"', b"null"]))
    twist = draw(st.sampled_from(["none"] * 6 + ["deep", "nearly", "surrogate", "header"]))
    if twist == "deep":
        entry["x"] = deep(MAX_DEPTH + draw(st.integers(0, 2)))
    elif twist == "nearly":
        entry["x"] = deep(MAX_DEPTH - 2)
    elif twist == "surrogate":
        return text.encode().replace(b'"timestamp"', b'"t\\ud83d"', 1)
    elif twist == "header":
        entry = {"type": "session", "id": draw(st.sampled_from(["s1", *IDS]))}
    return json.dumps(entry).encode()


@st.composite
def files(draw: st.DrawFn) -> tuple[bytes, int]:
    """A pi file of a drawn version (or none at first), and a line count to resume after."""
    version = draw(st.sampled_from([1, 2, 3]))
    header: dict[str, Any] = {"type": "session", "id": "s1"}
    if version > 1:
        header["version"] = version
    body = draw(st.lists(lines(version), max_size=14))
    first = [] if draw(st.integers(0, 9)) == 0 else [json.dumps(header).encode()]
    end = draw(st.sampled_from([b"\n", b"\r\n"]))
    data = end.join([*first, *body]) + (end if draw(st.integers(0, 5)) else b"")
    return data, draw(st.integers(0, len(body) + 1))


def comparable(record: Any) -> Any:
    """A record as compared: a dead letter as it is, an envelope with its wire bytes too."""
    if isinstance(record, DeadLetter):
        return record
    return (record, encode(record), record.model_fields_set, record.payload.model_fields_set)


def read(
    path: Path,
    fast: bool,
    position: ReadPosition | None = None,
    stop: int | None = None,
    max_line: int | None = None,
    final: bool = True,
) -> tuple[list[Any], ReadPosition, set[str]]:
    """Every line's records and the position after it, then the ids; `stop` lines at most."""
    reader = SessionFileReader(path, position=position, max_line=max_line)
    reader._fast = fast  # the general path is the oracle
    seen: list[Any] = []
    for records in reader.lines(final=final):
        seen.append(([comparable(r) for r in records], reader.position))
        if stop is not None and len(seen) >= stop:
            break
    return seen, reader.position, set(reader.ids)


def same_reads(path: Path, stop: int, max_line: int | None = None, final: bool = True) -> None:
    assert read(path, True, max_line=max_line, final=final) == read(
        path, False, max_line=max_line, final=final
    )
    _seen, position, _ids = read(path, True, stop=stop, max_line=max_line)
    fast = read(path, True, position=position, max_line=max_line, final=final)
    assert fast == read(path, False, position=position, max_line=max_line, final=final)


@settings(max_examples=400)
@given(files(), st.sampled_from([None, 200]), st.booleans())
def test_the_fast_path_reads_drawn_files_as_the_general_path(
    file: tuple[bytes, int], max_line: int | None, final: bool
) -> None:
    data, stop = file
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.jsonl"
        path.write_bytes(data)
        same_reads(path, stop, max_line, final)


@settings(max_examples=60)
@given(
    st.sampled_from(sorted(CORPORA)),
    st.sampled_from(sorted(set(MUTATIONS) - {"huge_garbage", "huge_valid"})),
    st.integers(0, 2**32),
    st.integers(0, 200),
)
def test_the_fast_path_reads_damaged_corpora_as_the_general_path(
    corpus_name: str, mutation: str, seed: int, stop: int
) -> None:
    if corpus_name.startswith("real") and not SHARED.is_dir():
        return
    rng = random.Random(seed)
    case = MUTATIONS[mutation](rng, CORPORA[corpus_name](rng))
    with tempfile.TemporaryDirectory() as tmp:
        same_reads(write_case(Path(tmp), case.damaged, case), stop)


@given(st.text(min_size=1, max_size=40), st.text(max_size=40))
def test_a_line_no_longer_than_the_bound_fits(session_id: str, producer: str) -> None:
    """`bound_fits_up_to` is the longest line whose envelope's bound fits on the topics."""
    longest = bound_fits_up_to(session_id, producer)
    key = len(session_id.encode())
    assert record_fits(key, most_envelope_bytes(longest, session_id, producer))
    assert not record_fits(key, most_envelope_bytes(longest + 1, session_id, producer))


def test_common_lines_take_the_fast_path(monkeypatch: Any) -> None:
    """Most lines of a generated session go the fast way (else it would be dead code)."""
    taken: list[bool] = []
    common_line = SessionFileReader._common_line

    def counted(self: SessionFileReader, data: bytes, length: int) -> Any:
        envelope = common_line(self, data, length)
        taken.append(envelope is not None)
        return envelope

    monkeypatch.setattr(SessionFileReader, "_common_line", counted)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.jsonl"
        objects = generate_session(7, 40)
        path.write_bytes(b"".join(dumps_entry(o).encode() + b"\n" for o in objects))
        records = list(SessionFileReader(path).records())
    assert len(records) == len(objects)
    assert sum(taken) >= 0.9 * (len(objects) - 1)
