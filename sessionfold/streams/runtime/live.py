"""The live embedded runtime behind `sessionfold serve`: pi's session files, folded as they grow.

`LiveFolds` tails every session file under its paths (new files are found as they appear), reads
each complete line once (`SessionFileReader` from where it stopped) and folds it through the
embedded runtime, with flush answers kept beside the file (answer_journal.py). It keeps per
session what the context view needs: the entries in sequence order and the `/pruner compact`
commands. So a session's state is always the one `sessionfold context FILE` gives for the file
as far as it was read, and a restart (which folds the files again from the start) gives it too,
answering no flush twice.

Threads: `poll` runs on one thread (serve's tailer); everything that reads a session's state
takes `lock`, which `poll` holds while it folds a line, so a reader never sees half a line's
fold and waits for a flush being answered.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessionfold.events.envelope import CommandEnvelope, Envelope
from sessionfold.ports.ledger.model import DiffModel
from sessionfold.ports.summarizer import ModelPort
from sessionfold.projections.ledger.config import DEFAULT_LEDGER, LedgerConfig
from sessionfold.projections.pruning.config import DEFAULT_CONFIG, PruneConfig
from sessionfold.projections.views.base import LogEntry, log_entry
from sessionfold.projections.views.context import ContextView, compact_point, context_at
from sessionfold.streams.publishing.session_file import (
    DeadLetter,
    FileKindError,
    SessionFileReader,
    session_files,
)
from sessionfold.streams.runtime.answer_journal import AnswerJournal, with_journals
from sessionfold.streams.runtime.embedded import CountedEmbeddedRuntime

log = logging.getLogger(__name__)


@dataclass
class LiveSession:
    """What the view of one live session needs, beside the folded state."""

    session_id: str
    path: Path
    entries: list[LogEntry] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)  # entry ids folded (the leaves a caller may name)
    compacts: list[tuple[int, str | None]] = field(default_factory=list)
    dead_letters: int = 0
    journal: AnswerJournal | None = None


@dataclass
class _Tail:
    """One file being tailed."""

    path: Path
    reader: SessionFileReader
    session_id: str | None = None


class LiveFolds:
    """Every session file under `paths`, folded as lines arrive (see the module docstring)."""

    def __init__(
        self,
        paths: Iterable[Path],
        config: PruneConfig = DEFAULT_CONFIG,
        summarizer: ModelPort | None = None,
        diff_model: DiffModel | None = None,
        ledger: LedgerConfig | None = DEFAULT_LEDGER,
        journals: bool = True,
    ) -> None:
        self.paths = list(paths)
        self.config = config
        self.runtime = CountedEmbeddedRuntime(config, summarizer, ledger, diff_model)
        if journals:
            self.runtime.answerer = with_journals(self.runtime.answerer, self._journal)
        self.sessions: dict[str, LiveSession] = {}
        self.tails: dict[Path, _Tail] = {}
        self.lock = threading.RLock()
        #: Set by a reader asking for a session no file holds yet: the tailer looks at once.
        self.rescan = threading.Event()
        self._journals = journals

    # --- tailing -------------------------------------------------------------------------------

    def discover(self) -> int:
        """Start tailing the session files that appeared under the paths; how many are new."""
        new = 0
        for path in session_files([p for p in self.paths if p.exists()]):
            if path not in self.tails:
                self.tails[path] = _Tail(path, SessionFileReader(path))
                new += 1
        return new

    def poll(self) -> int:
        """Fold every complete line written since the last poll; how many lines were read."""
        lines = 0
        for tail in list(self.tails.values()):
            try:
                for records in tail.reader.lines(final=False):
                    lines += 1
                    with self.lock:
                        for record in records:
                            self._feed(tail, record)
            except (FileNotFoundError, FileKindError):
                # Gone or replaced by something that is not a file: what was folded stays.
                log.warning("live: stopped tailing a file", extra={"file": str(tail.path)})
                del self.tails[tail.path]
        return lines

    def _feed(self, tail: _Tail, record: Envelope | DeadLetter) -> None:
        if isinstance(record, DeadLetter):
            if record.session_id is not None and record.session_id in self.sessions:
                self.sessions[record.session_id].dead_letters += 1
            return
        session = self.sessions.get(record.session_id)
        if session is None:
            session = LiveSession(record.session_id, tail.path)
            if self._journals:
                session.journal = AnswerJournal.open(tail.path, writable=True)
            self.sessions[record.session_id] = session
        self.runtime.publish(record)
        item = log_entry(record)
        if item is not None:
            session.entries.append(item)
            entry_id = item.entry.get("id")
            if isinstance(entry_id, str):
                session.ids.add(entry_id)
        elif isinstance(record, CommandEnvelope) and record.payload.name == "compact":
            session.compacts.append((record.seq, record.time))

    def _journal(self, session_id: str) -> AnswerJournal | None:
        session = self.sessions.get(session_id)
        return None if session is None else session.journal

    # --- reads (callers hold `lock`) -------------------------------------------------------------

    def view(self, session_id: str) -> ContextView:
        """The context the model is given now, as `sessionfold context FILE` renders it."""
        session = self.sessions[session_id]
        store = self.runtime.store
        compacts = [compact_point(seq, time, store, session_id) for seq, time in session.compacts]
        return context_at(session.entries, store, session_id, self.config, compacts)

    def document(self, session_id: str) -> dict[str, Any]:
        """The session's projections (`sessionfold fold --json`'s document)."""
        session = self.sessions[session_id]
        return self.runtime.session_state(session_id, session.dead_letters)
