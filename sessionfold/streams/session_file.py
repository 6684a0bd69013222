"""Reading pi session files as a stream of envelopes and dead letters.

The reader holds one line at a time, so memory does not grow with the file. It can stop and
resume: `ReadPosition` says how far it got (byte offset, line, next sequence number), which is
what `sessionfold publish` remembers per file and what `--follow` tails from.

A line longer than `MAX_LINE_BYTES` (16 MiB) is a dead letter ("entry too large") and takes no
sequence number, in every runtime: Kafka could not carry it, and the embedded runtime reads the
file the same way so both fold the same events. Its dead letter keeps the first
`DEAD_LETTER_RAW_BYTES` of it, so the dead letter itself fits on the topic.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from sessionfold.events.entries import EntryError, parse_entry
from sessionfold.events.envelope import EntryEnvelope, EntryPayload
from sessionfold.events.lines import split_line
from sessionfold.events.migration import file_version, migrate_entry

log = logging.getLogger(__name__)

PRODUCER = "sessionfold-reader"

#: The longest line read as entries; the topics are sized so its envelope fits (topics.py).
MAX_LINE_BYTES = 16 * 1024 * 1024
#: The most of a line a dead letter keeps: base64 of it still fits in one record.
DEAD_LETTER_RAW_BYTES = 8 * 1024 * 1024
#: How much of an over-long line is read at a time while skipping to its end.
_SKIP_CHUNK = 1024 * 1024
ENTRY_TOO_LARGE = "entry too large"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A part of a file that could not be read: where it is, how big, and why.

    `raw` holds the bytes (at most `DEAD_LETTER_RAW_BYTES` of them: `size` is the whole line's)
    so the dead-letter topic loses nothing it can carry; it is never logged.
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


Record = EntryEnvelope | DeadLetter


class SessionFileReader:
    """Streams one pi session file from a position, yielding envelopes and dead letters."""

    def __init__(
        self, path: Path | str, position: ReadPosition | None = None, producer: str = PRODUCER
    ) -> None:
        self.path = Path(path)
        self.position = position or ReadPosition()
        self.producer = producer

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
                line = handle.readline(MAX_LINE_BYTES + 2)  # room for the \r\n
                if len(line.rstrip(b"\r\n")) > MAX_LINE_BYTES:
                    rest = _rest_of_line(handle, line, final)
                    if rest is None:
                        return
                    length, ending = rest
                    records = [self._too_large(line, length - ending)]
                else:
                    if not line or (not line.endswith(b"\n") and not final):
                        return
                    length = len(line)
                    records = list(self._line_records(line.rstrip(b"\r\n"), self._next_line))
                self.position = replace(
                    self.position, offset=self.position.offset + length, line=self._next_line
                )
                yield records

    @property
    def _next_line(self) -> int:
        return self.position.line + 1

    def _too_large(self, head: bytes, size: int) -> DeadLetter:
        """The dead letter of an over-long line of `size` bytes: it keeps the first ones only."""
        return self._dead(self._next_line, "EntryTooLarge", ENTRY_TOO_LARGE, head, size)

    def _line_records(self, line: bytes, line_no: int) -> Iterator[Record]:
        if not line.strip():
            return  # pi skips blank lines; they hold nothing to lose
        values, remainder = split_line(line)
        for value in values:
            yield self._value_record(value, line, line_no)
        if remainder is not None:
            yield self._dead(
                line_no,
                remainder.error,
                remainder.reason,
                line[remainder.start : remainder.start + remainder.size],
            )

    def _value_record(self, value: Any, line: bytes, line_no: int) -> Record:
        if not isinstance(value, dict):
            return self._dead(line_no, "TypeError", f"JSON {type(value).__name__}", line)
        position = self.position
        if position.version == 0:
            if value.get("type") != "session" or not isinstance(value.get("id"), str):
                return self._dead(line_no, "HeaderError", "no session header before it", line)
            position = replace(position, session_id=value["id"], version=file_version(value))
        index = position.entries
        self.position = replace(position, entries=index + 1)
        assert position.session_id is not None
        entry = value
        if value.get("type") != "session":
            entry = migrate_entry(value, position.version, position.session_id, index)
        try:
            parse_entry(entry)
        except EntryError as exc:
            return self._dead(line_no, "EntryError", str(exc), line)
        seq = self.position.next_seq
        self.position = replace(self.position, next_seq=seq + 1)
        timestamp = entry.get("timestamp")
        return EntryEnvelope(
            session_id=position.session_id,
            seq=seq,
            producer=self.producer,
            time=timestamp if isinstance(timestamp, str) else None,
            payload=EntryPayload(entry=entry, line=line_no),
        )

    def _dead(
        self, line_no: int, error: str, reason: str, raw: bytes, size: int | None = None
    ) -> DeadLetter:
        letter = DeadLetter(
            source=str(self.path),
            line=line_no,
            error=error,
            reason=reason,
            size=len(raw) if size is None else size,
            session_id=self.position.session_id,
            raw=raw[:DEAD_LETTER_RAW_BYTES],
        )
        log.warning("dead letter", extra={"dead_letter": letter.describe()})
        return letter


def _rest_of_line(handle: BinaryIO, head: bytes, final: bool) -> tuple[int, int] | None:
    """The length of a line that starts with `head` and of its line ending, read past in chunks
    (the handle ends up after it); None when a tailing reader meets it before its newline (it
    reads it again later).
    """
    length = len(head)
    last = head
    while not last.endswith(b"\n"):
        last = handle.readline(_SKIP_CHUNK)
        if not last:
            return (length, 0) if final else None
        length += len(last)
    return length, len(last) - len(last.rstrip(b"\r\n"))


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
