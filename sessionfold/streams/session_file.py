"""Reading pi session files as a stream of envelopes and dead letters.

The reader holds one line at a time, so memory does not grow with the file. It can stop and
resume: `ReadPosition` says how far it got (byte offset, line, next sequence number), which is
what `sessionfold publish` remembers per file and what `--follow` tails from. It also remembers
the ids of the entries it has read (a few dozen bytes each), to dead-letter a second entry with
an id already read ("duplicate id"); a reader resumed without them reads them back from the
part of the file before its position, once.

A dead-lettered line after the header keeps its place in the session: it is followed by a
placeholder envelope (ids only, see `PlaceholderPayload`) that takes the sequence number the
entry would have taken, so later entries keep their seq and stay on the branch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from sessionfold.events.entries import EntryError, parse_entry
from sessionfold.events.envelope import (
    EntryEnvelope,
    EntryPayload,
    PlaceholderEnvelope,
    PlaceholderPayload,
)
from sessionfold.events.lines import split_line
from sessionfold.events.migration import file_version, migrate_entry

log = logging.getLogger(__name__)

PRODUCER = "sessionfold-reader"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A part of a file that could not be read: where it is, how big, and why.

    `raw` holds the bytes so the dead-letter topic loses nothing; it is never logged.
    """

    source: str
    line: int
    error: str
    reason: str
    size: int
    session_id: str | None = None
    raw: bytes = b""

    def describe(self) -> dict[str, Any]:
        """The fields that are safe to log or print: no content."""
        return {
            "source": self.source,
            "line": self.line,
            "error": self.error,
            "reason": self.reason,
            "size": self.size,
            "session_id": self.session_id,
        }


