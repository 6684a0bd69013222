"""Replaying session-events to any point: the analyst's view of a session's state.

`Replayer` folds envelopes as they come through the embedded runtime's code path (the same
`EmbeddedRuntime`, the offline summarizer answering flush requests in process) and stops each
session at its point:

- `Point("end")`: everything;
- `Point("seq", N)`: envelopes with sequence number <= N;
- `Point("turn", N)`: up to and including the session's N-th assistant message, counted from 0
  along the branch (the `turn` of the branch digest, the frontier and the flush batches);
- `Point("span", N)`: up to and including the N-th compaction boundary, counted from 1 (a pi
  `compaction` entry or a `compact-request` event; span 1 ends at the first boundary).

Memory stays bounded by the folded state: the runtime's per-topic logs are replaced by
counters, envelopes of other sessions are dropped before they are decoded (by record key, and
by partition when the sessions are named), and a session's envelopes after its point are
never folded. `topic_envelopes` reads session-events by assigning partitions (never joining
the workers' consumer group); `replay_topic` runs the whole thing and returns the state in the
shape of `sessionfold fold --json`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
from kafka import TopicPartition

from sessionfold.events.envelope import (
    CommandEnvelope,
    CompactRequestEnvelope,
    EntryEnvelope,
    Envelope,
    EnvelopeError,
    PlaceholderEnvelope,
    SchemaVersionError,
    decode,
)
from sessionfold.projections.pruning import digest
from sessionfold.projections.pruning.config import DEFAULT_CONFIG, PruneConfig
from sessionfold.projections.views.base import log_entry
from sessionfold.projections.views.chains import CompressionPoint
from sessionfold.projections.views.context import LogEntry, compact_point
from sessionfold.streams.kafka import clients
from sessionfold.streams.kafka.security import PLAINTEXT, KafkaSecurity
from sessionfold.streams.kafka.topics import Topics, partition_of
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.runtime.answer_journal import journals_beside, with_journals
from sessionfold.streams.runtime.embedded import CountedEmbeddedRuntime, EmbeddedRuntime

log = logging.getLogger(__name__)

PointKind = Literal["end", "seq", "turn", "span"]


class ReplayError(Exception):
    """A replay that cannot give what was asked (a session not there, a point not reached)."""


@dataclass(frozen=True, slots=True)
class Point:
    """Where a replay stops each session."""

    kind: PointKind = "end"
    value: int | None = None

    def describe(self) -> str:
        """`turn 12`, `seq 300`, `span 2` or `the end`."""
        return "the end" if self.kind == "end" else f"{self.kind} {self.value}"


@dataclass
class SessionProgress:
    """How far a replay got in one session."""

    seen: int = 0  # session events folded
    last_seq: int = 0
    last_line: int | None = None  # file line of the last entry or placeholder folded
    spans: int = 0
    done: bool = False
    reached: bool = False


@dataclass
class Collector:
    """Keeps one session's entries and compact commands as they are folded (for the view)."""

    session_id: str
    entries: list[LogEntry] = field(default_factory=list)
    compacts: list[tuple[int, str | None]] = field(default_factory=list)

    def __call__(self, envelope: Envelope) -> None:
        """Called by the replayer after each folded envelope of any session."""
        if envelope.session_id != self.session_id:
            return
        item = log_entry(envelope)
        if item is not None:
            self.entries.append(item)
        elif isinstance(envelope, CommandEnvelope) and envelope.payload.name == "compact":
            self.compacts.append((envelope.seq, envelope.time))

    def compact_points(self, runtime: EmbeddedRuntime) -> list[CompressionPoint]:
        """The `/pruner compact` commands seen, as compression points."""
        return [
            compact_point(seq, time, runtime.store, self.session_id) for seq, time in self.compacts
        ]


