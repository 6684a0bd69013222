"""Flush answers kept beside a session file: what the model was sent stays reproducible.

`sessionfold serve` answers a session's flush requests with a model, which may be a real one whose
answers no replay could make again. Each answer is appended to `<file>.sessionfold-answers` (one
encoded compaction envelope per line, written and synced before it is folded) beside the session
file, so:
- a restart of `serve` folds the recorded answer instead of asking the model again (a flush is
  never answered twice);
- `sessionfold context FILE` and `sessionfold fold FILE` fold the same answers, and show exactly
  the summaries the model was sent.
The name does not end in `.jsonl`, so neither pi nor `session_files` takes it for a session.
A torn last line (a crash mid-write) is ignored: that request is answered again.

The journal is opened without following a link and without blocking (O_NOFOLLOW, O_NONBLOCK),
then its fstat must say a regular file of at most `MAX_JOURNAL_BYTES`: a FIFO, a directory, a
link (which would have serve append to a file outside the watched folders) or a file past the
bound (read whole into memory) is refused (`JournalRefused`) and the session is folded without
it (docs/live.md, Faults).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sessionfold.events.envelope import (
    CompactionEnvelope,
    EnvelopeError,
    FlushRequestEnvelope,
    PruningCompactionEnvelope,
    PruningRequestEnvelope,
    decode,
    encode,
)
from sessionfold.events.flush import read_compaction, read_request
from sessionfold.streams.publishing.session_file import header_of
from sessionfold.streams.runtime.step import Answer, Answerer

log = logging.getLogger(__name__)

#: What follows a session file's name to name its answers.
ANSWERS_SUFFIX = ".sessionfold-answers"


#: Largest answers file read: answers are 1 MiB at most (step.MAX_ANSWER_BYTES) and a few KB as
#: a rule, so this holds dozens of the largest and thousands of the usual; the file is read
#: whole into memory (a 512 MB one took serve's fold process to 1.13 GB).
MAX_JOURNAL_BYTES = 64 * 1024 * 1024
#: What an open refuses without following or waiting: a link (ELOOP under O_NOFOLLOW), a
#: directory opened to write (EISDIR), a FIFO no one reads (ENXIO under O_NONBLOCK).
_REFUSED_ERRNOS = {errno.ELOOP, errno.EISDIR, errno.ENXIO}
#: How an answers file is opened: never through a link, never waiting on a FIFO or a device.
_OPEN_FLAGS = (
    os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
)


class JournalRefused(OSError):
    """An answers file that is no regular file of at most `MAX_JOURNAL_BYTES`: not read, not
    written; `reason` is a short code (`link`, `FIFO`, `directory`, `too-large`, ...)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def _open_journal(path: Path, flags: int) -> int:
    """An fd of the answers file at `path` opened with `flags` (plus `_OPEN_FLAGS`), checked to
    be a regular file (JournalRefused otherwise); blocking again once checked."""
    try:
        fd = os.open(path, flags | _OPEN_FLAGS, 0o600)
    except OSError as exc:
        if exc.errno in _REFUSED_ERRNOS:
            reason = {errno.ELOOP: "link", errno.EISDIR: "directory"}.get(exc.errno, "FIFO")
            raise JournalRefused(path, reason) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kinds = ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"))
            raise JournalRefused(path, next((k for test, k in kinds if test(mode)), "special"))
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _read_journal(path: Path) -> bytes | None:
    """The answers file's bytes (None when there is none), read within `MAX_JOURNAL_BYTES`."""
    try:
        fd = _open_journal(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        if os.fstat(fd).st_size > MAX_JOURNAL_BYTES:  # a sparse file is refused unread too
            raise JournalRefused(path, "too-large")
        chunks: list[bytes] = []
        read = 0
        while chunk := os.read(fd, min(1 << 20, MAX_JOURNAL_BYTES + 1 - read)):
            chunks.append(chunk)
            read += len(chunk)
            if read > MAX_JOURNAL_BYTES:  # grew since the fstat
                raise JournalRefused(path, "too-large")
        return b"".join(chunks)
    finally:
        os.close(fd)


def journal_path(session_file: Path) -> Path:
    """The answers file beside a session file."""
    return session_file.with_name(session_file.name + ANSWERS_SUFFIX)


@dataclass
class AnswerJournal:
    """The recorded answers of one session file, by request id; `writable` appends new ones."""

    path: Path
    writable: bool = False
    answers: dict[str, CompactionEnvelope] = field(default_factory=dict)

    @classmethod
    def open(cls, session_file: Path, writable: bool = False) -> AnswerJournal:
        """The journal beside `session_file`, read whole (empty when there is none);
        JournalRefused when it is no regular file within `MAX_JOURNAL_BYTES`."""
        journal = cls(journal_path(session_file), writable)
        data = _read_journal(journal.path)
        if data is None:
            return journal
        torn = 0
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            try:
                envelope = decode(line)
            except EnvelopeError:
                torn += 1
                continue
            if isinstance(envelope, PruningCompactionEnvelope):
                journal.answers.setdefault(read_compaction(envelope).request_id, envelope)
        if torn:
            log.warning("answers journal: unreadable lines skipped", extra={"lines": torn})
        return journal

    def get(self, request_id: str) -> CompactionEnvelope | None:
        """The recorded answer to a request, if any."""
        return self.answers.get(request_id)

    def record(self, envelope: CompactionEnvelope) -> None:
        """Append one answer and sync it to disk before it is folded (writable journals only).
        An answers file that turned into something else since it was read (a link, a FIFO)
        is left alone: one warning, and the session's answers are no longer written."""
        if isinstance(envelope, PruningCompactionEnvelope):
            self.answers.setdefault(read_compaction(envelope).request_id, envelope)
        if not self.writable:
            return
        # O_APPEND: a torn write can only be the last line, which `open` skips.
        try:
            fd = _open_journal(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        except JournalRefused as exc:
            self.writable = False
            log.warning(
                "answers journal set aside: no regular file",
                extra={"file": str(self.path), "reason": exc.reason},
            )
            return
        try:
            os.write(fd, encode(envelope) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True, slots=True)
class JournaledAnswerer(Answerer):
    """Answers a pruning flush from the session's journal when it holds one, else asks the
    model and records the answer; ledger passes are not journaled (pi's file keeps them)."""

    journals: Callable[[str], AnswerJournal | None] = lambda _session: None

    def answer(self, request: FlushRequestEnvelope) -> Answer:
        """The recorded answer, or the model's (recorded before it is returned)."""
        if not isinstance(request, PruningRequestEnvelope):
            return Answerer.answer(self, request)
        journal = self.journals(request.session_id)
        if journal is None:
            return Answerer.answer(self, request)
        request_id = read_request(request).request_id
        recorded = journal.get(request_id)
        if recorded is not None:
            return Answer(recorded, "answered")
        answer = Answerer.answer(self, request)
        journal.record(answer.envelope)
        return answer


def journals_beside(paths: Iterable[Path | str]) -> Callable[[str], AnswerJournal | None]:
    """Read-only journals of the session files among `paths` that have one, by session id."""
    found: dict[str, AnswerJournal] = {}
    for path in map(Path, paths):
        if not journal_path(path).is_file():
            continue
        header = header_of(path)
        if header is None:
            continue
        try:
            found.setdefault(str(header["id"]), AnswerJournal.open(path))
        except JournalRefused as exc:
            log.warning(
                "answers journal set aside", extra={"file": str(path), "reason": exc.reason}
            )
    return found.get


def with_journals(answerer: Answerer, journals: Callable[[str], AnswerJournal | None]) -> Answerer:
    """`answerer` answering from `journals` first."""
    return JournaledAnswerer(
        answerer.port,
        answerer.diff_model,
        answerer.ledger,
        answerer.max_answer_bytes,
        journals=journals,
    )
