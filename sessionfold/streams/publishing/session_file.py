"""Reading pi session files as a stream of envelopes and dead letters.

The reader holds one line at a time, so memory does not grow with the file. It can stop and
resume: `ReadPosition` says how far it got (byte offset, line, next sequence number), which is
what `sessionfold publish` remembers per file and what `--follow` tails from. It also remembers
the ids of the entries it has read (a few dozen bytes each), to dead-letter a second entry with
an id already read ("duplicate id"); a reader resumed without them reads them back from the
part of the file before its position, once. In the same pass a reader resumed inside a file of
another format rebuilds its translator's state (events/formats/base.py), so it reads on as one
reader of the whole file would.

A dead-lettered line after the header keeps its place in the session: it is followed by a
placeholder envelope (ids only, see `PlaceholderPayload`) that takes the sequence number the
entry would have taken, so later entries keep their seq and stay on the branch.

Limits (docs/publishing.md, "Limits"): only regular files are opened (a FIFO, a device or a
socket is refused by kind, never opened for reading); a line longer than `max_line_bytes()`
(env SESSIONFOLD_MAX_LINE_BYTES, default 64 MiB) is skipped to its newline without being held
and dead-lettered with its size and first `RAW_PREFIX_BYTES`; a UTF-8 byte order mark at the
start of the file is skipped (offsets still count it). A line under that cap but longer than
`MAX_ENTRY_BYTES` (16 MiB) is a dead letter too ("entry too large"): Kafka could not carry it,
and every runtime reads files through this reader, so all of them fold the same events. So is an
entry of a shorter line whose envelope would not fit on the topics (`record_fits`: JSON
that orjson writes longer than the line held it, such as numbers written `1e15`): it is decided
here, before the entry takes a sequence number, so the embedded runtime folds what Kafka carries.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Generator, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path
from typing import IO, Any

import orjson

from sessionfold.events.entries import EntryError, check_entry, is_common_entry
from sessionfold.events.envelope import (
    MAX_ENTRY_BYTES,
    EntryEnvelope,
    PlaceholderEnvelope,
    PlaceholderPayload,
    encode,
    entry_envelope,
)
from sessionfold.events.formats import TRANSLATORS, detect, translator_for
from sessionfold.events.formats.base import MappingError, Translator
from sessionfold.events.lines import (
    DEPTH_ERROR,
    DEPTH_REASON,
    MAX_DEPTH,
    NOT_OPENING,
    may_be_too_deep,
    nests_within,
    split_line,
    too_deep,
)
from sessionfold.events.migration import file_version, migrate_entry
from sessionfold.streams.kafka.limits import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

PRODUCER = "sessionfold-reader"

#: The environment variable that sets the longest line read, in bytes.
MAX_LINE_ENV = "SESSIONFOLD_MAX_LINE_BYTES"
DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024
#: How many bytes of a too-long line its dead letter keeps (its size says how long it was).
RAW_PREFIX_BYTES = 64 * 1024
#: How much of a line is read at a time (and of a too-long one while skipping it).
_SKIP_CHUNK = 1024 * 1024
#: From how many bytes on a common line's depth is bounded by walking its parsed containers
#: instead of counting its brackets: about where the two cost the same (pi's lines).
_WALK_FROM = 2048
#: How much of a file is read at a time to cut lines from.
_BLOCK = 256 * 1024
BOM = b"\xef\xbb\xbf"
TOO_LONG_ERROR = "LineTooLong"
TOO_LONG_REASON = "line too long"
#: The most of a line a dead letter keeps: base64 of it still fits in one record.
DEAD_LETTER_RAW_BYTES = 8 * 1024 * 1024
ENTRY_TOO_LARGE = "entry too large"
ENTRY_TOO_LARGE_ERROR = "EntryTooLarge"
#: How many times its line's length an entry's envelope encodes to, at most. orjson escapes
#: only what JSON text must escape too, so no string grows; a number grows at most 4.5 times
#: (`1e15` is written `1000000000000000.0`); and the envelope repeats the entry's timestamp
#: (`time`), a string of the line. 6 bounds 4.5 + 1 with room to spare.
ENVELOPE_GROWTH = 6
#: The envelope's own field names, numbers and kind, and the ids a v1 entry's migration adds.
ENVELOPE_FIELDS_BYTES = 1024
#: The most bytes one character of a string encodes to: a control character's `\u001f`.
_CHAR_BYTES = 6
#: What a record takes on a topic beyond its key and value: the record batch header (61 bytes),
#: the record's own fields and length prefixes (under 40), with room to spare.
RECORD_OVERHEAD_BYTES = 1024


#: How many levels a translator may nest around what one line holds (a line kept whole as an
#: entry's `raw` is one): an entry mapped from lines that all open fewer arrays and objects
#: than MAX_DEPTH less this cannot be too deep, and is not walked to find out.
TRANSLATOR_NESTING = 4

#: The format a command's `--format` forces on every file it reads (None: detect each file's).
FORCED_FORMAT: ContextVar[str | None] = ContextVar("sessionfold_forced_format", default=None)


def record_fits(key_bytes: int, value_bytes: int) -> bool:
    """Whether a record with a key and a value this long fits on every sessionfold topic."""
    return key_bytes + value_bytes + RECORD_OVERHEAD_BYTES <= MAX_MESSAGE_BYTES


def most_envelope_bytes(line_size: int, session_id: str, producer: str) -> int:
    """The most bytes the envelope of an entry read from a line of `line_size` encodes to.

    Arithmetic only: the reader encodes an envelope to measure it only when this bound does not
    fit on the topics, so an ordinary line (pi's stay far below a MiB) pays nothing.
    """
    names = _CHAR_BYTES * (len(session_id) + len(producer))
    return ENVELOPE_GROWTH * line_size + names + ENVELOPE_FIELDS_BYTES


def bound_fits_up_to(session_id: str, producer: str) -> int:
    """The longest line whose envelope's bound (`most_envelope_bytes`) fits on the topics: an
    entry of a line no longer than this fits without being measured."""
    key = len(session_id.encode())
    spare = MAX_MESSAGE_BYTES - RECORD_OVERHEAD_BYTES - key
    return (spare - most_envelope_bytes(0, session_id, producer)) // ENVELOPE_GROWTH


def envelope_fits(envelope: EntryEnvelope, line_size: int) -> bool:
    """Whether an entry's envelope, keyed by its session, fits on the topics (`record_fits`)."""
    key = len(envelope.session_id.encode())
    bound = most_envelope_bytes(line_size, envelope.session_id, envelope.producer)
    return record_fits(key, bound) or record_fits(key, len(encode(envelope)))


def max_line_bytes() -> int:
    """The longest line read whole: SESSIONFOLD_MAX_LINE_BYTES, or 64 MiB.

    Raises ValueError naming the variable when it is not a positive integer.
    """
    text = os.environ.get(MAX_LINE_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_LINE_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{MAX_LINE_ENV} must be a positive number of bytes")
    return value


_KINDS = (
    (stat.S_ISDIR, "directory"),
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
)


def file_kind(mode: int) -> str:
    """What a stat mode describes: "regular file", "directory", "FIFO", ..."""
    if stat.S_ISREG(mode):
        return "regular file"
    return next((name for test, name in _KINDS if test(mode)), "special file")


class FileKindError(OSError):
    """A path that is not a regular file (a directory, FIFO, device, socket): never read."""

    def __init__(self, path: Path | str, kind: str) -> None:
        super().__init__(f"{path} is a {kind}, not a regular file")
        self.path = str(path)
        self.kind = kind


def open_session_file(path: Path | str) -> IO[bytes]:
    """Open a regular file for reading; raise FileKindError for anything else.

    The stat before opening keeps a device from being opened at all; the fstat after it closes
    the race where the path is swapped in between. O_NONBLOCK makes that open return at once
    even for a FIFO (a blocking open would wait for a writer forever).
    """
    kind = file_kind(os.stat(path).st_mode)
    if kind != "regular file":
        raise FileKindError(path, kind)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        kind = file_kind(os.fstat(fd).st_mode)
        if kind != "regular file":
            raise FileKindError(path, kind)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


@dataclass(frozen=True, slots=True)
class RawLine:
    """One line as read: its bytes without the line end, or a prefix of them when too long.

    `length` is what the line takes in the file (line end and a leading BOM included), so
    offsets add up; `size` is how many bytes it holds before its line end.
    """

    data: bytes
    length: int
    size: int
    too_long: bool = False


def raw_lines(handle: IO[bytes], offset: int, limit: int, final: bool = True) -> Iterator[RawLine]:
    """The lines of an open file from `offset`, none held longer than `limit` bytes.

    A line without its newline at the end of the file is yielded only when `final`; a
    tailing reader sees it complete later. A line longer than `limit` is read past in chunks
    and yielded as a bounded prefix with `too_long` set.
    """
    for data, length, size, too_long in _line_tuples(handle, offset, limit, final):
        yield RawLine(data, length, size, too_long)


def _line_tuples(
    handle: IO[bytes], offset: int, limit: int, final: bool
) -> Iterator[tuple[bytes, int, int, bool]]:
    """`raw_lines` as (data, length, size, too_long) tuples: the reader's loop takes a line
    in a fraction of what building a frozen RawLine costs.

    Lines are cut from blocks read `_BLOCK` bytes at a time, their ends found by `find` (memchr)
    instead of `readline`'s byte by byte scan and copy; a line not ended within its block and
    the one after, or longer than `limit`, or the last one, is read from its start by
    `_next_line`, as every line was.
    """
    handle.seek(offset)
    read = handle.read
    buffer, start = b"", 0  # buffer[start:] is what the file holds from `offset` on
    while True:
        end = buffer.find(b"\n", start)
        if end >= 0 and end - start <= limit:
            data = buffer[start:end]
            length = end + 1 - start
            start = end + 1
            if data.endswith(b"\r"):
                data = data.rstrip(b"\r\n")
            size, too_long = len(data), False
        else:
            if end < 0 and len(buffer) - start < _BLOCK:
                more = read(_BLOCK)
                if more:
                    buffer, start = buffer[start:] + more, 0
                    continue
            handle.seek(offset)
            line = _next_line(handle, limit, final)
            if line is None:
                return
            data, length, size, too_long = line
            buffer, start = b"", 0  # the handle stands past the line
        if offset == 0 and data.startswith(BOM):
            data = data[len(BOM) :]
        offset += length
        yield data, length, size, too_long


def _next_line(handle: IO[bytes], limit: int, final: bool) -> tuple[bytes, int, int, bool] | None:
    """The line at the handle's position as (data, length, size, too_long), read with
    `readline` in bounded chunks (a too-long one skipped to its end); None at the end of the
    file, or at a last line without its newline when not `final`."""
    chunk = handle.readline(min(limit + 1, _SKIP_CHUNK))
    if len(chunk) >= _SKIP_CHUNK and not chunk.endswith(b"\n"):
        chunk = _read_rest(handle, chunk, limit + 1)
    if len(chunk) > limit and not chunk.endswith(b"\n"):
        line = _skipped_line(handle, chunk, final)
        if line is None:
            return None
        return line.data, line.length, line.size, True
    if not chunk or (not chunk.endswith(b"\n") and not final):
        return None
    data = chunk.rstrip(b"\r\n")
    return data, len(chunk), len(data), False


def _read_rest(handle: IO[bytes], first: bytes, size: int) -> bytes:
    """A line, or its first `size` bytes, of which `first` (a full chunk) was read.

    One `readline(size)` with a size of many MiB costs time in proportion to the size even for a
    short line; chunks keep the common short line one small call.
    """
    pieces, total = [first], len(first)
    while total < size:
        piece = handle.readline(min(size - total, _SKIP_CHUNK))
        if not piece:
            break
        pieces.append(piece)
        total += len(piece)
        if piece.endswith(b"\n"):
            break
    return b"".join(pieces)


def _skipped_line(handle: IO[bytes], chunk: bytes, final: bool) -> RawLine | None:
    """Read past the rest of a too-long line; None when it has no newline yet and not final."""
    prefix = chunk[:RAW_PREFIX_BYTES]
    length = len(chunk)
    tail = chunk[-2:]  # the last two bytes read: where the line end is
    del chunk  # only the prefix is kept while the rest is skipped
    while not tail.endswith(b"\n"):
        piece = handle.readline(_SKIP_CHUNK)
        if not piece:
            break
        length += len(piece)
        tail = (tail + piece[-2:])[-2:]
    ended = tail.endswith(b"\n")
    if not ended and not final:
        return None
    size = length - (2 if tail == b"\r\n" else 1 if ended else 0)
    return RawLine(prefix, length, size, too_long=True)


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
    """How far a reader got in one file; everything it needs to resume there.

    In a file of another agent's format (`format`), a group of lines the translator still holds
    (one API response written as several lines) has emitted nothing yet: the position then
    stands at the group's first line, `held` lines before where reading got, so a reader
    resumed there reads the group again (the held lines' dead letters and placeholders went
    out already and are not sent twice).
    """

    offset: int = 0
    line: int = 0
    next_seq: int = 1
    entries: int = 0  # JSON objects read so far, header included (v1 migration index)
    session_id: str | None = None
    version: int = 0  # 0 until the header is read
    format: str = "pi"  # the file's format, known once its first object is read
    held: int = 0  # lines past `line` read already, held in an open group

    # The reader moves its position several times per line: these build the next one directly,
    # about a third of what `dataclasses.replace` costs.
    def past_line(self, length: int, line: int) -> ReadPosition:
        """This position past one more line, `length` bytes long and numbered `line`."""
        return ReadPosition(
            self.offset + length,
            line,
            self.next_seq,
            self.entries,
            self.session_id,
            self.version,
            self.format,
        )

    def past_entry(self) -> ReadPosition:
        """This position past one more JSON object."""
        return ReadPosition(
            self.offset,
            self.line,
            self.next_seq,
            self.entries + 1,
            self.session_id,
            self.version,
            self.format,
        )

    def past_seq(self) -> ReadPosition:
        """This position with its next sequence number taken."""
        return ReadPosition(
            self.offset,
            self.line,
            self.next_seq + 1,
            self.entries,
            self.session_id,
            self.version,
            self.format,
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form, for the publish checkpoint file."""
        # Spelled out: `asdict` walks each field recursively, ten times slower for these scalars.
        return {
            "offset": self.offset,
            "line": self.line,
            "next_seq": self.next_seq,
            "entries": self.entries,
            "session_id": self.session_id,
            "version": self.version,
            "format": self.format,
            "held": self.held,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReadPosition:
        """Inverse of to_dict."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


Record = EntryEnvelope | PlaceholderEnvelope | DeadLetter


class SessionFileReader:
    """Streams one session file from a position, yielding envelopes and dead letters.

    `known_ids` are the ids of the entries before `position` (as `ids` left them after an
    earlier read to there); without them they are read back from the file when first needed.
    `format` forces the file's format ("pi", "claude-code", "codex"); None detects it from the
    first JSON object (events/formats). A file of another format goes through its translator,
    whose entries take the path a pi entry takes.
    """

    def __init__(
        self,
        path: Path | str,
        position: ReadPosition | None = None,
        producer: str = PRODUCER,
        max_line: int | None = None,
        known_ids: set[str] | None = None,
        format: str | None = None,
    ) -> None:
        self.path = Path(path)
        start = position or ReadPosition()
        self.producer = producer
        self.max_line = max_line_bytes() if max_line is None else max_line
        # From the start of the file no entry comes before: nothing to read back.
        self._ids = known_ids if known_ids is not None or start.offset else set()
        self._quiet = False  # a read-back of the ids: its dead letters were logged before
        self.format = format if format is not None else FORCED_FORMAT.get()
        self._translator: Translator | None = None
        # Resumed inside a file of another format: its translator's state (the session, the
        # chain's last id, calls waiting for their results, ...) is rebuilt from the lines
        # before the position before the first line is read (`_catch_up`).
        self._rebuild = start.format != "pi"
        self._closed = start.held == 0  # no group was open at the position (see _catch_up)
        # Where reading got (the position is where resuming must start: see ReadPosition), as
        # `_cursor`: a position and a run of common lines read past it since (`_common_line`).
        self._at = replace(start, held=0)
        self._run = 0  # lines, each one entry that took one seq
        self._run_bytes = 0
        self._replay_to = start.line + start.held  # held lines re-read: their records went out
        self._mark: tuple[int, int] | None = None  # (offset, line) before the open group
        self._fast = True  # lines of common entries skip the general path (`_common_line`)
        self._fits = ("", 0)  # a session id and its `bound_fits_up_to`
        self._deep = False  # a line since the translator last held nothing may nest deep
        if start.held:
            self._mark = (start.offset, start.line)

    @property
    def _cursor(self) -> ReadPosition:
        """Where reading got (past the run of common lines, which is then folded in)."""
        if self._run:
            at, run = self._at, self._run
            self._at = ReadPosition(
                at.offset + self._run_bytes,
                at.line + run,
                at.next_seq + run,
                at.entries + run,
                at.session_id,
                at.version,
                at.format,
            )
            self._run = self._run_bytes = 0
        return self._at

    @_cursor.setter
    def _cursor(self, value: ReadPosition) -> None:
        self._at = value
        self._run = self._run_bytes = 0

    @property
    def position(self) -> ReadPosition:
        """Where a reader resumes to read on exactly once from here (see ReadPosition)."""
        cursor = self._cursor
        if self._mark is None:
            return cursor
        offset, line = self._mark
        return replace(cursor, offset=offset, line=line, held=cursor.line - line)

    @position.setter
    def position(self, value: ReadPosition) -> None:
        self._cursor = value

    @property
    def offset(self) -> int:
        """How many bytes of the file were read (past `position` while a group is held): a
        file shorter than this was truncated under the reader."""
        return self._cursor.offset

    @property
    def known_ids(self) -> set[str] | None:
        """The ids read so far if the reader has needed them yet (never reads the file)."""
        return self._ids

    @property
    def ids(self) -> set[str]:
        """The ids of the entries read so far (placeholders included), header excluded."""
        if self._ids is None:
            self._catch_up(self.position.offset)
        assert self._ids is not None
        return self._ids

    def _catch_up(self, offset: int) -> None:
        """Rebuild what a resumed reader needs from the file's lines before byte `offset`, in
        one pass read again from the start: the entry ids (unless handed over), and the
        translator of a file of another format, fed every line before and its output dropped,
        so it resumes exactly as one that read the whole file."""
        rebuild, self._rebuild = self._rebuild, False
        format = self.format if self.format is not None else self._cursor.format
        prefix = SessionFileReader(
            self.path,
            producer=self.producer,
            max_line=self.max_line,
            known_ids=set(),
            format=format,
        )
        prefix._quiet = True
        # final: a last line without its newline was read (and counted in `offset`) by a final
        # read; the group open at the end is not closed, as the loop stops before that.
        for _records in prefix._read(final=True, close=False) if offset > 0 else ():
            if prefix._cursor.offset >= offset:
                break
        if self._ids is None:
            self._ids = prefix._ids or set()
        if rebuild:
            translator = prefix._translator
            if translator is None:
                translator = translator_for(format)
            if translator is not None and self._closed and translator.open_since is not None:
                # The position has no group open, yet these lines leave one: the reader that
                # stood there closed it at the end of the file (a final read); so does this one.
                translator.close()
            self._translator = translator

    def records(self, final: bool = True) -> Iterator[Record]:
        """Yield what the file holds past the current position, record by record."""
        # chain flattens the lists in C: a generator a level costs per record.
        yield from chain.from_iterable(self.lines(final))

    def lines(self, final: bool = True) -> Generator[list[Record], None, None]:
        """Yield the records of each line past the current position, a list per line.

        When a list is yielded, `position` already stands after its line (or at the first line
        of a group still held), so a checkpoint taken then resumes cleanly. A last line without
        its newline is read only when `final` is true; a tailing reader passes false and sees
        the line complete on a later call. `final` also closes the group held at the end of a
        file of another format (its entries come as one more list).
        """
        return self._read(final, close=final)  # a generator: nothing is read before it is asked

    def _read(self, final: bool, close: bool) -> Generator[list[Record], None, None]:
        """`lines`, with the closing of the held group at the end apart (`close`)."""
        if self._rebuild:
            self._catch_up(self._cursor.offset)
        with open_session_file(self.path) as handle:
            lines = _line_tuples(handle, self._cursor.offset, self.max_line, final)
            for data, length, size, too_long in lines:
                if self._fast and not too_long and self._translator is None:
                    envelope = self._common_line(data, length)
                    if envelope is not None:
                        yield [envelope]
                        continue
                start = self._cursor.offset
                line_no = self._cursor.line + 1
                replaying = line_no <= self._replay_to
                seq, counted = self._cursor.next_seq, self._cursor.entries
                if too_long:
                    letter = self._dead(line_no, TOO_LONG_ERROR, TOO_LONG_REASON, data, size=size)
                    records: list[Record] = [letter, *self._placeholder(None, letter)]
                elif size > MAX_ENTRY_BYTES:
                    letter = self._dead(line_no, ENTRY_TOO_LARGE_ERROR, ENTRY_TOO_LARGE, data)
                    records = [letter, *self._placeholder(None, letter)]
                else:
                    held = start - self._mark[0] if self._mark is not None else 0
                    if self._translator is not None or self._cursor.version == 0:
                        limit = MAX_DEPTH - TRANSLATOR_NESTING
                        self._deep = self._deep or may_be_too_deep(data, limit)
                    records = list(self._line_records(data, line_no, held + length))
                self._cursor = self._cursor.past_line(length, line_no)
                self._note_group(start, line_no)
                if replaying:
                    # Read when this line was first read: the seqs its records took and the
                    # objects it counted are in the position already.
                    self._cursor = replace(self._cursor, next_seq=seq, entries=counted)
                    continue
                yield records
        if close and self._translator is not None:
            size = self._cursor.offset - (self._mark[0] if self._mark else self._cursor.offset)
            entries = self._translator.close()
            self._mark = None
            records = []
            for entry in entries:
                records += self._entry_records(entry, b"", self._cursor.line, size)
            if records:
                yield records

    def _common_line(self, data: bytes, length: int) -> EntryEnvelope | None:
        """The envelope of a line of a pi file past its header that holds one entry of a
        common shape (`is_common_entry`) with a new id, its envelope fitting on the topics,
        the reader moved past the line; None, the reader unchanged, for any other line.

        What the general path (`_line_records`) makes of such a line, in one step: most lines
        are these, and the general path's generators and positions cost more than the rest.
        A line it refuses is read again by the general path (parsed twice: rare lines only).
        """
        position = self._at
        session_id = position.session_id
        ids = self._ids
        if (
            session_id is None
            or position.version == 0
            or ids is None
            or self._mark is not None
            or position.line < self._replay_to
            or len(data) > MAX_ENTRY_BYTES
        ):
            return None
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        # As `split_line` reads a line orjson parses; a header's type goes the general way.
        if type(value) is not dict or value.get("type") == "session":
            return None
        # The depth bound: a long line's containers are walked (its strings cost one check
        # each), a shorter one's brackets counted (`may_be_too_deep(data)`, spelled out).
        if len(data) >= _WALK_FROM:
            if not nests_within(value):
                return None
        elif len(data.translate(None, NOT_OPENING)) > MAX_DEPTH and too_deep(value):
            return None
        run = self._run
        entry = migrate_entry(value, position.version, session_id, position.entries + run)
        if not is_common_entry(entry):
            return None
        entry_id = entry["id"]
        if entry_id in ids:
            return None
        envelope = entry_envelope(
            session_id,
            position.next_seq + run,
            self.producer,
            entry.get("timestamp"),
            entry,
            position.line + run + 1,
        )
        fits = self._fits
        if fits[0] != session_id:
            fits = self._fits = (session_id, bound_fits_up_to(session_id, self.producer))
        if len(data) > fits[1] and not envelope_fits(envelope, len(data)):
            return None
        ids.add(entry_id)
        self._run = run + 1
        self._run_bytes += length
        self._deep = False  # as `_note_group` leaves a reader without a translator
        return envelope

    def _note_group(self, start: int, line_no: int) -> None:
        """Remember where the translator's open group starts (the position to resume at)."""
        since = self._translator.open_since if self._translator is not None else None
        if since is None:
            self._mark = None
            self._deep = False  # every line read so far has given its entries
        elif since == line_no and (self._mark is None or self._mark[1] < line_no - 1):
            self._mark = (start, line_no - 1)

    def _line_records(self, line: bytes, line_no: int, size: int) -> Iterator[Record]:
        if not line.strip():
            return  # pi skips blank lines; they hold nothing to lose
        values, remainder = split_line(line)
        for value in values:
            yield from self._value_records(value, line, line_no, size)
        if remainder is not None:
            raw = line[remainder.start : remainder.start + remainder.size]
            letter = self._dead(line_no, remainder.error, remainder.reason, raw)
            yield letter
            yield from self._placeholder(None, letter)

    def _value_records(self, value: Any, line: bytes, line_no: int, size: int) -> Iterator[Record]:
        if not isinstance(value, dict):
            letter = self._dead(line_no, "TypeError", f"JSON {type(value).__name__}", line)
            yield letter
            yield from self._placeholder(None, letter)
            return
        position = self._cursor
        if position.version == 0 and self._translator is None:
            found = self.format or detect(value)
            if found is not None and found != "pi":
                if found not in TRANSLATORS:
                    yield self._dead(line_no, "FormatError", f"{found} is not read", line)
                    return
                self._translator = translator_for(found)
                self._cursor = replace(position, format=found)
        if self._translator is not None:
            self._cursor = self._cursor.past_entry()
            try:
                entries = self._translator.feed(value, line_no)
            except MappingError as exc:
                letter = self._dead(line_no, "MappingError", str(exc), line)
                yield letter
                named = {"id": exc.id, "parentId": exc.parent_id} if exc.id else None
                yield from self._placeholder(named, letter)
                return
            for entry in entries:
                yield from self._entry_records(entry, line, line_no, size)
            return
        if position.version == 0:
            if value.get("type") != "session" or not isinstance(value.get("id"), str):
                yield self._dead(line_no, "HeaderError", "no session header before it", line)
                return
            position = replace(position, session_id=value["id"], version=file_version(value))
        index = position.entries
        self._cursor = position.past_entry()
        assert position.session_id is not None
        entry = value
        if value.get("type") != "session":
            entry = migrate_entry(value, position.version, position.session_id, index)
        yield from self._entry_records(entry, line, line_no, len(line))

    def _entry_records(
        self, entry: dict[str, Any], line: bytes, line_no: int, size: int
    ) -> Iterator[Record]:
        """A v3 entry's envelope, or its dead letter and placeholder; `size`: its source bytes."""
        position = self._cursor
        if self._translator is not None and entry.get("type") == "session":
            if position.version != 0:
                return  # a resumed translator's header: the session is known already
            if not isinstance(entry.get("id"), str):
                yield self._dead(line_no, "HeaderError", "no session header before it", line)
                return
            position = self._cursor = replace(
                position, session_id=entry["id"], version=file_version(entry)
            )
        elif position.session_id is None:
            yield self._dead(line_no, "HeaderError", "no session header before it", line)
            return
        entry_id = entry.get("id") if entry.get("type") != "session" else None
        if isinstance(entry_id, str) and entry_id in self.ids:
            # pi never reuses an id: a second one would be folded by some folds and not others.
            yield self._dead(line_no, "DuplicateId", "duplicate id", line)
            return
        if self._deep and self._translator is not None and too_deep(entry, MAX_DEPTH):
            # A translator nests what it maps (a line kept as `raw`, parsed arguments): an entry
            # past the lines' limit would be refused by a Kafka worker and folded embedded.
            letter = self._dead(line_no, DEPTH_ERROR, DEPTH_REASON, line)
            yield letter
            yield from self._placeholder(entry, letter)
            return
        try:
            check_entry(entry)
        except EntryError as exc:
            letter = self._dead(line_no, "EntryError", str(exc), line)
            yield letter
            yield from self._placeholder(entry, letter)
            return
        timestamp = entry.get("timestamp")
        assert position.session_id is not None
        envelope = entry_envelope(
            position.session_id,
            position.next_seq,  # taken below, once the envelope is known to fit
            self.producer,
            timestamp if isinstance(timestamp, str) else None,
            entry,
            line_no,
        )
        if not envelope_fits(envelope, size):
            # Kafka could not carry it: dead here, so every runtime folds the placeholder instead.
            letter = self._dead(line_no, ENTRY_TOO_LARGE_ERROR, ENTRY_TOO_LARGE, line)
            yield letter
            yield from self._placeholder(entry, letter)
            return
        if isinstance(entry_id, str):
            self.ids.add(entry_id)
        self._take_seq()
        yield envelope

    def _take_seq(self) -> int:
        seq = self._cursor.next_seq
        self._cursor = self._cursor.past_seq()
        return seq

    def _placeholder(
        self, entry: dict[str, Any] | None, letter: DeadLetter
    ) -> Iterator[PlaceholderEnvelope]:
        """The place in the tree of a dead-lettered entry (none before the header).

        `entry` is the object as migrated, None when the line held no object: then it takes
        the next v1 position (so later v1 ids stay those of the intact file) and, in a v1
        file, the id that position gives; elsewhere it is a gap with no id.
        """
        position = self._cursor
        if position.session_id is None or (entry is not None and entry.get("type") == "session"):
            return
        if entry is None:
            # Nothing readable: in a v1 file the position still names the entry; else a gap.
            index = position.entries
            self._cursor = replace(position, entries=index + 1)
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

    def _dead(
        self, line_no: int, error: str, reason: str, raw: bytes, size: int | None = None
    ) -> DeadLetter:
        letter = DeadLetter(
            source=str(self.path),
            line=line_no,
            error=error,
            reason=reason,
            size=len(raw) if size is None else size,
            session_id=self._cursor.session_id,
            raw=raw[:DEAD_LETTER_RAW_BYTES],
        )
        if not self._quiet and self._cursor.line >= self._replay_to:
            log.warning("dead letter", extra={"dead_letter": letter.describe()})
        return letter


def read_session_file(path: Path | str, format: str | None = None) -> Iterator[Record]:
    """Yield every envelope and dead letter of a whole session file, in file order.

    `format` forces the file's format; None detects it (see SessionFileReader).
    """
    reader = SessionFileReader(path, format=format)
    yield from chain.from_iterable(reader.lines(final=True))


def is_header(value: Any) -> bool:
    """The reader's rule: the first object of type session with a string id is the header."""
    return (
        isinstance(value, dict)
        and value.get("type") == "session"
        and isinstance(value.get("id"), str)
    )


def file_lines(path: Path | str, final: bool = True) -> Iterator[RawLine]:
    """The lines of a session file, bounded like the reader's (no records, nothing logged)."""
    with open_session_file(path) as handle:
        yield from raw_lines(handle, 0, max_line_bytes(), final)


def header_of(path: Path | str, format: str | None = None) -> dict[str, Any] | None:
    """The session header a file holds (its first), or None when it holds none.

    A file of another agent's format holds the header its translator makes of its first lines
    (`format` forces the format; None detects it from the first JSON object).
    """
    translator: Translator | None = None
    format = format if format is not None else FORCED_FORMAT.get()
    number = 0
    for line in file_lines(path):
        number += 1
        if line.too_long:
            continue
        values, _rest = split_line(line.data)
        for value in values:
            if translator is None and format in (None, "pi"):
                found = detect(value) if format is None else "pi"
                if found == "pi" or found is None:
                    if is_header(value):
                        return value  # type: ignore[no-any-return]
                    continue
                format = found
            if format not in TRANSLATORS:
                return None
            if translator is None:
                translator = translator_for(format or "pi")
            if translator is None or not isinstance(value, dict):
                continue
            try:
                entries = translator.feed(value, number)
            except MappingError:
                continue
            if entries:
                return entries[0] if is_header(entries[0]) else None
    return None


def session_files(paths: list[Path]) -> Iterator[Path]:
    """Expand files and directory trees into the session files they hold, sorted.

    Under a directory, only regular files are taken; a FIFO, device or socket named *.jsonl
    is skipped (and logged by kind). A path given itself is yielded as it is: the reader
    refuses it if it is not a regular file.
    """
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.jsonl") if _regular(p))
        else:
            yield path


def _regular(path: Path) -> bool:
    try:
        kind = file_kind(path.stat().st_mode)
    except OSError:
        return False  # vanished, or a dangling link: nothing to read
    if kind == "directory":
        return False
    if kind != "regular file":
        log.warning("skipped: not a regular file", extra={"file": str(path), "kind": kind})
    return kind == "regular file"
