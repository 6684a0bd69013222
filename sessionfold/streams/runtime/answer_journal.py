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
"""

from __future__ import annotations

import logging
import os
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
        """The journal beside `session_file`, read whole (empty when there is none)."""
        journal = cls(journal_path(session_file), writable)
        try:
            data = journal.path.read_bytes()
        except FileNotFoundError:
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
        """Append one answer and sync it to disk before it is folded (writable journals only)."""
        if isinstance(envelope, PruningCompactionEnvelope):
            self.answers.setdefault(read_compaction(envelope).request_id, envelope)
        if not self.writable:
            return
        # O_APPEND: a torn write can only be the last line, which `open` skips.
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
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
        if header is not None:
            found.setdefault(str(header["id"]), AnswerJournal.open(path))
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
