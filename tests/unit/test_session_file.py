"""The session-file reader: real files, damaged lines, migration, resumption."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import orjson
import pytest
from damaged_sessions import outgrowing_line
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.events.entries import parse_entry
from sessionfold.events.envelope import EntryEnvelope, EntryPayload, PlaceholderEnvelope, encode
from sessionfold.events.migration import v1_entry_id
from sessionfold.streams.kafka.topics import MAX_MESSAGE_BYTES
from sessionfold.streams.publishing.publisher import dead_letter_record
from sessionfold.streams.publishing.session_file import (
    DEAD_LETTER_RAW_BYTES,
    ENTRY_TOO_LARGE,
    MAX_ENTRY_BYTES,
    DeadLetter,
    ReadPosition,
    SessionFileReader,
    read_session_file,
)

REAL_FILES = ["before-compaction.jsonl", "large-session.jsonl"]


#: The records of a header, an entry, a dead line and an entry: the dead line keeps its place
#: (a dead letter, then a placeholder with the seq it would have had).
DEAD_THIRD_LINE = [
    "EntryEnvelope",
    "EntryEnvelope",
    "DeadLetter",
    "PlaceholderEnvelope",
    "EntryEnvelope",
]


def _plain_role_count(path: Path) -> Counter[str]:
    """Messages by role, counted straight from the file with the json module."""
    roles: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        if line.strip():
            obj = json.loads(line)
            if obj.get("type") == "message":
                roles[obj["message"]["role"]] += 1
    return roles


@pytest.mark.parametrize("name", REAL_FILES)
def test_real_session_parses_completely(shared_sessions: Path, name: str) -> None:
    """Every line of a real file is an envelope or a dead letter; role counts match the file."""
    path = shared_sessions / name
    lines = [line for line in path.read_bytes().split(b"\n") if line.strip()]
    records = list(read_session_file(path))
    envelopes = [r for r in records if isinstance(r, EntryEnvelope)]
    letters = [r for r in records if isinstance(r, DeadLetter)]
    assert all(letter.reason for letter in letters)
    assert len(envelopes) + len(letters) == len(lines)
    roles = Counter(
        e.payload.entry["message"]["role"]
        for e in envelopes
        if e.payload.entry["type"] == "message"
    )
    assert roles == _plain_role_count(path)
    assert [e.seq for e in envelopes] == list(range(1, len(envelopes) + 1))
    header = json.loads(lines[0])
    assert {e.session_id for e in envelopes} == {header["id"]}


@pytest.mark.parametrize("name", REAL_FILES)
def test_v1_file_becomes_a_linear_chain(shared_sessions: Path, name: str) -> None:
    """A v1 file's entries get deterministic ids and each entry's parent is the one before."""
    envelopes = [
        r for r in read_session_file(shared_sessions / name) if not isinstance(r, DeadLetter)
    ]
    entries = [e.payload.entry for e in envelopes[1:]]
    assert entries[0]["parentId"] is None
    for before, after in itertools.pairwise(entries):
        assert after["parentId"] == before["id"]
    assert len({e["id"] for e in entries}) == len(entries)
    again = [r for r in read_session_file(shared_sessions / name) if not isinstance(r, DeadLetter)]
    assert [e.payload.entry["id"] for e in again[1:]] == [e["id"] for e in entries]


def test_v1_compaction_index_resolves_to_the_kept_entry(shared_sessions: Path) -> None:
    """firstKeptEntryIndex (header counted as 0) becomes the id of that entry."""
    envelopes = [
        r
        for r in read_session_file(shared_sessions / "before-compaction.jsonl")
        if not isinstance(r, DeadLetter)
    ]
    by_id = {e.payload.entry.get("id"): i for i, e in enumerate(envelopes)}
    compactions = [e.payload.entry for e in envelopes if e.payload.entry["type"] == "compaction"]
    assert len(compactions) == 2
    for compaction in compactions:
        assert "firstKeptEntryIndex" not in compaction
        kept = envelopes[by_id[compaction["firstKeptEntryId"]]].payload.entry
        assert kept["message"]["role"] == "user"


def _write(tmp_path: Path, lines: list[bytes], name: str = "s.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


HEADER = (
    b'{"type":"session","version":3,"id":"sess-1","timestamp":"2026-01-01T00:00:00Z","cwd":"/w"}'
)


def _message(entry_id: str, parent: str | None, text: str = "hi") -> bytes:
    return orjson.dumps(
        {
            "type": "message",
            "id": entry_id,
            "parentId": parent,
            "timestamp": "2026-01-01T00:00:01Z",
            "message": {
                "role": "user",
                "content": [{"type": "text", "text": text}],
                "timestamp": 1,
            },
        }
    )


def test_two_objects_on_one_line_are_two_events(tmp_path: Path) -> None:
    """A line holding two objects yields both; trailing garbage becomes a dead letter."""
    path = _write(tmp_path, [HEADER, _message("a", None) + _message("b", "a") + b"garbage{"])
    records = list(read_session_file(path))
    kinds = [type(r).__name__ for r in records]
    assert kinds == [
        "EntryEnvelope",
        "EntryEnvelope",
        "EntryEnvelope",
        "DeadLetter",
        "PlaceholderEnvelope",
    ]
    letter = records[-2]
    assert isinstance(letter, DeadLetter)
    assert (letter.line, letter.size, letter.session_id) == (2, len(b"garbage{"), "sess-1")
    gap = records[-1]
    assert isinstance(gap, PlaceholderEnvelope)
    assert (gap.seq, gap.payload.id, gap.payload.line) == (4, None, 2)


def test_missing_header_dead_letters_every_line(tmp_path: Path) -> None:
    """Without a session header nothing is guessed: each line is a dead letter with a reason."""
    path = _write(tmp_path, [_message("a", None), _message("b", "a")])
    records = list(read_session_file(path))
    assert all(isinstance(r, DeadLetter) and r.error == "HeaderError" for r in records)
    assert len(records) == 2


@pytest.mark.parametrize("kind", [[], {}, ["session"], {"type": "session"}])
def test_a_first_object_typed_by_an_array_or_object_is_a_dead_letter(
    tmp_path: Path, kind: object
) -> None:
    """Format detection reads a first object's `type` only as a string: an unhashable one is an
    object that names no format, dead-lettered for the missing header, never a crash."""
    first = json.dumps({"type": kind, "payload": {}}).encode()
    records = list(read_session_file(_write(tmp_path, [first, HEADER])))
    assert isinstance(records[0], DeadLetter)
    assert (records[0].error, records[0].reason) == ("HeaderError", "no session header before it")
    assert len(records) == 2 and not isinstance(records[1], DeadLetter)


def test_unknown_entry_types_and_fields_are_kept(tmp_path: Path) -> None:
    """An unknown entry type and an unknown field pass through unchanged."""
    odd = b'{"type":"hologram","id":"z","parentId":null,"beam":[1,2]}'
    known = b'{"type":"label","id":"y","parentId":"z","targetId":"z","label":"x","extra":true}'
    records = list(read_session_file(_write(tmp_path, [HEADER, odd, known])))
    assert [r.payload.entry for r in records[1:]] == [orjson.loads(odd), orjson.loads(known)]


def test_hook_message_role_becomes_custom(tmp_path: Path) -> None:
    """A v2 hookMessage is migrated to role custom."""
    header = b'{"type":"session","version":2,"id":"s2"}'
    hook = (
        b'{"type":"message","id":"a","parentId":null,'
        b'"message":{"role":"hookMessage","customType":"x","content":"c"}}'
    )
    records = list(read_session_file(_write(tmp_path, [header, hook])))
    assert records[1].payload.entry["message"]["role"] == "custom"


def test_v1_ids_are_position_derived(tmp_path: Path) -> None:
    """A v1 entry's id depends on the session id and its header-inclusive index only."""
    header = b'{"type":"session","id":"v1s"}'
    entry = b'{"type":"model_change","provider":"p","modelId":"m"}'
    records = list(read_session_file(_write(tmp_path, [header, entry, entry])))
    assert records[1].payload.entry["id"] == v1_entry_id("v1s", 1)
    assert records[2].payload.entry["parentId"] == v1_entry_id("v1s", 1)


