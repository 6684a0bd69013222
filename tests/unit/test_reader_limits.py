"""The reader's limits: byte order marks, deep nesting, line caps, envelope sizes, file kinds."""

from __future__ import annotations

import json
import os
import socket
import tracemalloc
from collections.abc import Iterable
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sessionfold.events.envelope import (
    EntryEnvelope,
    EnvelopeError,
    PlaceholderEnvelope,
    decode,
    encode,
)
from sessionfold.events.lines import DEPTH_REASON, MAX_DEPTH, split_line
from sessionfold.ports.ledger_http import extract_json
from sessionfold.ports.model_http import ModelError, _read_body, _read_events
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.store import DictStore
from sessionfold.streams.kafka.table_store import WriteSet
from sessionfold.streams.publishing import session_file
from sessionfold.streams.publishing.session_file import (
    BOM,
    MAX_LINE_ENV,
    RAW_PREFIX_BYTES,
    TOO_LONG_REASON,
    DeadLetter,
    FileKindError,
    SessionFileReader,
    header_of,
    max_line_bytes,
    most_envelope_bytes,
    read_session_file,
    session_files,
)
from sessionfold.streams.worker.agents import SourceRecord, fold_record

HEADER = {"type": "session", "version": 3, "id": "s1", "timestamp": "2025-01-01T00:00:00Z"}


def _entry(n: int, **extra: object) -> dict[str, object]:
    return {
        "type": "custom",
        "customType": "probe",
        "id": f"e{n}",
        "parentId": f"e{n - 1}" if n > 1 else None,
        "timestamp": "2025-01-01T00:00:01Z",
        **extra,
    }


def _lines(*values: object) -> bytes:
    return b"".join(orjson.dumps(v) + b"\n" for v in values)


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def _records(path: Path, **kwargs: object) -> list[object]:
    return _read(SessionFileReader(path, **kwargs).records())  # type: ignore[arg-type]


def _read(records: Iterable[object]) -> list[object]:
    """The records but the placeholders that follow dead letters (test_session_file's part)."""
    return [r for r in records if not isinstance(r, PlaceholderEnvelope)]


# --- byte order mark ---------------------------------------------------------------------


def test_bom_at_file_start_is_skipped_and_offsets_count_it(tmp_path: Path) -> None:
    """A BOM before the header reads like no BOM; the offsets stay the file's byte offsets."""
    body = _lines(HEADER, _entry(1), _entry(2))
    plain, marked = tmp_path / "plain.jsonl", tmp_path / "marked.jsonl"
    plain.write_bytes(body)
    marked.write_bytes(BOM + body)
    expected = [r.payload.entry for r in read_session_file(plain)]  # type: ignore[union-attr]
    reader = SessionFileReader(marked)
    records = _read(reader.records())
    assert all(isinstance(r, EntryEnvelope) for r in records)
    assert [r.payload.entry for r in records] == expected  # type: ignore[union-attr]
    assert reader.position.offset == len(BOM) + len(body)
    # A checkpoint after the header resumes at the right byte.
    first = SessionFileReader(marked)
    header_line = next(first.lines())
    assert first.position.offset == len(BOM) + len(orjson.dumps(HEADER)) + 1
    rest = list(SessionFileReader(marked, first.position).records())
    assert header_line[0].payload.entry == expected[0]  # type: ignore[union-attr]
    assert [r.payload.entry for r in rest] == expected[1:]  # type: ignore[union-attr]


def test_bom_elsewhere_is_not_accepted(tmp_path: Path) -> None:
    """Only the file's first bytes may be a BOM; one before a later line is damage."""
    path = tmp_path / "s.jsonl"
    path.write_bytes(_lines(HEADER) + BOM + _lines(_entry(1)))
    records = _records(path)
    assert isinstance(records[0], EntryEnvelope)
    assert isinstance(records[1], DeadLetter) and records[1].line == 2


