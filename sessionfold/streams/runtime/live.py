"""The live embedded runtime behind `sessionfold serve`: pi's session files, folded as they grow.

`LiveFolds` tails every session file under its paths (new files are found as they appear), reads
each complete line once (`SessionFileReader` from where it stopped) and folds it through the
embedded runtime, with flush answers kept beside the file (answer_journal.py). It keeps per
session what the context view needs: the entries in sequence order and the `/pruner compact`
commands. So a session's state is always the one `sessionfold context FILE` gives for the file
as far as it was read, and a restart (which folds the files again from the start) gives it too,
answering no flush twice.

Answers: a fold that raises a flush request (a pruning flush, a ledger pass) is answered as the
embedded runtime answers it (`EmbeddedRuntime.route`, every answer folded where the request
was raised), but with `answer_threads` > 0 (serve's default) the model is asked on a small pool
of threads instead of inline: the session is then `asking`, the lines of its file read
meanwhile wait in its `backlog` unfolded, and the outputs of the fold not routed yet in
`outputs`; the answer, once back, is folded, and then the rest of what waited, in the order the
inline route would have folded it. So every session folds exactly the sequence of envelopes
the synchronous fold does (the same state and answers, byte for byte), while a slow model
delays only the session it answers: the other sessions' lines fold on, and nothing holds `lock`
during a model call. At most one request per session is with the model (the others wait
behind it in `outputs`), at most `answer_threads` in all; ledger passes go one at a time (the
diff model keeps per-call state). An answer the journal holds already (a restart) is folded
inline, with no thread hop. A session is `settled` when nothing of it is with the model: the
state pi-condense's synchronous flush leaves, which the context route waits for.

Threads: `poll` runs on one thread (serve's tailer), the answers on the pool's; everything that
reads or folds a session's state takes `lock`, held while a line (or an answer) is folded,
never while a model answers, so a reader never sees half a line's fold. `poll` calls `on_lines`
with the session's id after it folded lines of a file, and a pool thread once it folded an
answer, so a caller waiting for a leaf wakes at once instead of polling the state under the
lock. `close` waits (bounded) for the answers still out: an answer that came back is journaled
before it is folded, so one the wait gives up on is asked again at the next start, never twice.

Faults (docs/live.md, "Faults"): one file never stops the others. A file whose read or fold
raises is set aside (`_set_aside`): one warning naming the file and the error's class, its
session dropped (it answers unknown-session), and it is folded afresh once its size, inode or
mtime moves. `follow` reads each file for `FILE_SLICE_S` at most per poll, so a file that grows
without end or folds slowly delays the others by that much, not for good. A file whose identity
changed under the reader (another inode at the path, a size below what was read, other first
bytes) is folded afresh as what it now is: the state its old session had from that path is
dropped first, so an id never answers with another file's content. A session id a file names
while another live file holds it (a copy) sets the newcomer aside; one whose file is gone or
replaced (a move) is folded afresh from its new path.

Costs (bench/live_context.py): a render from scratch is O(the session's context) in Python, so
each session keeps its last render (`LiveSession.memo`), which the next one grows by the new
entries while no flush came between (views/context.py `RenderMemo`), and `rendered` keeps it
with its token counts and encoded messages until the session folds anything more (counting
only the messages a grown render added); `poll` stats each file before opening it, so the
files that did not change since the last poll cost a stat, not an open and a read (one that
did costs one more open and a read of its first KiB, `_replaced`: about 7 us). `follow` stats
only the files whose wait is up (`poll_due`): a file that does not change waits twice as long
at each stat up to `SCAN_BACKOFF_S`, or, with file notifications (`notify`, watchfiles), is
polled when one names it; a call waiting for a session has its file read first (`want`). So
an idle fleet of thousands of files costs next to nothing (docs/live.md, Faults).

Which file holds a session is known before its fold, from its name (`_NAMED_ID`) or header
(`holder`): a call during a start's fold waits for it. A session is live when its file was
written within `live_within_s` or a client asked for it; an old one's flushes are answered
offline (`_offline`), journaled alike. A file a client names (`adopt`) is tailed when it
lies under an allowed root.

Memory (`evict`): a session read through, not live, never asked for and with nothing of it
with the model keeps only its file's path (`evicted`); a call for it waits for its file's fold
again from the start (`holder`, `want`), as does a line written to it. Its journal answers its
flushes again, so its state is the one it had, byte for byte. `follow` reads at most
`FIRST_READS` files not read through at once, so a start's fold holds a few sessions half
folded, not every one.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from stat import S_ISREG
from typing import Any

import orjson

from sessionfold.events.envelope import (
    CommandEnvelope,
    CompactionEnvelope,
    Envelope,
    FlushRequestEnvelope,
    LedgerPassEnvelope,
    LedgerRequestEnvelope,
    PruningRequestEnvelope,
)
from sessionfold.ports.ledger.model import DiffModel, OfflineModel
from sessionfold.ports.summarizer import ModelPort, OfflineSummarizer
from sessionfold.projections.ledger.config import DEFAULT_LEDGER, LedgerConfig
from sessionfold.projections.pruning.config import DEFAULT_CONFIG, PruneConfig
from sessionfold.projections.store import Store
from sessionfold.projections.views.base import LogEntry, entry_at, log_entry
from sessionfold.projections.views.context import (
    ContextView,
    Identity,
    RenderMemo,
    compact_point,
    context_at,
    extends,
    message_identities,
    message_tokens,
    patch_of,
)
from sessionfold.streams.logs import SESSIONS_LOGGER
from sessionfold.streams.publishing.session_file import (
    DeadLetter,
    FileKindError,
    SessionFileReader,
    file_kind,
    header_of,
)
from sessionfold.streams.runtime.answer_journal import (
    AnswerJournal,
    JournalRefused,
    with_journals,
)
from sessionfold.streams.runtime.embedded import (
    COMPACTION_EVENTS,
    EMBEDDED_TOPICS,
    CountedEmbeddedRuntime,
)
from sessionfold.streams.runtime.step import Answerer, topic_of

log = logging.getLogger(__name__)
sessions_log = logging.getLogger(SESSIONS_LOGGER)  # one line per session event: ids and codes

#: Model calls `sessionfold serve` has out at once by default (one per session at most).
DEFAULT_ANSWER_THREADS = 8
#: How often `follow` looks for new session files, seconds (lines are read every `poll_s`).
DISCOVER_EVERY_S = 0.5
#: How long `follow`'s poll reads and folds one file before it goes on to the next, seconds: a
#: file that grows without end, or whose lines fold slowly, delays the others by this much per
#: poll, never for good (the rest is read at the next poll, which then comes at once).
FILE_SLICE_S = 0.05
#: How many files not read through yet `follow` reads at once at most (in turns of
#: FILE_SLICE_S): others not read yet wait for one of them to be read through. Taking every file
#: of a start's fold a slice at a time held every session's state half built at once (the peak
#: of keeping them all), where a few at a time hold a few, evicted once read through.
FIRST_READS = 4
#: How many of a file's first bytes are kept to tell a file rewritten at the same path (another
#: session's header, or the file truncated and written again past where it was read).
HEAD_BYTES = 1024
#: The longest a file that does not change waits for its next stat when no file-system
#: notifications come (the scan's back-off: each stat that finds it unchanged doubles its wait,
#: from the poll interval up to this), seconds. A call for its session stats it at once.
SCAN_BACKOFF_S = 1.0
#: The same with notifications on: a changed file is polled when its notification comes, so a
#: stat of an unchanged one is only a safety net (a notification lost), seconds.
NOTIFIED_BACKOFF_S = 10.0
#: Discoveries a call for an unknown session asks for, at most one per this, seconds.
RESCAN_EVERY_S = 0.05
#: How often a start's fold logs its progress, seconds.
PROGRESS_EVERY_S = 5.0
#: File notifications (watchfiles): how long a burst of changes is gathered at most, and how
#: long a quiet spell ends it, milliseconds.
NOTIFY_DEBOUNCE_MS = 50
NOTIFY_STEP_MS = 5
#: A session id in a file's name: pi's `<time>_<uuid>.jsonl`, Claude Code's `<uuid>.jsonl`,
#: Codex's `rollout-<time>-<uuid>.jsonl`.
_NAMED_ID = re.compile(
    r"(?:^|[_-])([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl$", re.I
)
#: Most session ids remembered as asked before a file held them (a bound on what clients send).
MAX_ASKED_IDS = 10_000
#: Longest `sessionFile` path a client may name.
MAX_PATH_CHARS = 4096


class LinkOutside(Exception):
    """A session file that is a link to a file outside the watched folders: not served."""


class DuplicateSession(Exception):
    """A file names a session another live file holds (a copy): it is set aside, not folded
    into that session's state."""