@pytest.mark.parametrize(
    ("index", "kept"), [(b"2", 2), (b"2.0", 2), (b"2.5", None), (b"true", None), (b'"2"', None)]
)
def test_v1_compaction_index_is_what_pi_takes_for_a_position(
    tmp_path: Path, index: bytes, kept: int | None
) -> None:
    """pi looks a compaction's firstKeptEntryIndex up when it is a JSON number (2.0 is entry
    2, 2.5 none); true or "2" name no entry and give no firstKeptEntryId."""
    header = b'{"type":"session","id":"v1s"}'
    entry = b'{"type":"model_change","provider":"p","modelId":"m"}'
    compaction = b'{"type":"compaction","summary":"s","firstKeptEntryIndex":' + index + b"}"
    lines = [header, entry, entry, entry, compaction]
    migrated = list(read_session_file(_write(tmp_path, lines)))[4].payload.entry
    assert migrated["type"] == "compaction"
    assert migrated.get("firstKeptEntryId") == (None if kept is None else v1_entry_id("v1s", kept))


def test_schema_invalid_entry_keeps_its_place(tmp_path: Path) -> None:
    """An object with a readable id that is not a valid entry: a dead letter and a placeholder
    with its ids and the seq it would have had; the entry after it keeps its seq."""
    bad = b'{"type":"message","id":"b","parentId":"a","message":7}'
    path = _write(tmp_path, [HEADER, _message("a", None), bad, _message("c", "b")])
    records = list(read_session_file(path))
    assert [type(r).__name__ for r in records] == DEAD_THIRD_LINE
    letter, placeholder, after = records[2], records[3], records[4]
    assert isinstance(letter, DeadLetter) and letter.error == "EntryError"
    assert isinstance(placeholder, PlaceholderEnvelope)
    assert placeholder.payload.model_dump() == {
        "id": "b",
        "parentId": "a",
        "previous": False,
        "line": 3,
        "reason": letter.reason,
    }
    assert (placeholder.seq, after.seq) == (3, 4)