# --- deep nesting ------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 300, 1024, 1025, 5000, 100_000])
def test_deep_nesting_is_dead_lettered(tmp_path: Path, depth: int) -> None:
    """Any depth past the limit is one dead letter, whatever parser would have given up."""
    path = tmp_path / "s.jsonl"
    path.write_bytes(
        _lines(HEADER)
        + b"[" * depth
        + b"]" * depth
        + b"\n"
        + orjson.dumps(_entry(1))
        + b"[" * depth  # an entry, then a damaged deep tail: the fallback parser's case
        + b"\n"
        + _lines(_entry(2))
    )
    records = _records(path)
    kinds = [(type(r).__name__, getattr(r, "reason", None)) for r in records]
    assert kinds[0] == ("EntryEnvelope", None)
    assert kinds[1] == ("DeadLetter", DEPTH_REASON)
    assert kinds[2] == ("EntryEnvelope", None)
    assert kinds[3][0] == "DeadLetter"
    assert kinds[4] == ("EntryEnvelope", None)


def test_nesting_at_the_limit_is_read_and_encodes(tmp_path: Path) -> None:
    """An entry as deep as allowed becomes an envelope that goes on the wire and back."""
    path = tmp_path / "s.jsonl"
    # The entry object and its field take two levels of the limit.
    path.write_bytes(_lines(HEADER, _entry(1, data=_nested(MAX_DEPTH - 2))))
    records = _records(path)
    assert all(isinstance(r, EntryEnvelope) for r in records)
    for record in records:
        assert decode(encode(record)) == record  # type: ignore[arg-type]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    depth=st.integers(min_value=1, max_value=2000),
    wrap=st.sampled_from(["list", "dict", "mixed"]),
    tail=st.sampled_from([b"", b"]", b"}", b"garbage", b"{}"]),
)
def test_every_envelope_the_reader_yields_encodes(
    tmp_path: Path, depth: int, wrap: str, tail: bytes
) -> None:
    """Whatever the nesting, no line raises and every envelope read can be sent and decoded."""
    path = tmp_path / "fuzz.jsonl"
    # The deep value as a field of an entry, built as text: orjson cannot write past 254.
    inner = _deep_text(depth, wrap)
    path.write_bytes(
        _lines(HEADER) + orjson.dumps(_entry(1))[:-1] + b',"data":' + inner + b"}" + tail + b"\n"
    )
    records = _records(path)
    assert len(records) >= 2
    for record in records:
        if isinstance(record, EntryEnvelope):
            assert decode(encode(record)) == record
        else:
            assert isinstance(record, DeadLetter) and record.reason


def _deep_text(depth: int, wrap: str) -> bytes:
    opens, closes = [], []
    for level in range(depth):
        if wrap == "list" or (wrap == "mixed" and level % 2):
            opens.append(b"[")
            closes.append(b"]")
        else:
            opens.append(b'{"k":')
            closes.append(b"}")
    return b"".join(opens) + b'"x"' + b"".join(reversed(closes))


def test_deep_envelope_is_refused_by_name() -> None:
    """A record from a topic nested too deep is an EnvelopeError (dead-lettered), never a crash."""
    entry = orjson.dumps(_entry(1))[:-1] + b',"data":' + _deep_text(400, "list") + b"}"
    record = (
        b'{"schema_version":1,"kind":"entry","session_id":"s1","seq":1,"producer":"p",'
        b'"payload":{"entry":' + entry + b',"line":2}}'
    )
    for data in (record, b"[" * 5000 + b"]" * 5000):
        with pytest.raises(EnvelopeError, match=DEPTH_REASON):
            decode(data)


def test_split_line_survives_an_integer_too_long_for_python() -> None:
    """An integer of 8,000 digits on a line orjson refuses reaches the pure-Python parser,
    whose int() refuses it: the rest of the line is dead-lettered, never a ValueError."""
    for line in (b"{}" + b"1" * 8000, b'{"a":1}{"n":' + b"9" * 8000 + b"}"):
        values, rest = split_line(line)
        assert values in ([{}], [{"a": 1}])
        assert rest is not None and rest.reason == "not JSON"