class Replayer:
    """Folds envelopes in process and stops each session at its point."""

    def __init__(
        self,
        config: PruneConfig = DEFAULT_CONFIG,
        sessions: Iterable[str] | None = None,
        point: Point = Point(),
        on_folded: Callable[[Any], None] | None = None,
    ) -> None:
        self.runtime = CountedEmbeddedRuntime(config)
        self.wanted = set(sessions) if sessions is not None else None
        self.point = point
        self.on_folded = on_folded
        self.progress: dict[str, SessionProgress] = {}
        #: The file lines of each session's dead letters (None: before any session header).
        self.letters: dict[str | None, list[object]] = {}

    @property
    def all_done(self) -> bool:
        """True once every named session has reached its point (never without names)."""
        if self.wanted is None:
            return False
        return all(s in self.progress and self.progress[s].done for s in self.wanted)

    def wants(self, session_id: str | None) -> bool:
        """Whether envelopes of this session are replayed at all."""
        return self.wanted is None or session_id in self.wanted

    def note_dead_letter(self, session_id: str | None, line: object) -> None:
        """Remember one dead letter of a session; `result` counts those before its point."""
        if self.wants(session_id):
            self.letters.setdefault(session_id, []).append(line)

    def dead_letters(self, session_id: str | None) -> int:
        """The session's dead letters that lie before its point: on a line at or before the
        last one folded when it stopped at a point, every one when it ran to its end.

        By line, not by when a letter arrived, so a replay of the files (a letter comes just
        before the placeholder that keeps its place) and one from the topics (the letters are
        read after the events) count the same.
        """
        progress = self.progress.get(session_id) if session_id is not None else None
        lines = self.letters.get(session_id, [])
        if progress is None or not progress.done or progress.last_line is None:
            return len(lines)
        last = progress.last_line
        return sum(not isinstance(line, int) or line <= last for line in lines)

    def feed(self, record: Envelope | DeadLetter) -> None:
        """Fold one envelope (or note one dead letter) unless its session is past its point."""
        if isinstance(record, DeadLetter):
            self.note_dead_letter(record.session_id, record.line)
            return
        session_id = record.session_id
        if not self.wants(session_id):
            return
        state = self.progress.setdefault(session_id, SessionProgress())
        if state.done:
            return
        if (
            self.point.kind == "seq"
            and self.point.value is not None
            and record.seq > self.point.value
        ):
            state.done = state.reached = True
            return
        self.runtime.publish(record)
        state.seen += 1
        state.last_seq = max(state.last_seq, record.seq)
        if (
            isinstance(record, EntryEnvelope | PlaceholderEnvelope)
            and record.payload.line is not None
        ):
            state.last_line = record.payload.line
        if self.on_folded is not None:
            self.on_folded(record)
        self._check_point(session_id, record, state)

    def _check_point(self, session_id: str, record: Envelope, state: SessionProgress) -> None:
        kind, value = self.point.kind, self.point.value
        if kind == "turn" and value is not None:
            if digest.head(self.runtime.store, session_id)["turns"] > value:
                state.done = state.reached = True
        elif kind == "span" and value is not None and _is_boundary(record):
            state.spans += 1
            if state.spans >= value:
                state.done = state.reached = True

    def missing(self) -> list[str]:
        """Named sessions no envelope was seen of."""
        if self.wanted is None:
            return []
        return sorted(s for s in self.wanted if s not in self.progress)

    def unreached(self) -> dict[str, SessionProgress]:
        """Sessions that ended before their --turn or --span point."""
        if self.point.kind not in ("turn", "span"):
            return {}
        return {s: p for s, p in self.progress.items() if not p.reached}

    def turns(self, session_id: str) -> int:
        """Assistant messages on the session's branch so far."""
        return int(digest.head(self.runtime.store, session_id)["turns"])

    def check(self) -> None:
        """Raise ReplayError when a named session is absent or a point was not reached."""
        missing = self.missing()
        if missing:
            raise ReplayError(f"session not found: {', '.join(missing)}")
        unreached = self.unreached()
        if unreached:
            parts = []
            for session_id, progress in sorted(unreached.items()):
                if self.point.kind == "turn":
                    had = f"{self.turns(session_id)} assistant messages (turns 0..)"
                else:
                    had = f"{progress.spans} compaction boundaries"
                parts.append(f"{session_id} has {had}")
            raise ReplayError(
                f"{self.point.describe()} is past the end of the replay: " + "; ".join(parts)
            )

    def result(self) -> dict[str, Any]:
        """Every replayed session's state, in the shape of `sessionfold fold --json`."""
        sessions = {
            sid: self.runtime.session_state(sid, self.dead_letters(sid)) for sid in self.progress
        }
        result: dict[str, Any] = {"sessions": sessions}
        if self.letters.get(None):
            result["dead_letters"] = len(self.letters[None])  # lines before any session header
        return result