def test_unreadable_parent_id_hangs_under_the_previous_entry(tmp_path: Path) -> None:
    """A placeholder whose parentId is missing or not a string says so (`previous`)."""
    bad = b'{"type":"message","id":"b","parentId":5,"message":{"role":"user","content":"x"}}'
    path = _write(tmp_path, [HEADER, _message("a", None), bad])
    placeholder = list(read_session_file(path))[-1]
    assert isinstance(placeholder, PlaceholderEnvelope)
    assert (placeholder.payload.id, placeholder.payload.parentId) == ("b", None)
    assert placeholder.payload.previous


def test_unreadable_v1_line_keeps_the_position_ids(tmp_path: Path) -> None:
    """In a v1 file a line that is not JSON still takes its position: the placeholder gets the
    position's id and the entries after it keep the ids of the intact file."""
    header = b'{"type":"session","id":"v1s"}'
    entry = b'{"type":"model_change","provider":"p","modelId":"m"}'
    records = list(read_session_file(_write(tmp_path, [header, entry, entry[:20], entry])))
    placeholder, last = records[3], records[4]
    assert isinstance(placeholder, PlaceholderEnvelope)
    assert placeholder.payload.id == v1_entry_id("v1s", 2)
    assert placeholder.payload.parentId == v1_entry_id("v1s", 1)
    assert last.payload.entry["id"] == v1_entry_id("v1s", 3)
    assert last.payload.entry["parentId"] == v1_entry_id("v1s", 2)