def test_split_line_survives_a_deep_fallback_parse() -> None:
    """Garbage first sends the line to the recursive parser; depth there is caught too."""
    values, rest = split_line(b"{}" + b"[" * 50_000 + b"]" * 50_000)
    assert values == [{}]
    assert rest is not None and rest.reason == DEPTH_REASON and rest.start == 2


# --- values the wire carries ----------------------------------------------------------------


def test_lone_surrogate_becomes_the_replacement_character(tmp_path: Path) -> None:
    """JavaScript writes a string cut inside a surrogate pair as a lone escape: the entry is
    read (a matched pair stays one character) and its envelope goes on the wire and back."""
    path = tmp_path / "s.jsonl"
    entry = orjson.dumps(_entry(1, data="MARK"))
    lone = entry.replace(b"MARK", b"cut \\ud83d|\\ude00 \\ud83d\\ude00")
    keyed = orjson.dumps(_entry(2)).replace(b'"type"', b'"\\udc00":1,"type"')
    path.write_bytes(_lines(HEADER) + lone + b"\n" + keyed + orjson.dumps(_entry(3)) + b"\n")
    records = _records(path)
    assert [type(r) for r in records] == [EntryEnvelope] * 4
    assert records[1].payload.entry["data"] == "cut \ufffd|\ufffd \U0001f600"
    assert records[2].payload.entry["\ufffd"] == 1
    for record in records:
        assert decode(encode(record)) == record  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "number",
    [b"18446744073709551615", b"18446744073709551616", b"-9223372036854775809", b"1.5e308", b"-0"],
)
def test_fallback_decoder_reads_numbers_as_orjson_does(number: bytes) -> None:
    """Two objects on a line take the pure-Python decoder: it gives what orjson gives one."""
    line = b'{"n":' + number + b"}"
    values, rest = split_line(line + line)
    assert rest is None
    assert values == [orjson.loads(line)] * 2
    assert [orjson.loads(orjson.dumps(v)) for v in values] == values


@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1" + b"0" * 400])
def test_numbers_the_wire_cannot_carry_are_not_json(tmp_path: Path, value: bytes) -> None:
    """Not JSON alone or after another object: a dead letter that keeps its place."""
    bad = orjson.dumps(_entry(2))[:-1] + b',"n":' + value + b"}"
    for line in (bad, orjson.dumps(_entry(2)) + bad):
        assert split_line(line)[1] is not None
    path = tmp_path / "s.jsonl"
    path.write_bytes(_lines(HEADER, _entry(1)) + bad + b"\n")
    records = list(read_session_file(path))
    letter = records[2]
    assert isinstance(letter, DeadLetter) and letter.reason == "not JSON"
    assert isinstance(records[3], PlaceholderEnvelope)


# --- envelopes that encode longer than their line ----------------------------------------