@dataclass(frozen=True, slots=True)
class ReadPosition:
    """How far a reader got in one file; everything it needs to resume there."""

    offset: int = 0
    line: int = 0
    next_seq: int = 1
    entries: int = 0  # JSON objects read so far, header included (v1 migration index)
    session_id: str | None = None
    version: int = 0  # 0 until the header is read

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form, for the publish checkpoint file."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReadPosition:
        """Inverse of to_dict."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


Record = EntryEnvelope | PlaceholderEnvelope | DeadLetter


class SessionFileReader:
    """Streams one pi session file from a position, yielding envelopes and dead letters.

    `known_ids` are the ids of the entries before `position` (as `ids` left them after an
    earlier read to there); without them they are read back from the file when first needed.
    """

    def __init__(
        self,
        path: Path | str,
        position: ReadPosition | None = None,
        producer: str = PRODUCER,
        known_ids: set[str] | None = None,
    ) -> None:
        self.path = Path(path)
        self.position = position or ReadPosition()
        self.producer = producer
        self._ids = known_ids
        self._quiet = False  # a read-back of the ids: its dead letters were logged before

    @property
    def known_ids(self) -> set[str] | None:
        """The ids read so far if the reader has needed them yet (never reads the file)."""
        return self._ids

    @property
    def ids(self) -> set[str]:
        """The ids of the entries read so far (placeholders included), header excluded."""
        if self._ids is None:
            self._ids = self._ids_before(self.position.offset)
        return self._ids

    def _ids_before(self, offset: int) -> set[str]:
        """The entry ids of the file's lines before byte `offset`, read again from the start."""
        if offset == 0:
            return set()
        prefix = SessionFileReader(self.path, producer=self.producer, known_ids=set())
        prefix._quiet = True
        for _records in prefix.lines(final=True):
            if prefix.position.offset >= offset:
                break
        return prefix.ids

    def records(self, final: bool = True) -> Iterator[Record]:
        """Yield what the file holds past the current position, record by record."""
        for records in self.lines(final):
            yield from records

    def lines(self, final: bool = True) -> Iterator[list[Record]]:
        """Yield the records of each line past the current position, a list per line.

        When a list is yielded, `position` already stands after its line, so a checkpoint
        taken then resumes cleanly. A last line without its newline is read only when `final`
        is true; a tailing reader passes false and sees the line complete on a later call.
        """
        with self.path.open("rb") as handle:
            handle.seek(self.position.offset)
            while True:
                line = handle.readline()
                if not line or (not line.endswith(b"\n") and not final):
                    return
                line_no = self.position.line + 1
                records = list(self._line_records(line.rstrip(b"\r\n"), line_no))
                self.position = replace(
                    self.position, offset=self.position.offset + len(line), line=line_no
                )
                yield records

    def _line_records(self, line: bytes, line_no: int) -> Iterator[Record]:
        if not line.strip():
            return  # pi skips blank lines; they hold nothing to lose
        values, remainder = split_line(line)
        for value in values:
            yield from self._value_records(value, line, line_no)
        if remainder is not None:
            raw = line[remainder.start : remainder.start + remainder.size]
            letter = self._dead(line_no, remainder.error, remainder.reason, raw)
            yield letter
            yield from self._placeholder(None, letter)

    def _value_records(self, value: Any, line: bytes, line_no: int) -> Iterator[Record]:
        if not isinstance(value, dict):
            letter = self._dead(line_no, "TypeError", f"JSON {type(value).__name__}", line)
            yield letter
            yield from self._placeholder(None, letter)
            return
        position = self.position
        if position.version == 0:
            if value.get("type") != "session" or not isinstance(value.get("id"), str):
                yield self._dead(line_no, "HeaderError", "no session header before it", line)
                return
            position = replace(position, session_id=value["id"], version=file_version(value))
        index = position.entries
        self.position = replace(position, entries=index + 1)
        assert position.session_id is not None
        entry = value
        if value.get("type") != "session":
            entry = migrate_entry(value, position.version, position.session_id, index)
        entry_id = entry.get("id") if entry.get("type") != "session" else None
        if isinstance(entry_id, str) and entry_id in self.ids:
            # pi never reuses an id: a second one would be folded by some folds and not others.
            yield self._dead(line_no, "DuplicateId", "duplicate id", line)
            return
        try:
            parse_entry(entry)
        except EntryError as exc:
            letter = self._dead(line_no, "EntryError", str(exc), line)
            yield letter
            yield from self._placeholder(entry, letter)
            return
        if isinstance(entry_id, str):
            self.ids.add(entry_id)
        timestamp = entry.get("timestamp")
        yield EntryEnvelope(
            session_id=position.session_id,
            seq=self._take_seq(),
            producer=self.producer,
            time=timestamp if isinstance(timestamp, str) else None,
            payload=EntryPayload(entry=entry, line=line_no),
        )

    def _take_seq(self) -> int:
        seq = self.position.next_seq
        self.position = replace(self.position, next_seq=seq + 1)
        return seq

    def _placeholder(
        self, entry: dict[str, Any] | None, letter: DeadLetter
    ) -> Iterator[PlaceholderEnvelope]:
        """The place in the tree of a dead-lettered entry (none before the header).

        `entry` is the object as migrated, None when the line held no object: then it takes
        the next v1 position (so later v1 ids stay those of the intact file) and, in a v1
        file, the id that position gives; elsewhere it is a gap with no id.
        """
        position = self.position
        if position.session_id is None or (entry is not None and entry.get("type") == "session"):
            return
        if entry is None:
            # Nothing readable: in a v1 file the position still names the entry; else a gap.
            index = position.entries
            self.position = replace(position, entries=index + 1)
            entry = {}
            if position.version <= 1:
                entry = migrate_entry({}, 1, position.session_id, index)
        entry_id = entry.get("id")
        payload = PlaceholderPayload(line=letter.line, reason=letter.reason)
        if isinstance(entry_id, str):
            self.ids.add(entry_id)
            parent = entry.get("parentId")
            readable = "parentId" in entry and (parent is None or isinstance(parent, str))
            payload = PlaceholderPayload(
                id=entry_id,
                parentId=parent if readable else None,
                previous=not readable,
                line=letter.line,
                reason=letter.reason,
            )
        yield PlaceholderEnvelope(
            session_id=position.session_id,
            seq=self._take_seq(),
            producer=self.producer,
            payload=payload,
        )

    def _dead(self, line_no: int, error: str, reason: str, raw: bytes) -> DeadLetter:
        letter = DeadLetter(
            source=str(self.path),
            line=line_no,
            error=error,
            reason=reason,
            size=len(raw),
            session_id=self.position.session_id,
            raw=raw,
        )
        if not self._quiet:
            log.warning("dead letter", extra={"dead_letter": letter.describe()})
        return letter


def read_session_file(path: Path | str) -> Iterator[Record]:
    """Yield every envelope and dead letter of a whole session file, in file order."""
    yield from SessionFileReader(path).records(final=True)


def session_files(paths: list[Path]) -> Iterator[Path]:
    """Expand files and directory trees into the session files they hold, sorted."""
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.jsonl") if p.is_file())
        else:
            yield path