def _is_boundary(record: object) -> bool:
    """A compaction boundary: pi's `compaction` entry or a `compact-request` event."""
    if isinstance(record, CompactRequestEnvelope):
        return True
    return isinstance(record, EntryEnvelope) and record.payload.entry.get("type") == "compaction"


# --- sources ---------------------------------------------------------------------------------


def file_envelopes(paths: Iterable[Path | str]) -> Iterator[Any]:
    """Envelopes and dead letters of session files, file by file, in line order."""
    for path in paths:
        yield from read_session_file(path)


@dataclass
class TopicReader:
    """Reads a topic from the beginning to the end offsets seen at the start, by assigning
    partitions (never subscribing: the workers' group never rebalances because of a replay)."""

    bootstrap: str
    topic: str
    poll_ms: int = 500
    on_size: Callable[[int], None] = lambda _total: None
    on_record: Callable[[], None] = lambda: None
    security: KafkaSecurity = PLAINTEXT

    def records(
        self,
        partitions: Iterable[int] | None = None,
        keys: set[bytes] | None = None,
        stop: Callable[[], bool] = lambda: False,
    ) -> Iterator[Any]:
        """Yield records (only those with a key in `keys` when given) until the end or `stop`."""
        consumer = clients.reader(self.bootstrap, "sessionfold-replay", self.security)
        try:
            known = consumer.partitions_for_topic(self.topic)
            if known is None:
                raise ReplayError(f"topic not found: {self.topic}")
            chosen = sorted(known if partitions is None else set(partitions) & known)
            assigned = [TopicPartition(self.topic, p) for p in chosen]
            if not assigned:
                return
            consumer.assign(assigned)
            consumer.seek_to_beginning(*assigned)
            starts = consumer.beginning_offsets(assigned)
            ends = consumer.end_offsets(assigned)
            self.on_size(sum(ends[tp] - starts[tp] for tp in assigned))
            remaining = {tp for tp in assigned if ends[tp] > starts[tp]}
            while remaining and not stop():
                batch = consumer.poll(timeout_ms=self.poll_ms)
                for tp, records in batch.items():
                    for record in records:
                        if record.offset >= ends[tp]:
                            continue
                        self.on_record()
                        if keys is None or record.key in keys:
                            yield record
                        if stop():
                            return
                    if consumer.position(tp) >= ends[tp]:
                        remaining.discard(tp)
        finally:
            consumer.close()

    def partitions(self) -> list[int]:
        """The topic's partitions; ReplayError when it does not exist."""
        consumer = clients.reader(self.bootstrap, "sessionfold-replay", self.security)
        try:
            known = consumer.partitions_for_topic(self.topic)
        finally:
            consumer.close()
        if known is None:
            raise ReplayError(f"topic not found: {self.topic}")
        return sorted(known)


def _decoded(records: Iterable[Any]) -> Iterator[Any]:
    for record in records:
        try:
            yield decode(record.value)
        except SchemaVersionError:
            raise
        except EnvelopeError as exc:
            # Not a session event we can read: the dead-letter topic is where such things go.
            log.warning(
                "unreadable envelope skipped", extra={"offset": record.offset, "error": str(exc)}
            )