#: Tokens of JSON text, several of which orjson writes longer than they were written.
_TOKENS = st.one_of(
    st.builds(lambda m, e: f"{m}e{e}".encode(), st.integers(1, 9), st.integers(-7, 22)),
    st.integers(-(2**70), 2**70).map(lambda n: str(n).encode()),  # past 64 bits: a float
    st.text(max_size=8).map(lambda t: json.dumps(t).encode()),  # \u escapes: shorter again
    st.sampled_from([b"true", b"null", b"-0", b"0.0e0", b"1E15"]),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    tokens=st.lists(_TOKENS, min_size=1, max_size=3000),
    session_id=st.text(min_size=1, max_size=40),
    version=st.sampled_from([1, 3]),
    stamp=st.text(max_size=40),
)
@example(tokens=[b"1e15"] * 3000, session_id="\x01" * 40, version=1, stamp="")  # the most growth
def test_envelope_bound_holds_when_json_encodes_longer(
    tmp_path: Path, tokens: list[bytes], session_id: str, version: int, stamp: str
) -> None:
    """`most_envelope_bytes` bounds every envelope read (the reader encodes none under it):
    numbers written short, a v1 entry's added ids, the timestamp repeated as the envelope's
    time, a session id of control characters."""
    header = orjson.dumps({"type": "session", "version": version, "id": session_id})
    own_ids = b'"id":"e1","parentId":null,' if version == 3 else b""
    entry = b'{"type":"custom","customType":"p",' + own_ids + b'"timestamp":'
    entry += json.dumps(stamp).encode() + b',"data":[' + b",".join(tokens) + b"]}"
    path = tmp_path / "grow.jsonl"
    path.write_bytes(header + b"\n" + entry + b"\n")
    envelopes = list(SessionFileReader(path).records())
    assert [type(e) for e in envelopes] == [EntryEnvelope, EntryEnvelope]
    for envelope, line in zip(envelopes, (header, entry), strict=True):
        assert isinstance(envelope, EntryEnvelope)
        bound = most_envelope_bytes(len(line), envelope.session_id, envelope.producer)
        assert len(encode(envelope)) <= bound