def test_duplicate_id_is_dead_lettered(tmp_path: Path) -> None:
    """The second entry with an id already read is a dead letter, and takes no seq."""
    path = _write(
        tmp_path, [HEADER, _message("a", None), _message("a", None, "again"), _message("b", "a")]
    )
    records = list(read_session_file(path))
    letter = records[2]
    assert isinstance(letter, DeadLetter)
    assert (letter.error, letter.reason, letter.line) == ("DuplicateId", "duplicate id", 3)
    assert [r.seq for r in records if not isinstance(r, DeadLetter)] == [1, 2, 3]


def test_duplicate_id_is_caught_across_a_resume(tmp_path: Path) -> None:
    """A reader resumed from a position reads back the ids before it, once."""
    path = _write(tmp_path, [HEADER, _message("a", None)])
    first = SessionFileReader(path)
    list(first.records())
    with path.open("ab") as handle:
        handle.write(_message("a", None, "again") + b"\n" + _message("b", "a") + b"\n")
    for known in (None, first.ids):
        rest = list(SessionFileReader(path, first.position, known_ids=known).records())
        assert [type(r).__name__ for r in rest] == ["DeadLetter", "EntryEnvelope"]
        assert rest[0].reason == "duplicate id"


def test_resume_from_position_reads_only_the_rest(tmp_path: Path) -> None:
    """A reader resumed from a saved position continues the sequence where it stopped."""
    path = _write(tmp_path, [HEADER, _message("a", None)])
    first = SessionFileReader(path)
    assert len(list(first.records())) == 2
    saved = ReadPosition.from_dict(first.position.to_dict())
    with path.open("ab") as handle:
        handle.write(_message("b", "a") + b"\n")
    rest = list(SessionFileReader(path, saved).records())
    assert [r.seq for r in rest] == [3]