def topic_envelopes(
    replayer: Replayer,
    bootstrap: str,
    topics: Topics,
    on_size: Callable[[int], None] = lambda _total: None,
    on_record: Callable[[], None] = lambda: None,
    security: KafkaSecurity = PLAINTEXT,
) -> Iterator[Any]:
    """The session-events envelopes `replayer` wants, read by partition assignment.

    Named sessions are read from the partitions their keys hash to; a named session not found
    there (a producer with another partitioner) is looked for in the other partitions.
    """
    reader = TopicReader(
        bootstrap, topics.session_events, on_size=on_size, on_record=on_record, security=security
    )
    if replayer.wanted is None:
        yield from _decoded(reader.records(stop=lambda: replayer.all_done))
        return
    everything = reader.partitions()
    keys = {s.encode() for s in replayer.wanted}
    first = {partition_of(s, len(everything)) for s in replayer.wanted}
    yield from _decoded(reader.records(first, keys, stop=lambda: replayer.all_done))
    missing = replayer.missing()
    rest = [p for p in everything if p not in first]
    if missing and rest:
        keys = {s.encode() for s in missing}
        yield from _decoded(reader.records(rest, keys, stop=lambda: replayer.all_done))


def count_dead_letters(
    replayer: Replayer, bootstrap: str, topics: Topics, security: KafkaSecurity = PLAINTEXT
) -> None:
    """Note the dead letters of the replayed sessions (`Replayer.dead_letters` counts those
    before each one's point)."""
    reader = TopicReader(bootstrap, topics.dead_letters, security=security)
    keys = None
    if replayer.wanted is not None:
        keys = {s.encode() for s in replayer.wanted}
    try:
        records = list(reader.records(keys=keys))
    except ReplayError:
        return  # no dead-letter topic: nothing was dead-lettered
    for record in records:
        try:
            body = orjson.loads(record.value)
        except orjson.JSONDecodeError:
            continue
        session_id = body.get("session_id")
        if session_id is not None and session_id not in replayer.progress:
            continue  # a session with nothing but dead letters is not replayed
        replayer.note_dead_letter(session_id, body.get("line"))


def replay_topic(
    bootstrap: str,
    topics: Topics,
    config: PruneConfig = DEFAULT_CONFIG,
    sessions: Iterable[str] | None = None,
    point: Point = Point(),
    on_size: Callable[[int], None] = lambda _total: None,
    on_record: Callable[[], None] = lambda: None,
    on_folded: Callable[[Any], None] | None = None,
    security: KafkaSecurity = PLAINTEXT,
) -> Replayer:
    """Replay session-events to `point` and count dead letters; `check()` was called on it."""
    replayer = Replayer(config, sessions, point, on_folded)
    for envelope in topic_envelopes(replayer, bootstrap, topics, on_size, on_record, security):
        replayer.feed(envelope)
        if replayer.all_done:
            break
    replayer.check()
    count_dead_letters(replayer, bootstrap, topics, security)
    return replayer


def replay_files(
    paths: Iterable[Path | str],
    config: PruneConfig = DEFAULT_CONFIG,
    sessions: Iterable[str] | None = None,
    point: Point = Point(),
    on_folded: Callable[[Any], None] | None = None,
    security: KafkaSecurity = PLAINTEXT,
) -> Replayer:
    """Replay session files to `point` (the same replayer, fed from files); checked. The flush
    answers `serve` recorded beside a file are folded instead of the model's."""
    paths = list(paths)
    replayer = Replayer(config, sessions, point, on_folded)
    runtime = replayer.runtime
    runtime.answerer = with_journals(runtime.answerer, journals_beside(paths))
    for record in file_envelopes(paths):
        replayer.feed(record)
        if replayer.all_done:
            break
    replayer.check()
    return replayer