def test_only_a_line_near_the_limit_is_encoded_to_measure_it(
    tmp_path: Path, shared_sessions: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ordinary lines pay no encoding in the reader: a real session's (the longest 116 KB)
    are never encoded; a 4 MiB line, whose bound passes the topics' limit, is, once."""
    measured: list[int] = []

    def counting(envelope: EntryEnvelope) -> bytes:
        measured.append(envelope.seq)
        return encode(envelope)

    monkeypatch.setattr(session_file, "encode", counting)
    assert len(list(read_session_file(shared_sessions / "large-session.jsonl"))) > 1000
    assert measured == []
    path = tmp_path / "near.jsonl"
    path.write_bytes(_lines(HEADER, _entry(1, data="x" * (4 << 20)), _entry(2)))
    kinds = [type(r) for r in read_session_file(path)]
    assert kinds == [EntryEnvelope] * 3 and measured == [2]


# --- line cap ------------------------------------------------------------------------------


def test_line_over_the_cap_is_dead_lettered_with_its_size(tmp_path: Path) -> None:
    """A too-long line becomes one dead letter: its full size, a bounded prefix of its bytes."""
    path = tmp_path / "s.jsonl"
    long_entry = orjson.dumps(_entry(1, data="y" * 200_000))
    path.write_bytes(_lines(HEADER) + long_entry + b"\r\n" + _lines(_entry(2)))
    reader = SessionFileReader(path, max_line=150_000)
    records = _read(reader.records())
    letter = records[1]
    assert isinstance(letter, DeadLetter)
    assert (letter.line, letter.reason, letter.error) == (2, TOO_LONG_REASON, "LineTooLong")
    assert letter.size == len(long_entry)
    assert letter.raw == long_entry[:RAW_PREFIX_BYTES]
    assert isinstance(records[2], EntryEnvelope) and records[2].payload.line == 3
    assert reader.position.offset == path.stat().st_size


def test_cap_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SESSIONFOLD_MAX_LINE_BYTES sets the cap; a value that is no size is refused by name."""
    path = tmp_path / "s.jsonl"
    path.write_bytes(_lines(HEADER, _entry(1, data="z" * 500)))
    monkeypatch.setenv(MAX_LINE_ENV, "400")
    assert max_line_bytes() == 400
    assert [type(r).__name__ for r in _read(read_session_file(path))] == [
        "EntryEnvelope",
        "DeadLetter",
    ]
    for bad in ("0", "-5", "lots"):
        monkeypatch.setenv(MAX_LINE_ENV, bad)
        with pytest.raises(ValueError, match=MAX_LINE_ENV):
            max_line_bytes()
    monkeypatch.delenv(MAX_LINE_ENV)
    assert max_line_bytes() == 64 * 1024 * 1024


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    cap=st.integers(min_value=60, max_value=400),
    sizes=st.lists(st.integers(min_value=0, max_value=900), min_size=1, max_size=8),
    ending=st.sampled_from([b"\n", b"\r\n"]),
    last_newline=st.booleans(),
)
def test_cap_fuzz_offsets_and_verdicts(
    tmp_path: Path, cap: int, sizes: list[int], ending: bytes, last_newline: bool
) -> None:
    """Lines around the cap: each is read or dead-lettered by its size, offsets add up,
    and a tailing reader resumes exactly where a whole read would be."""
    lines = [orjson.dumps(HEADER)]
    for n, size in enumerate(sizes, start=1):
        base = orjson.dumps(_entry(n, data=""))
        lines.append(base[:-2] + b"w" * size + base[-2:])
    body = ending.join(lines) + (ending if last_newline else b"")
    path = tmp_path / "cap.jsonl"
    path.write_bytes(body)
    reader = SessionFileReader(path, max_line=cap)
    records = _read(r for rs in reader.lines() for r in rs)
    assert reader.position.offset == len(body)
    assert reader.position.line == len(lines)
    for number, (line, record) in enumerate(zip(lines, records, strict=True), start=1):
        ended = number < len(lines) or last_newline
        # The cap counts the bytes before the newline: a carriage return is one of them.
        too_long = len(line) + (ending == b"\r\n" and ended) > cap
        assert isinstance(record, DeadLetter) == too_long
        if isinstance(record, DeadLetter):
            assert record.reason == TOO_LONG_REASON and record.size == len(line)
    tail = SessionFileReader(path, max_line=cap)
    list(tail.lines(final=False))
    expected = len(body) if last_newline else len(body) - len(lines[-1])
    assert tail.position.offset == expected


def test_partial_long_line_waits_when_tailing(tmp_path: Path) -> None:
    """A too-long line still being written is not dead-lettered until its newline comes."""
    path = tmp_path / "s.jsonl"
    path.write_bytes(_lines(HEADER) + b'{"type":"custom",' + b"q" * 5000)
    reader = SessionFileReader(path, max_line=1000)
    assert len(_read(r for rs in reader.lines(final=False) for r in rs)) == 1
    at = reader.position.offset
    list(reader.lines(final=False))
    assert reader.position.offset == at
    with path.open("ab") as handle:
        handle.write(b"\n")
    later = _read(r for rs in reader.lines(final=False) for r in rs)
    assert len(later) == 1 and isinstance(later[0], DeadLetter)
    assert later[0].size == len(b'{"type":"custom",') + 5000
    assert reader.position.offset == path.stat().st_size


@pytest.mark.slow
def test_memory_stays_bounded_on_a_huge_line(tmp_path: Path) -> None:
    """A 50 MB line under a 1 MB cap is skipped without being held: the peak stays near 1 MB."""
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as handle:
        handle.write(_lines(HEADER))
        handle.write(b'{"type":"custom","data":"')
        chunk = b"h" * (1 << 20)
        for _ in range(50):
            handle.write(chunk)
        handle.write(b'"}\n')
        handle.write(_lines(_entry(1)))
    tracemalloc.start()
    try:
        records = _read(SessionFileReader(path, max_line=1 << 20).records())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [type(r).__name__ for r in records] == ["EntryEnvelope", "DeadLetter", "EntryEnvelope"]
    assert records[1].size > 50 << 20  # type: ignore[union-attr]
    assert peak < 6 << 20, f"peak {peak} bytes"


# --- files that are not regular files --------------------------------------------------------


@pytest.mark.timeout(30)
def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO is refused by kind at once (a plain open would wait for a writer forever)."""
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(FileKindError, match="FIFO") as caught:
        list(read_session_file(fifo))
    assert caught.value.path == str(fifo)
    with pytest.raises(FileKindError):
        header_of(fifo)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("target", "kind"), [("/dev/zero", "character device"), (".", "directory")]
)
def test_devices_and_directories_are_refused(tmp_path: Path, target: str, kind: str) -> None:
    """/dev/zero would be one endless line; a directory is no file: both refused by kind."""
    path = Path(target) if target.startswith("/") else tmp_path
    with pytest.raises(FileKindError, match=kind):
        list(read_session_file(path))
    link = tmp_path / "link.jsonl"
    link.symlink_to(path)
    with pytest.raises(FileKindError, match=kind):
        list(read_session_file(link))