@dataclass
class LiveSession:
    """What the view of one live session needs, beside the folded state."""

    session_id: str
    path: Path
    entries: list[LogEntry] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)  # the entries' seqs (ascending)
    ids: set[str] = field(default_factory=set)  # entry ids folded (the leaves a caller may name)
    compacts: list[tuple[int, str | None]] = field(default_factory=list)
    folds: int = 0  # records and answers of the session folded: its state moves only with them
    dead_letters: int = 0
    journal: AnswerJournal | None = None
    rendered: Rendered | None = None  # the last render, while `folds` has not moved
    memo: RenderMemo = field(default_factory=RenderMemo)  # its last render, kept
    asking: bool = False  # a request of the session is with the model (answered on the pool)
    asked: bool = False  # a client asked for it: live, whenever its file was written
    #: It raised a ledger pass while the ledger's model is not the offline one: no journal
    #: keeps passes, so a fold again could answer one otherwise (it is never evicted).
    pinned: bool = False
    #: What the fold raised and is not routed yet: behind the request with the model.
    outputs: deque[Envelope] = field(default_factory=deque)
    #: Records read while `asking`, folded once its answer is (in file order).
    backlog: deque[Envelope | DeadLetter] = field(default_factory=deque)

    @property
    def settled(self) -> bool:
        """Whether nothing of the session is with the model: every line read is folded and
        every request they raised is answered, as after the synchronous fold."""
        return not self.asking

    def entry_at(self, seq: int) -> dict[str, Any] | None:
        """The entry with sequence number `seq`, or None (a bisection, not a scan)."""
        return entry_at(self.entries, self.seqs, seq)

    def state(self) -> tuple[int, int, int]:
        """What the view depends on, as counters: equal counters, equal views."""
        return (self.folds, len(self.entries), len(self.compacts))


@dataclass(frozen=True)
class Rendered:
    """One render of a session's context with what every answer built from it needs."""

    state: tuple[int, int, int]  # the session's `state()` it was rendered at
    settled: bool  # whether the session was `settled` then (else: a stale call's render)
    epoch: int  # the epoch (live_contract.epoch_of) read with the render
    view: ContextView
    tokens: dict[str, int]
    identities: list[Identity]  # `view.unpruned`'s (what a caller's array is checked against)

    @cached_property
    def pruned(self) -> bool:
        """Whether the context differs from the unpruned array (a matching call is changed)."""
        return self.view.messages != self.view.unpruned

    @cached_property
    def messages_json(self) -> bytes:
        """`view.messages` encoded (a context answer's payload), once per render."""
        return orjson.dumps(self.view.messages)

    @cached_property
    def patch_json(self) -> bytes:
        """`view.messages` as a patch to pi's array (`patch_of`), encoded once per render."""
        return orjson.dumps(patch_of(self.view.messages, self.view.unpruned))