def test_partial_last_line_waits_when_tailing(tmp_path: Path) -> None:
    """A tailing reader leaves an unterminated last line for later."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(HEADER + b"\n" + _message("a", None)[:20])
    reader = SessionFileReader(path)
    assert len(list(reader.records(final=False))) == 1
    path.write_bytes(HEADER + b"\n" + _message("a", None) + b"\n")
    assert [r.seq for r in reader.records(final=False)] == [2]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=80),
            st.sampled_from([_message("a", None), _message("b", "a", "ünï😀")]).flatmap(
                lambda good: st.integers(0, len(good)).map(lambda cut: good[:cut])
            ),
            st.sampled_from([_message("c", "b")]).flatmap(
                lambda good: st.tuples(
                    st.integers(0, len(good) - 1), st.binary(min_size=1, max_size=3)
                ).map(lambda p: good[: p[0]] + p[1] + good[p[0] + 1 :])
            ),
        ),
        max_size=12,
    )
)
def test_damaged_lines_never_crash_and_are_all_accounted(lines: list[bytes]) -> None:
    """Random, truncated and corrupted lines: no crash; each non-blank line yields something."""
    import tempfile

    body = [line.replace(b"\n", b" ").replace(b"\r", b" ") for line in lines]
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), [HEADER, *body])
        records = list(read_session_file(path))
    nonblank = 1 + sum(1 for line in body if line.strip())
    produced_lines = {r.line if isinstance(r, DeadLetter) else r.payload.line for r in records}
    assert len(produced_lines) == nonblank
    for record in records:
        if isinstance(record, EntryEnvelope):
            parse_entry(record.payload.entry)
        elif isinstance(record, PlaceholderEnvelope):
            assert record.payload.reason
        else:
            assert record.reason and record.error


def test_over_long_line_is_one_dead_letter_that_keeps_its_place(tmp_path: Path) -> None:
    """A line over 16 MiB: a dead letter with its size and first bytes, then its placeholder."""
    big = _message("b", "a", "x" * (MAX_ENTRY_BYTES + 10))
    path = _write(tmp_path, [HEADER, _message("a", None), big, _message("c", "a")])
    records = list(read_session_file(path))
    assert [type(r).__name__ for r in records] == DEAD_THIRD_LINE
    letter = records[2]
    assert isinstance(letter, DeadLetter)
    assert (letter.line, letter.reason, letter.size) == (3, ENTRY_TOO_LARGE, len(big))
    assert (letter.session_id, letter.raw) == ("sess-1", big[:DEAD_LETTER_RAW_BYTES])
    assert [r.seq for r in records if not isinstance(r, DeadLetter)] == [1, 2, 3, 4]
    assert records[3].payload.line == 3 and records[4].payload.line == 4
    assert len(dead_letter_record(letter)) < MAX_MESSAGE_BYTES


def test_line_whose_envelope_outgrows_the_topics_keeps_its_place(tmp_path: Path) -> None:
    """A line under 16 MiB whose envelope encodes past what the topics carry: the dead letter of
    an over-long line, then a placeholder with its ids and the seq it would have had."""
    big = outgrowing_line("b", "a")
    assert len(big) <= MAX_ENTRY_BYTES
    payload = EntryPayload(entry=orjson.loads(big), line=3)
    as_read = EntryEnvelope(session_id="sess-1", seq=3, payload=payload)
    assert len(encode(as_read)) > MAX_MESSAGE_BYTES  # the case itself, not a line that fits
    del payload, as_read
    path = _write(tmp_path, [HEADER, _message("a", None), big, _message("c", "b")])
    records = list(read_session_file(path))
    assert [type(r).__name__ for r in records] == DEAD_THIRD_LINE
    letter, placeholder = records[2], records[3]
    assert isinstance(letter, DeadLetter) and isinstance(placeholder, PlaceholderEnvelope)
    assert (letter.line, letter.error, letter.reason) == (3, "EntryTooLarge", ENTRY_TOO_LARGE)
    assert (letter.size, letter.session_id) == (len(big), "sess-1")
    assert letter.raw == big[:DEAD_LETTER_RAW_BYTES]
    assert placeholder.payload.model_dump() == {
        "id": "b",
        "parentId": "a",
        "previous": False,
        "line": 3,
        "reason": ENTRY_TOO_LARGE,
    }
    assert [r.seq for r in records if not isinstance(r, DeadLetter)] == [1, 2, 3, 4]
    assert len(dead_letter_record(letter)) < MAX_MESSAGE_BYTES


def test_line_at_the_limit_is_an_entry(tmp_path: Path) -> None:
    """A line of exactly 16 MiB is still read as an entry."""
    short = _message("a", None, "")
    line = _message("a", None, "x" * (MAX_ENTRY_BYTES - len(short)))
    assert len(line) == MAX_ENTRY_BYTES
    records = list(read_session_file(_write(tmp_path, [HEADER, line])))
    assert [type(r).__name__ for r in records] == ["EntryEnvelope", "EntryEnvelope"]


def test_tailing_reader_waits_for_the_end_of_an_over_long_line(tmp_path: Path) -> None:
    """An over-long last line without its newline is left for later, then dead-lettered."""
    big = _message("b", None, "y" * (MAX_ENTRY_BYTES + 5))
    path = tmp_path / "t.jsonl"
    path.write_bytes(HEADER + b"\n" + big[:-3])
    reader = SessionFileReader(path)
    assert len(list(reader.records(final=False))) == 1
    path.write_bytes(HEADER + b"\n" + big + b"\r\n" + _message("c", None) + b"\n")
    rest = list(reader.records(final=False))
    assert isinstance(rest[0], DeadLetter) and rest[0].size == len(big)
    assert isinstance(rest[1], PlaceholderEnvelope) and rest[1].seq == 2
    assert isinstance(rest[2], EntryEnvelope) and rest[2].seq == 3
    assert reader.position.offset == path.stat().st_size