@pytest.mark.timeout(30)
def test_directory_expansion_skips_what_is_not_a_regular_file(tmp_path: Path) -> None:
    """Under a directory, a FIFO, a socket or a device link named *.jsonl is not taken."""
    good = tmp_path / "a.jsonl"
    good.write_bytes(_lines(HEADER))
    os.mkfifo(tmp_path / "b.jsonl")
    (tmp_path / "c.jsonl").symlink_to("/dev/zero")
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(tmp_path / "d.jsonl"))
        assert list(session_files([tmp_path])) == [good]
    finally:
        server.close()


@pytest.mark.parametrize("depth", [200, 1000, 5000])
def test_worker_dead_letters_a_deep_record(depth: int) -> None:
    """A record nested too deep on session-events is a fault with a reason, never a raise."""
    entry = orjson.dumps(_entry(1))[:-1] + b',"data":' + _deep_text(depth, "mixed") + b"}"
    value = (
        b'{"schema_version":1,"kind":"entry","session_id":"s1","seq":1,"producer":"p",'
        b'"payload":{"entry":' + entry + b',"line":2}}'
    )
    record = SourceRecord("t.session-events", 0, 5, b"s1", value)
    result = fold_record(WriteSet(DictStore()), record, DEFAULT_CONFIG)
    assert result.fault is not None
    assert (result.fault.reason, DEPTH_REASON in result.fault.error) == ("undecodable", True)


def test_model_answers_nested_too_deep_are_malformed_not_a_crash() -> None:
    """A model server's answer is untrusted too: deep JSON is a malformed answer, not a raise."""
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ModelError) as body:
        _read_body(deep.encode(), "m")
    assert body.value.detail == "not-json"
    with pytest.raises(ModelError) as stream:
        _read_events(iter([f"data: {deep}", ""]), "m", None)
    assert stream.value.detail == "bad-event"
    value, defect = extract_json('{"a": ' + deep + "}")
    assert value is None and defect is not None


def test_lines_longer_than_a_read_chunk(tmp_path: Path) -> None:
    """Lines around the 1 MiB read chunk and a 2 MiB cap: read whole below it, refused above."""
    chunk = 1 << 20
    sizes = [chunk - 1, chunk, chunk + 1, 2 * chunk, 2 * chunk + 1, 3 * chunk + 7]
    lines = [orjson.dumps(HEADER)]
    for n, size in enumerate(sizes, start=1):
        base = orjson.dumps(_entry(n, data=""))
        lines.append(base[:-2] + b"m" * (size - len(base)) + base[-2:])
    path = tmp_path / "chunks.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    reader = SessionFileReader(path, max_line=2 * chunk)
    records = _read(reader.records())
    verdicts = [(type(r).__name__, getattr(r, "size", None)) for r in records[1:]]
    assert verdicts == [
        ("EntryEnvelope", None),
        ("EntryEnvelope", None),
        ("EntryEnvelope", None),
        ("EntryEnvelope", None),
        ("DeadLetter", 2 * chunk + 1),
        ("DeadLetter", 3 * chunk + 7),
    ]
    assert [r.payload.line for r in records[1:5]] == [2, 3, 4, 5]  # type: ignore[union-attr]
    assert reader.position.offset == path.stat().st_size