@dataclass
class _Tail:
    """One file being tailed."""

    path: Path
    reader: SessionFileReader
    session_id: str | None = None
    seen: tuple[int, int, int] | None = None  # (size, inode, mtime) when last read through
    #: (device, inode) of the file read so far: another one at the path is another file.
    identity: tuple[int, int] | None = None
    #: The file's first bytes as read (up to HEAD_BYTES): others there, it was rewritten.
    head: bytes = b""
    #: Set aside by a fault: not read again until its (size, inode, mtime) moves from `seen`.
    aside: bool = False
    #: Set aside as a link to a file outside the watched folders (warned about once).
    outside: bool = False
    #: The session id its name (or, unnamed, its header) says it holds, before it is read.
    expected: str | None = None
    #: When its next stat is due (time.monotonic), and the wait before it (the back-off).
    due: float = 0.0
    idle_s: float = 0.0
    #: Its mtime (ns) at the last stat: how recently its session was written.
    mtime_ns: int = 0
    #: Its session was evicted (`LiveFolds.evict`): the reader stands at the file's start, and
    #: the file is read again once it changes or a call wants its session (`revive`).
    evicted: bool = False
    revive: bool = False


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
        answer_threads: int = 0,
        live_within_s: float | None = None,
        allowed_roots: Iterable[Path] = (),
        notify: bool = False,
        evict: bool = False,
    ) -> None:
        """`answer_threads`: model calls out at once on a pool; 0 answers inline, on the
        thread that folds (the tailer), as `sessionfold context FILE` does.

        `live_within_s`: a session is live when its file was written within that many seconds
        or a client asked for it (`asked`); only a live session's flushes go to `summarizer`
        and `diff_model`, an old one's are answered offline (journaled alike). None: every
        session is live. `allowed_roots`: where a file a client names (`adopt`) may lie,
        besides `paths`. `notify`: `follow` takes file-system notifications (watchfiles) to
        know which files changed, and stats the others rarely. `evict` (with `live_within_s`
        and `journals`): a session read through, settled, not live and never asked for keeps
        only its file's path (`evicted`); it is folded again from its file's start when a
        call wants it or the file changes (see `_evict_if_settled`)."""
        if answer_threads < 0:
            raise ValueError("answer_threads must be 0 or more")
        self.paths = list(paths)
        self.allowed_roots = [*self.paths, *allowed_roots]
        self.live_within_s = live_within_s
        self.notify = notify
        #: Whether notifications come now (the watcher runs): the back-off is the long one.
        self.notified = False
        #: Stats of session files `poll` made since the start (a test's and a bench's figure).
        self.stats = 0
        #: Paths a notification said changed, and paths a call waits for (polled first).
        self._dirty: set[Path] = set()
        self._dirty_lock = threading.Lock()
        self._urgent: deque[Path] = deque()
        self._urgent_paths: set[Path] = set()
        #: Files whose read was cut short by its slice (`poll_due`): at most FIRST_READS of
        #: them before a file never read starts.
        self._reading: set[Path] = set()
        #: (due, n, path): when each tail's next stat is due (`poll_due`).
        self._heap: list[tuple[float, int, Path]] = []
        self._pushed = 0
        #: Session id -> the file its name or header says holds it, until that file is read.
        self._expected: dict[str, Path] = {}
        #: Files clients named (`adopt`), tailed from the tailer's next poll.
        self._adopted: deque[Path] = deque()
        self._adopting: set[Path] = set()
        self._refused: set[str] = set()  # files refused to a client (warned about once each)
        #: Ids asked for before a file held them: live from their first line.
        self._asked_ids: set[str] = set()
        #: Per watched directory (and its subdirectories), its mtime at its last listing.
        self._dirs: dict[str, int] = {}
        self.config = config
        self.runtime = CountedEmbeddedRuntime(config, summarizer, ledger, diff_model)
        if journals:
            self.runtime.answerer = with_journals(self.runtime.answerer, self._journal)
        self.sessions: dict[str, LiveSession] = {}
        self.tails: dict[Path, _Tail] = {}
        self.lock = threading.RLock()
        #: Set by a reader asking for a session no file holds yet: the tailer looks for new
        #: files at its next poll.
        self.rescan = threading.Event()
        #: Set by a reader waiting for a line: the tailer polls now instead of at its interval
        #: (pi writes the leaf entry before it asks, so the poll finds it).
        self.wanted = threading.Event()
        self._journals = journals
        #: Whether settled sessions are evicted: only where a fold again answers every flush as
        #: the first fold did (journals, and the offline answers of old sessions).
        self.evict = evict and journals and live_within_s is not None
        #: Session id -> its file, for each session evicted (its entries and state dropped).
        self.evicted: dict[str, Path] = {}
        #: Whether the ledger's passes are the offline model's (deterministic) wherever asked.
        self._offline_passes = isinstance(self.runtime.diff_model, OfflineModel)
        self._offline: Answerer | None = None
        if live_within_s is not None:
            offline = Answerer(OfflineSummarizer(), OfflineModel(), ledger or DEFAULT_LEDGER)
            self._offline = with_journals(offline, self._journal) if journals else offline
        #: Called (outside `lock`) with a session's id once a poll folded lines of its file
        #: (on the polling thread) or an answer to it was folded (on a pool thread).
        self.on_lines: Callable[[str], None] | None = None
        self._answers = _AnswerPool(answer_threads, self._answer) if answer_threads else None
        #: Ledger passes one at a time: the diff model keeps state per call (its trace, the
        #: model that answered), which two passes at once would mix.
        self._passes = threading.Lock()
        #: id -> (the log's own message, its token estimate): see `_tokens`.
        self._counted: dict[int, tuple[dict[str, Any], int]] = {}
        #: Files set aside since the start (each fault once, however many polls it stays).
        self.set_aside_total = 0
        #: Called (on the tailer) once a file is set aside.
        self.on_set_aside: Callable[[], None] | None = None
        #: Called (on the tailer, under `lock`) with a session's id once its state is dropped
        #: (its file set aside, replaced or moved): what was handed over of it answers no more.
        self.on_dropped: Callable[[str], None] | None = None
        #: Per session id dropped: where its next `LiveSession.folds` starts, so no state of
        #: the new one equals a state of the old (a render of the old never answers for it).
        self._generations: dict[str, int] = {}
        #: Watched paths found missing (logged once each until they exist).
        self._unwatched: set[Path] = set()

    # --- tailing -------------------------------------------------------------------------------

    def discover(self) -> int:
        """Start tailing the session files that appeared under the paths; how many are new.

        A directory is listed again only when its mtime moved (a file made, removed or renamed
        in it) or moved lately (a timestamp's tick is coarse): an idle tree of thousands of
        files costs a stat per directory, not a listing and a stat per file."""
        new = 0
        for path in self.paths:
            if path.exists():
                self._unwatched.discard(path)
            elif path not in self._unwatched:
                self._unwatched.add(path)
                sessions_log.warning(
                    "live: a path is not watched: missing", extra={"file": str(path)}
                )
        for path in self._found():
            if path not in self.tails:
                tail = self.tails[path] = _Tail(path, SessionFileReader(path))
                self._expect(tail)
                self._schedule(tail, 0.0)
                new += 1
        return new

    def _found(self) -> list[Path]:
        """The session files of the paths in directories that changed (all at the first call),
        and the paths given as files."""
        found: list[Path] = []
        stack: list[str] = []
        for root in self.paths:
            if root.is_dir():
                self._dirs.setdefault(str(root), -1)
            elif root.exists():
                found.append(root)
        stack = list(self._dirs)
        now_ns = time.time_ns()
        while stack:
            folder = stack.pop()
            try:
                mtime = os.stat(folder).st_mtime_ns
            except OSError:
                self._dirs.pop(folder, None)
                continue
            was = self._dirs.get(folder, -1)
            if mtime == was and now_ns - mtime > 2 * 10**9:
                continue  # not listed: nothing was made or renamed in it since
            self._dirs[folder] = mtime
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.path not in self._dirs:
                            self._dirs[entry.path] = -1
                            stack.append(entry.path)
                    elif entry.name.endswith(".jsonl") and entry.is_file():
                        found.append(Path(entry.path))  # a regular file, or a link to one
                except OSError:
                    continue
        return sorted(found)

    def _expect(self, tail: _Tail) -> None:
        """Note which session a new file holds, from its name or else its header (its first
        lines only), so a call for that session waits for its fold."""
        named = _NAMED_ID.search(tail.path.name)
        expected = named.group(1) if named else None
        if expected is None:
            try:
                header = header_of(tail.path)
            except Exception:  # the fold says what is wrong with it
                header = None
            expected = None if header is None else str(header.get("id"))
        if expected is not None and expected not in self.sessions:
            tail.expected = expected
            self._expected.setdefault(expected, tail.path)

    def _schedule(self, tail: _Tail, after_s: float) -> None:
        tail.due = time.monotonic() + after_s
        self._pushed += 1
        heapq.heappush(self._heap, (tail.due, self._pushed, tail.path))

    def poll(self, slice_s: float | None = None) -> int:
        """Fold every complete line written since the last poll; how many lines were read.

        With `slice_s`, each file is read for that long at most: what is left is read at the
        next poll, and `wanted` is set so that one comes at once. A file whose read or fold
        raises is set aside (`_set_aside`) and the poll goes on with the next one."""
        self._take_adopted()
        lines = 0
        for tail in list(self.tails.values()):
            lines += self._poll_tail(tail, slice_s)
        return lines

    def poll_due(self, slice_s: float | None = None, poll_s: float = 0.02) -> int:
        """`poll` of the files that may hold new lines: those a call waits for first, then
        those a notification named, then those whose back-off ran out (`follow`'s poll). A
        stat that finds a file unchanged doubles its wait (from `poll_s` up to
        `SCAN_BACKOFF_S`, or `NOTIFIED_BACKOFF_S` while notifications come)."""
        self._take_adopted()
        lines = self._poll_urgent(slice_s, poll_s)
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
        for path in dirty:
            tail = self.tails.get(path)
            if tail is not None:
                lines += self._poll_scheduled(tail, slice_s, poll_s)
            lines += self._poll_urgent(slice_s, poll_s)
        now = time.monotonic()
        heap = self._heap
        while heap and heap[0][0] <= now:
            due, _, path = heapq.heappop(heap)
            tail = self.tails.get(path)
            if tail is None or tail.due != due:
                continue  # gone, or scheduled again since
            lines += self._poll_scheduled(tail, slice_s, poll_s)
            lines += self._poll_urgent(slice_s, poll_s)
        return lines

    def next_due(self) -> float | None:
        """When the next stat is due (time.monotonic), None when no file is tailed."""
        heap = self._heap
        while heap:
            due, _, path = heap[0]
            tail = self.tails.get(path)
            if tail is not None and tail.due == due:
                return due
            heapq.heappop(heap)
        return None

    def _poll_urgent(self, slice_s: float | None, poll_s: float) -> int:
        lines = 0
        while self._urgent:
            path = self._urgent.popleft()
            tail = self.tails.get(path)
            if tail is None:
                self._urgent_paths.discard(path)
                continue
            lines += self._poll_scheduled(tail, slice_s, poll_s)
        return lines

    def _poll_scheduled(self, tail: _Tail, slice_s: float | None, poll_s: float) -> int:
        """One file's poll, and its next stat scheduled: soon when it changed (or its read was
        cut short: again first while a call waits for it), later each time it did not."""
        if (
            tail.identity is None
            and tail.seen is None
            and len(self._reading) >= FIRST_READS
            and tail.path not in self._reading
            and tail.path not in self._urgent_paths
        ):
            self._schedule(tail, poll_s)  # a file never read: after the ones being read
            return 0
        seen = tail.seen
        lines = self._poll_tail(tail, slice_s)
        if tail.seen is None and not tail.aside and self.tails.get(tail.path) is tail:
            self._reading.add(tail.path)
        else:
            self._reading.discard(tail.path)
        if self.tails.get(tail.path) is not tail:
            self._urgent_paths.discard(tail.path)
            return lines
        if tail.seen is None or tail.seen != seen or lines:
            tail.idle_s = poll_s
        elif self.notified:
            tail.idle_s = max(NOTIFIED_BACKOFF_S, poll_s)  # its notification says when
        else:
            tail.idle_s = min(max(tail.idle_s * 2, poll_s), max(SCAN_BACKOFF_S, poll_s))
        if tail.path in self._urgent_paths:
            if tail.seen is None and not tail.aside:  # its read was cut short: on with it
                self._urgent.append(tail.path)
                return lines
            self._urgent_paths.discard(tail.path)
        self._schedule(tail, 0.0 if tail.seen is None and not tail.aside else tail.idle_s)
        return lines

    def _poll_tail(self, tail: _Tail, slice_s: float | None) -> int:
        """Read and fold what one file got since its last poll; how many lines."""
        if self.tails.get(tail.path) is not tail:
            return 0  # dropped in this poll: its session moved to another file
        try:
            self.stats += 1
            stat = os.stat(tail.path)
        except FileNotFoundError:
            self._stop_tailing(tail)
            return 0
        except OSError as exc:  # unreadable for now (permissions): retried when it reads
            if not tail.aside:
                self._set_aside(tail, None, exc)
            return 0
        # pi only appends: a file whose size, inode and mtime did not move holds no new
        # line, and a stat costs far less than opening and reading it again.
        seen = (stat.st_size, stat.st_ino, stat.st_mtime_ns)
        if seen == tail.seen and not tail.revive:
            self._evict_if_settled(tail)  # its session may have grown old since
            return 0
        tail.mtime_ns = stat.st_mtime_ns
        self._unevict(tail)  # changed, or a call wants it: an evicted file is read again
        try:
            if not S_ISREG(stat.st_mode):  # never opened: a device, a FIFO swapped in
                raise FileKindError(tail.path, file_kind(stat.st_mode))
            if tail.identity is None or (stat.st_dev, stat.st_ino) != tail.identity:
                # A file read for the first time, or another one at the path: a link to
                # a file outside the watched folders is not served (a realpath, only here).
                if self._outside(tail.path):
                    self._refuse_outside(tail, seen)
                    return 0
                tail.outside = False
            replaced = self._replaced(tail, stat)
            if replaced is not None:
                log.warning(
                    "live: a file was replaced: folded afresh",
                    extra={"file": str(tail.path), "session": tail.session_id, "why": replaced},
                )
            if tail.aside or replaced is not None:
                self._restart(tail)
            read, done = self._read(tail, stat, slice_s)
        except (FileNotFoundError, FileKindError):
            self._stop_tailing(tail)
            return 0
        except Exception as exc:  # whatever one file does, the others are read on
            self._set_aside(tail, seen, exc)
            return 0
        if done:
            tail.seen = seen  # taken before the read: a line written since moves it again
            if tail.expected is not None and self._expected.get(tail.expected) == tail.path:
                del self._expected[tail.expected]  # read through: its session answers now
            self._evict_if_settled(tail)  # an old file of a start's fold: kept small
        else:
            tail.seen = None  # the rest at the next poll, without the interval's wait
            self.wanted.set()
        return read

    def _take_adopted(self) -> None:
        """Start tailing the files clients named (`adopt`)."""
        while self._adopted:
            path = self._adopted.popleft()
            self._adopting.discard(path)
            if path not in self.tails:
                tail = self.tails[path] = _Tail(path, SessionFileReader(path))
                self._expect(tail)
                self._schedule(tail, 0.0)

    # --- what calls ask of the tailer (any thread) -------------------------------------------

    def want(self, session_id: str) -> None:
        """A call waits for the session: its file is polled first, now."""
        session = self.sessions.get(session_id)
        path = session.path if session is not None else self._expected.get(session_id)
        if path is not None and session is None:
            tail = self.tails.get(path)
            if tail is not None and tail.evicted:
                tail.revive = True  # read again though it did not change
        if path is not None and path not in self._urgent_paths:
            self._urgent_paths.add(path)
            self._urgent.append(path)
        self.wanted.set()

    def holder(self, session_id: str) -> Path | None:
        """The file that its name or header says holds the session, while it is not folded
        through yet (a start's fold, a file a client named): a call waits for it."""
        path = self._expected.get(session_id)
        if path is None:
            return None
        if path in self._adopting:
            return path
        tail = self.tails.get(path)
        if tail is None or tail.aside or tail.session_id not in (None, session_id):
            return None
        return path

    def asked(self, session_id: str) -> None:
        """A client asked for the session: it is live (its flushes go to the model)."""
        session = self.sessions.get(session_id)
        if session is not None and not self.evict:
            session.asked = True
            return
        # With eviction the id is kept too, first: a session evicted by the tailer while this
        # runs (no lock here) is folded again as asked, not evicted again.
        if len(self._asked_ids) >= MAX_ASKED_IDS:
            self._asked_ids.clear()
        self._asked_ids.add(session_id)
        if session is not None:
            session.asked = True

    def adopt(self, path_text: str, session_id: str) -> str | None:
        """Tail a session file a client named, when it lies under an allowed root: None, or
        why not (`not-absolute`, `outside-roots`, `not-a-session-file`, `missing`,
        `not-a-regular-file`), warned about once per file."""
        why = self._refusal(path_text)
        if why is None:
            path = Path(path_text)
            if path not in self.tails and path not in self._adopting:
                self._adopting.add(path)
                self._adopted.append(path)
            self._expected.setdefault(session_id, path)
            self.want(session_id)
            return None
        if path_text not in self._refused:
            if len(self._refused) >= MAX_ASKED_IDS:
                self._refused.clear()
            self._refused.add(path_text)
            log.warning(
                "live: a session file a client named is not watched",
                extra={"file": path_text, "session": session_id, "why": why},
            )
        return why

    def _refusal(self, path_text: str) -> str | None:
        if len(path_text) > MAX_PATH_CHARS or not os.path.isabs(path_text) or "\0" in path_text:
            return "not-absolute"
        if not path_text.endswith(".jsonl"):
            return "not-a-session-file"
        if self._outside(Path(path_text)):
            return "outside-roots"
        try:
            mode = os.stat(path_text).st_mode
        except OSError:
            return "missing"
        return None if S_ISREG(mode) else "not-a-regular-file"

    def _is_live(self, session: LiveSession) -> bool:
        """Whether the session's flushes go to the model (`live_within_s`)."""
        if self.live_within_s is None or session.asked:
            return True
        tail = self.tails.get(session.path)
        if tail is None:
            return True
        return time.time_ns() - tail.mtime_ns <= self.live_within_s * 1e9

    def _read(self, tail: _Tail, stat: os.stat_result, slice_s: float | None) -> tuple[int, bool]:
        """Fold the file's lines read since the last poll (for `slice_s` at most); how many,
        and whether the read got to the end."""
        until = None if slice_s is None else time.monotonic() + slice_s
        if tail.identity is None:
            tail.identity = (stat.st_dev, stat.st_ino)
        read = 0
        lines = tail.reader.lines(final=False)
        try:
            for records in lines:
                read += 1
                with self.lock:
                    for record in records:
                        self._feed(tail, record)
                if until is not None and time.monotonic() >= until:
                    return read, False
            return read, True
        finally:
            lines.close()  # a read cut short closes the file now, not at its collection
            # Announced per file, not once the poll is done: a call waiting for this session's
            # leaf need not wait for every other file's lines too. Also when a fold raised
            # partway: the lines before it moved the state.
            if read:
                self._announce(tail.session_id)
            if len(tail.head) < HEAD_BYTES and tail.reader.offset > len(tail.head):
                with contextlib.suppress(OSError):  # gone meanwhile: the next poll says so
                    tail.head = _first_bytes(tail.path, min(tail.reader.offset, HEAD_BYTES))

    def _outside(self, path: Path) -> bool:
        """Whether `path` resolves (its links followed) outside every watched path and allowed
        root: a `*.jsonl` link to some other file of the machine."""
        real = os.path.realpath(path)
        for root in self.allowed_roots:
            top = os.path.realpath(root)
            if real == top or real.startswith(top.rstrip(os.sep) + os.sep):
                return False
        return True

    def _refuse_outside(self, tail: _Tail, seen: tuple[int, int, int]) -> None:
        """Set aside a link to a file outside the watched folders (one warning, one count);
        looked at again only when what it points to changes."""
        if tail.outside:
            tail.seen = seen
            return
        tail.outside = True
        self._set_aside(tail, seen, LinkOutside(str(tail.path)))

    def _replaced(self, tail: _Tail, stat: os.stat_result) -> str | None:
        """Why the file at the tail's path is not the one read so far (`inode`, `shrunk`,
        `head`), or None. Only files that changed are asked: a stat and, once read, an open
        and a read of their first bytes."""
        if tail.identity is None:
            return None  # nothing read yet
        if (stat.st_dev, stat.st_ino) != tail.identity:
            return "inode"
        if stat.st_size < tail.reader.offset:
            return "shrunk"
        if tail.head and _first_bytes(tail.path, len(tail.head)) != tail.head:
            return "head"
        return None

    def _restart(self, tail: _Tail) -> None:
        """Read the tail's file from its start, as a new file: the state its session had from
        this path is dropped first."""
        with self.lock:
            self._drop_of(tail)
        tail.reader = SessionFileReader(tail.path)
        tail.session_id = None
        tail.identity = None
        tail.head = b""
        tail.aside = False

    def _set_aside(self, tail: _Tail, seen: tuple[int, int, int] | None, exc: Exception) -> None:
        """Stop reading a file whose read or fold raised, until it changes: one warning (ids
        and the error's class only), one count, and its session's state dropped (it may hold
        half a fold; the session answers unknown-session until the file folds afresh)."""
        with self.lock:
            self._drop_of(tail)
        self._unevict(tail)
        tail.aside = True
        tail.seen = seen
        self.set_aside_total += 1
        log.warning(
            "live: a file set aside until it changes",
            extra={
                "file": str(tail.path),
                "session": tail.session_id,
                "error": type(exc).__name__,
            },
        )
        if self.on_set_aside is not None:
            self.on_set_aside()

    def files_set_aside(self) -> int:
        """How many files are set aside now (not read until they change)."""
        return sum(1 for tail in list(self.tails.values()) if tail.aside)

    def _stop_tailing(self, tail: _Tail) -> None:
        # Gone or replaced by something that is not a file: what was folded stays (an evicted
        # session's was dropped already: it answers unknown-session from now on).
        log.warning("live: stopped tailing a file", extra={"file": str(tail.path)})
        if tail.evicted:
            self._unevict(tail)
            if tail.expected is not None and self._expected.get(tail.expected) == tail.path:
                del self._expected[tail.expected]
        if self.tails.get(tail.path) is tail:
            del self.tails[tail.path]

    def _drop_of(self, tail: _Tail) -> None:
        """Drop the state of the tail's session, if this file holds it. Caller holds `lock`."""
        session = None if tail.session_id is None else self.sessions.get(tail.session_id)
        if session is not None and session.path is tail.path:
            self._drop(session)

    def _drop(self, session: LiveSession) -> None:
        """Forget a session: its entries, its rows in the store, what was handed over of it
        (`on_dropped`). A scan of the store's keys: only at a fault or a replaced file.
        Caller holds `lock`."""
        session_id = session.session_id
        self._forget(session)
        if self.on_dropped is not None:
            self.on_dropped(session_id)

    def _forget(self, session: LiveSession) -> None:
        """Remove a session and its rows in the store (a scan of the store's keys: only at a
        fault, a replaced file or an eviction). Caller holds `lock`."""
        session_id = session.session_id
        del self.sessions[session_id]
        self._generations[session_id] = session.folds + 1
        store = self.runtime.store
        prefix = f"{session_id}/"
        for key in [k for k in store if k == session_id or k.startswith(prefix)]:
            del store[key]

    def _evict_if_settled(self, tail: _Tail) -> None:
        """Evict the tail's session when nothing of it is needed until a call asks for it: its
        file is read through and not live (`live_within_s`), no client asked for it, nothing
        of it is with the model or waits, and every answer its fold took is in its journal
        (or is the offline port's). It then keeps only its file's path (`evicted`), and is
        folded again from the file's start (its journal answering its flushes) when a call
        wants it (`holder` names its file, so the call waits for that fold) or the file
        changes: the same records, the same answers, so the same state, byte for byte.
        Why: a start folds every file, and kept whole, the fold process' memory grew with the
        history (970 MB at 200 sessions), not with the sessions in use."""
        if not self.evict or tail.aside or tail.seen is None or tail.session_id is None:
            return
        session = self.sessions.get(tail.session_id)
        if (
            session is None
            or session.path is not tail.path
            or session.asked
            or session.pinned
            or session.asking
            or session.outputs
            or session.backlog
            or session.journal is None
            or not session.journal.writable
            or self._is_live(session)
        ):
            return
        with self.lock:
            if (
                session.asked
                or session.session_id in self._asked_ids
                or session.asking
                or self.sessions.get(session.session_id) is not session
            ):
                return  # a call came meanwhile
            self._forget(session)
            # Nothing was handed over of it (only a session a client asked for is rendered):
            # no `on_dropped`.
            self.evicted[session.session_id] = tail.path
            tail.reader = SessionFileReader(tail.path)
            tail.session_id = None
            tail.identity = None
            tail.head = b""
            tail.evicted = True
            tail.expected = session.session_id
            self._expected[session.session_id] = tail.path  # a call waits for its fold again
        sessions_log.info(
            "live: a settled session is evicted until asked",
            extra={"session": session.session_id, "sessions": len(self.sessions)},
        )

    def _unevict(self, tail: _Tail) -> None:
        """The tail's file is read again (changed, wanted, faulted or gone): no longer an
        evicted session's record."""
        if not tail.evicted:
            return
        tail.evicted = tail.revive = False
        if tail.expected is not None and self.evicted.get(tail.expected) == tail.path:
            del self.evicted[tail.expected]

    def session_count(self) -> int:
        """How many sessions are served: those held and those evicted (folded again when
        asked for)."""
        return len(self.sessions) + len(self.evicted)

    def _moved(self, session: LiveSession) -> bool:
        """Whether the file a session was folded from no longer holds it (gone, or another
        file at its path): then a file naming it now is where it moved."""
        owner = self.tails.get(session.path)
        if owner is None or owner.aside:
            return True
        try:
            stat = os.stat(session.path)
        except OSError:
            return True
        return (stat.st_dev, stat.st_ino) != owner.identity

    def follow(self, stop: threading.Event, poll_s: float) -> None:
        """Find new files and fold new lines until `stop` is set (serve's tailer thread).

        Each pass stats only the files that may have changed (`poll_due`), then sleeps until
        the next stat is due, a discovery is, or a call or a notification wakes it (`wanted`):
        idle, it costs a stat per file per back-off and a stat per directory per discovery."""
        if self.notify:
            threading.Thread(
                target=self._watch, args=(stop,), name="sessionfold-notify", daemon=True
            ).start()
        found = rescanned = 0.0
        started = last_said = time.monotonic()
        starting = True
        while not stop.is_set():
            now = time.monotonic()
            try:
                if now - found >= DISCOVER_EVERY_S or (
                    self.rescan.is_set() and now - rescanned >= RESCAN_EVERY_S
                ):
                    self.rescan.clear()
                    new = self.discover()
                    if starting and new:
                        sessions_log.info("live: folding the files found", extra={"files": new})
                    found = rescanned = now
                self.poll_due(FILE_SLICE_S, poll_s)
                if starting:
                    starting, last_said = self._progress(started, last_said)
            except Exception as exc:  # one bad poll never ends serving; the next one tries again
                log.warning("live: a poll failed", extra={"error": type(exc).__name__})
            # Until the next stat or discovery is due, or at once when a call waits for a line
            # or a notification came (`wanted`).
            now = time.monotonic()
            wait = found + DISCOVER_EVERY_S - now
            if self.rescan.is_set():
                wait = min(wait, rescanned + RESCAN_EVERY_S - now)
            due = self.next_due()
            if due is not None:
                wait = min(wait, due - now)
            if wait > 0:
                self.wanted.wait(max(wait, 0.001))
            self.wanted.clear()

    def _progress(self, started: float, last_said: float) -> tuple[bool, float]:
        """Log a start's fold's progress every `PROGRESS_EVERY_S`, and its end: whether it is
        still going, and when it was last logged."""
        now = time.monotonic()
        tails = list(self.tails.values())
        done = sum(1 for tail in tails if tail.seen is not None or tail.aside)
        if done == len(tails):
            sessions_log.info(
                "live: the files found are folded",
                extra={
                    "files": len(tails),
                    "sessions": self.session_count(),
                    "held": len(self.sessions),
                    "seconds": round(now - started, 2),
                },
            )
            return False, now
        if now - last_said >= PROGRESS_EVERY_S:
            sessions_log.info(
                "live: folding the files found",
                extra={
                    "files_done": done,
                    "files": len(tails),
                    "sessions": self.session_count(),
                    "held": len(self.sessions),
                },
            )
            return True, now
        return True, last_said

    def _watch(self, stop: threading.Event) -> None:
        """Mark the files file-system notifications name as changed (`_dirty`), and have the
        tailer poll them (the watcher thread). Without watchfiles, or when it fails, the
        tailer goes on scanning (`SCAN_BACKOFF_S`)."""
        try:
            import watchfiles
        except ImportError:
            log.info("live: no file notifications (watchfiles is not installed): scanning")
            return
        while not stop.is_set():
            roots = [p for p in self.paths if p.exists()]
            if not roots:
                stop.wait(DISCOVER_EVERY_S)
                continue
            try:
                changes_seen = watchfiles.watch(
                    *roots,
                    watch_filter=None,
                    debounce=NOTIFY_DEBOUNCE_MS,
                    step=NOTIFY_STEP_MS,
                    stop_event=stop,
                    rust_timeout=1000,
                    yield_on_timeout=True,
                    raise_interrupt=False,
                )
                self.notified = True
                for changes in changes_seen:
                    if changes:
                        self._notice(changes)
                    if [p for p in self.paths if p.exists()] != roots:
                        break  # a watched path came or went: watched again
            except Exception as exc:
                self.notified = False
                log.warning(
                    "live: file notifications failed: scanning",
                    extra={"error": type(exc).__name__},
                )
                return
            finally:
                self.notified = False

    def _notice(self, changes: set[tuple[Any, str]]) -> None:
        with self._dirty_lock:
            for _change, name in changes:
                path = Path(name)
                if path in self.tails:
                    self._dirty.add(path)
                elif name.endswith(".jsonl") or not name.rpartition(os.sep)[2].count("."):
                    self.rescan.set()  # a new file (or a folder, which may hold some)
        self.wanted.set()

    def _announce(self, session_id: str | None) -> None:
        if session_id is not None and self.on_lines is not None:
            self.on_lines(session_id)

    def _feed(self, tail: _Tail, record: Envelope | DeadLetter) -> None:
        if isinstance(record, DeadLetter):
            known = None if record.session_id is None else self.sessions.get(record.session_id)
            if known is not None and known.asking:
                known.backlog.append(record)  # counted in file order, with the lines around it
            elif known is not None:
                known.dead_letters += 1
            return
        session = self.sessions.get(record.session_id)
        if session is not None and session.path is not tail.path:
            # Another file holds the session: a copy of it (set aside), or the file it was
            # folded from moved here, or was made again at its path (its state dropped,
            # folded afresh from here). `is not` first: the common case costs no comparison.
            if session.path != tail.path and not self._moved(session):
                raise DuplicateSession
            self._drop(session)
            session = None
        if session is None and self.evicted:
            self._evicted_elsewhere(tail, record.session_id)
        tail.session_id = record.session_id
        if session is None:
            session = LiveSession(
                record.session_id, tail.path, folds=self._generations.get(record.session_id, 0)
            )
            session.asked = record.session_id in self._asked_ids
            if self._journals:
                session.journal = _journal_of(tail.path, record.session_id)
            self.sessions[record.session_id] = session
            sessions_log.info(
                "live: a session is served",
                extra={"session": record.session_id, "sessions": self.session_count()},
            )
        if session.asking:
            session.backlog.append(record)  # the answer with the model comes first
            return
        self._fold(session, record)
        self._route(session)

    def _evicted_elsewhere(self, tail: _Tail, session_id: str) -> None:
        """A new session of `tail`'s file that another file held when it was evicted: a copy
        of it while that file stays (DuplicateSession, as when it is held), else where it moved
        (that file's record is dropped)."""
        path = self.evicted.get(session_id)
        if path is None or path == tail.path:
            return
        owner = self.tails.get(path)
        if owner is not None and owner.evicted:
            try:
                stat = os.stat(path)
            except OSError:
                stat = None
            if stat is not None and owner.seen is not None and owner.seen[1] == stat.st_ino:
                raise DuplicateSession
            self._unevict(owner)
        else:
            del self.evicted[session_id]

    def _fold(self, session: LiveSession, record: Envelope) -> None:
        """Fold one record of the session (what `EmbeddedRuntime.publish` folds); its outputs
        wait in `session.outputs` for `_route`."""
        self.runtime.log[topic_of(record, EMBEDDED_TOPICS)].append(record)
        session.outputs.extend(self.runtime.fold(record))
        session.folds += 1
        item = log_entry(record)
        if item is not None:
            session.entries.append(item)
            session.seqs.append(item.seq)
            entry_id = item.entry.get("id")
            if isinstance(entry_id, str):
                session.ids.add(entry_id)
        elif isinstance(record, CommandEnvelope) and record.payload.name == "compact":
            session.compacts.append((record.seq, record.time))

    def _route(self, session: LiveSession) -> None:
        """Deliver the session's outputs, then fold its backlog, until a request goes to the
        model (or nothing is left): `EmbeddedRuntime.route`'s order, paused at each model
        call. Caller holds `lock`."""
        while not session.asking:
            if session.outputs:
                envelope = session.outputs.popleft()
                self.runtime.log[topic_of(envelope, EMBEDDED_TOPICS)].append(envelope)
                if not isinstance(envelope, FlushRequestEnvelope):
                    continue
                if isinstance(envelope, LedgerRequestEnvelope) and not self._offline_passes:
                    # No journal keeps a pass: a fold again, once asked for (live), would ask
                    # the ledger's model where this one may have answered offline.
                    session.pinned = True
                answerer = self.runtime.answerer
                if self._offline is not None and not self._is_live(session):
                    answerer = self._offline  # an old session: its state, no paid model
                if (
                    self._answers is None
                    or answerer is self._offline
                    or self._recorded(session, envelope)
                ):
                    self._fold_answer(session, answerer.answer(envelope).envelope)
                else:
                    session.asking = True
                    self._answers.submit(session, envelope)
            elif session.backlog:
                record = session.backlog.popleft()
                if isinstance(record, DeadLetter):
                    session.dead_letters += 1
                else:
                    self._fold(session, record)
            else:
                return

    def _fold_answer(self, session: LiveSession, answer: CompactionEnvelope) -> None:
        """Fold one answer of the session; what it raises joins `session.outputs`."""
        self.runtime.log[COMPACTION_EVENTS].append(answer)
        kind = "ledger" if isinstance(answer, LedgerPassEnvelope) else "pruning"
        sessions_log.info(
            "live: a flush was answered", extra={"session": session.session_id, "kind": kind}
        )
        session.outputs.extend(self.runtime.fold(answer))
        session.folds += 1  # the state moved: a kept render is of the state before

    def _recorded(self, session: LiveSession, request: FlushRequestEnvelope) -> bool:
        """Whether the session's journal holds the answer (a restart folding its file again):
        then it is folded at once, no thread, no model."""
        if session.journal is None or not isinstance(request, PruningRequestEnvelope):
            return False
        request_id = (request.payload.model_extra or {}).get("request_id")
        return isinstance(request_id, str) and session.journal.get(request_id) is not None

    def _answer(self, session: LiveSession, request: FlushRequestEnvelope) -> None:
        """Ask the model for one request's answer (on a pool thread, without `lock`), fold it
        and what waited behind it, and wake the calls waiting for the session."""
        try:
            if isinstance(request, LedgerRequestEnvelope):
                with self._passes:
                    answer = self.runtime.answerer.answer(request)
            else:
                answer = self.runtime.answerer.answer(request)
        except Exception as exc:
            # The answerer turns a model's failure into an error answer (step.py); what still
            # raises (the journal's disk, say) leaves the session waiting, as it left the
            # synchronous fold's barrier up.
            log.warning(
                "live: a flush was not answered",
                extra={"session": session.session_id, "error": type(exc).__name__},
            )
            return
        try:
            with self.lock:
                if self.sessions.get(session.session_id) is not session:
                    return  # dropped meanwhile (its file set aside or replaced): not folded
                session.asking = False
                self._fold_answer(session, answer.envelope)
                self._route(session)
        finally:  # also when a fold raised partway: what it folded before moved the state
            self._announce(session.session_id)

    def settle(self, timeout_s: float | None = None) -> int:
        """Wait until no answer is out (at most `timeout_s`); how many still are."""
        return 0 if self._answers is None else self._answers.wait(timeout_s)

    def close(self, timeout_s: float | None = None) -> int:
        """Wait (at most `timeout_s`) for the answers out to be folded, then end the pool's
        threads and ask the model nothing more; how many answers were still out (asked again at
        the next start, unless one comes back before the process ends: it is journaled)."""
        if self._answers is None:
            return 0
        left = self._answers.wait(timeout_s)
        self._answers.stop()
        return left

    def _journal(self, session_id: str) -> AnswerJournal | None:
        session = self.sessions.get(session_id)
        return None if session is None else session.journal

    # --- reads (callers hold `lock`; `rendered` takes it itself) -----------------------------

    def view(self, session_id: str) -> ContextView:
        """The context the model is given now, as `sessionfold context FILE` renders it."""
        session = self.sessions[session_id]
        store = self.runtime.store
        compacts = [compact_point(seq, time, store, session_id) for seq, time in session.compacts]
        return context_at(session.entries, store, session_id, self.config, compacts, session.memo)

    def rendered(self, session_id: str, epoch_of: Callable[[Store, str], int]) -> Rendered:
        """The session's view now, with its tokens, encoded messages and `epoch_of(store,
        session_id)` read with it; rendered again only once the session folded anything since
        the last call (`Rendered.settled` says whether an answer was with the model then).
        Takes `lock` itself."""
        with self.lock:
            session = self.sessions[session_id]
            state = session.state()
            cached = session.rendered
            if cached is not None and cached.state == state:
                return cached
            is_settled = session.settled
            view = self.view(session_id)
            epoch = epoch_of(self.runtime.store, session_id)
        # The counts (and the encodings, when an answer asks for one) read only the view's
        # messages, which no fold changes: the tailer need not wait for them. A render grown
        # from the last one (context.RenderMemo) has its messages first: only the rest count.
        if cached is None:
            tokens = {
                "pruned": self._tokens(view.messages, view),
                "unpruned": self._tokens(view.unpruned_sent, view),
            }
        else:
            was = cached.view
            tokens = {
                "pruned": self._count(view.messages, view, was.messages, cached.tokens["pruned"]),
                "unpruned": self._count(
                    view.unpruned_sent, view, was.unpruned_sent, cached.tokens["unpruned"]
                ),
            }
        if cached is not None and extends(view.unpruned, cached.view.unpruned):
            grown = view.unpruned[len(cached.view.unpruned) :]
            identities = cached.identities + message_identities(grown)
        else:
            identities = message_identities(view.unpruned)
        rendered = Rendered(state, is_settled, epoch, view, tokens, identities)
        with self.lock:
            if session.state() == state:
                session.rendered = rendered
        return rendered

    def _count(
        self, messages: list[dict[str, Any]], view: ContextView, before: list[Any], counted: int
    ) -> int:
        """`tokens(messages)`, where `before` (of `counted` tokens) is the last render's list:
        when `messages` starts with its very messages, only the ones after them count."""
        if extends(messages, before):
            return counted + self._tokens(messages[len(before) :], view)
        return self._tokens(messages, view)

    def _tokens(self, messages: list[dict[str, Any]], view: ContextView) -> int:
        """`tokens(messages)`, each of the log's own messages counted once for good: they are
        never changed and live as long as the session's entries (a third of a render's cost
        was counting the same messages again)."""
        total = 0
        counted = self._counted
        for message in messages:
            if id(message) not in view.origin:
                total += message_tokens(message)  # made by this render: counted each time
                continue
            known = counted.get(id(message))
            if known is None or known[0] is not message:
                known = counted[id(message)] = (message, message_tokens(message))
            total += known[1]
        return total

    def document(self, session_id: str) -> dict[str, Any]:
        """The session's projections (`sessionfold fold --json`'s document)."""
        session = self.sessions[session_id]
        return self.runtime.session_state(session_id, session.dead_letters)


def _journal_of(path: Path, session_id: str) -> AnswerJournal | None:
    """The session file's answers journal, writable; None (one warning) when it is no regular
    file within its bound: the session is folded without it, its answers asked of the model and
    not written (never through a link, never blocking on a FIFO)."""
    try:
        return AnswerJournal.open(path, writable=True)
    except JournalRefused as exc:
        log.warning(
            "live: an answers journal set aside: the session is served without it",
            extra={"file": str(exc.path), "session": session_id, "reason": exc.reason},
        )
        return None


def _first_bytes(path: Path, size: int) -> bytes:
    """The first `size` bytes of a regular file: an open, an fstat and a pread (a third of
    `open_session_file`'s cost, paid at each poll that finds the file changed). O_NONBLOCK: a
    FIFO swapped in is not waited on, and is refused by its fstat."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        kind = file_kind(os.fstat(fd).st_mode)
        if kind != "regular file":
            raise FileKindError(path, kind)
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


class _AnswerPool:
    """Up to `threads` answers at once, on daemon threads: a model that never answers must not
    keep the process from exiting (`LiveFolds.close` bounds the wait for it)."""

    def __init__(
        self, threads: int, answer: Callable[[LiveSession, FlushRequestEnvelope], None]
    ) -> None:
        self.size = threads
        self._answer = answer
        self._queue: queue.SimpleQueue[tuple[LiveSession, FlushRequestEnvelope] | None] = (
            queue.SimpleQueue()
        )
        self._threads: list[threading.Thread] = []
        self._out = 0  # submitted and not answered yet
        self._idle = threading.Condition()
        self._stopped = False

    def submit(self, session: LiveSession, request: FlushRequestEnvelope) -> None:
        """Have `answer(session, request)` run on a pool thread (not once stopped: the request
        is asked again at the next start)."""
        with self._idle:
            if self._stopped:
                return
            self._out += 1
            if not self._threads:  # started with the first request: most runs never ask one
                for n in range(self.size):
                    thread = threading.Thread(
                        target=self._run, name=f"sessionfold-answer-{n}", daemon=True
                    )
                    thread.start()
                    self._threads.append(thread)
        self._queue.put((session, request))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._answer(*item)
            except Exception as exc:  # a pool thread must outlive one failed fold
                log.warning("live: an answer failed", extra={"error": type(exc).__name__})
            finally:
                with self._idle:
                    self._out -= 1
                    self._idle.notify_all()

    def wait(self, timeout_s: float | None) -> int:
        """Wait until no answer is out (at most `timeout_s`); how many still are."""
        with self._idle:
            self._idle.wait_for(lambda: self._out == 0, timeout_s)
            return self._out

    def stop(self) -> None:
        """End the threads once the answers queued before are done; ask nothing more (an
        answer back after the stop is still journaled, and folded, but raises no new call)."""
        with self._idle:
            self._stopped = True
            threads, self._threads = self._threads, []
        for _ in threads:
            self._queue.put(None)
