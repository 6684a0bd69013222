"""Publishing pi session files to Kafka: once each, in order, resumable.

Each file is read from where the last run left it (a checkpoint per file), its envelopes go to
session-events keyed by session id, its dead letters to the dead-letter topic (the placeholder
that keeps a dead-lettered entry's place in the session tree goes to session-events). The checkpoint
holds exactly what the broker acknowledged: it stands after the last line whose records were
all acknowledged, so a crash, a kill or a broker outage leaves it behind at most the
unacknowledged tail.

That tail may still have reached the broker (acknowledged after the last checkpoint write, or
written although its acknowledgement never came back). So before a file's first record is
sent, the file is marked *unsure* in the checkpoint file, with the topics' end offsets at that
moment; the mark goes when the file's checkpoint covers everything sent. A run that finds a
file marked reads back, from the end down to the marked offsets, the last record of the
session (on the partition the default partitioner gives its key) and of the file's dead
letters, and skips what is already there. Together with the idempotent producer (which keeps
its own retries from doubling records) each entry reaches the topic once.

Every wait has a deadline: when the broker acknowledges nothing for `timeout_s`, publish gives
up (`PublishFailed`) after checkpointing what was acknowledged. `should_stop` is checked between
lines and in every wait; once it is true nothing more is read, in-flight records get
`STOP_GRACE_S` to be acknowledged, and `PublishStopped` follows the checkpoint.

After a file's new lines, a `world` envelope (a read-only git snapshot of the session's working
directory, see `world.py`) follows them on the same key. It takes no sequence number of its
own: its seq is that of the session's last envelope before it, so every entry keeps the seq a
plain read of the file gives it.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import orjson
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import KafkaError, KafkaTimeoutError, MessageSizeTooLargeError
from kafka.future import Future

from sessionfold.events.envelope import (
    EntryEnvelope,
    EnvelopeError,
    PlaceholderEnvelope,
    WorldEnvelope,
    WorldPayload,
    decode,
    encode,
)
from sessionfold.streams.kafka import clients
from sessionfold.streams.kafka.security import PLAINTEXT, KafkaSecurity
from sessionfold.streams.kafka.topic_reader import last_match
from sessionfold.streams.kafka.topics import Topics, partition_of
from sessionfold.streams.publishing.session_file import (
    ENTRY_TOO_LARGE,
    ENTRY_TOO_LARGE_ERROR,
    DeadLetter,
    FileKindError,
    ReadPosition,
    SessionFileReader,
    header_of,
    session_files,
)
from sessionfold.streams.publishing.world import world_facts

log = logging.getLogger(__name__)

#: How many acknowledged records may pass between two checkpoint writes.
CHECKPOINT_EVERY = 500
#: Files marked unsure by one checkpoint write: the file about to send its first record and
#: those after it in the same pass. A write rewrites the whole state file (milliseconds once it
#: lists thousands of files), so one per file bound publish; a kill leaves at most this many
#: more files marked, each read back by a re-run only over what this run wrote after its mark.
MARK_AHEAD = 32

#: How long publish waits for the broker (an acknowledgement, metadata, a read-back) by default.
DEFAULT_TIMEOUT_S = 60.0
#: How long in-flight records get to be acknowledged once a stop was asked for.
STOP_GRACE_S = 5.0
#: The longest a single wait blocks before looking at the deadline and the stop flag again.
_SLICE_S = 0.2
#: Unacknowledged lines and bytes before reading waits for acknowledgements. kafka-python 3's
#: producer buffers without bound, so this is what keeps memory bounded during an outage.
WINDOW_LINES = 5000
WINDOW_BYTES = 32 * 1024 * 1024

#: The shortest time between two world snapshots of one session (each costs five git runs).
WORLD_INTERVAL_S = 10.0
#: A snapshot describes the workspace now: only a file written this recently (a live or just
#: finished session) gets one, never an old transcript published after the fact.
WORLD_MAX_AGE_S = 3600.0

PRODUCER = "sessionfold-publish"

Floors = dict[str, dict[int, int]]  # topic -> partition -> offset


class PublishFailed(Exception):
    """The broker did not acknowledge in time, or refused a record; `code` says which."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class PublishStopped(Exception):
    """A stop was asked for; `settled` says whether every record sent was acknowledged."""

    def __init__(self, settled: bool) -> None:
        super().__init__("stopped")
        self.settled = settled


class _StopReading(Exception):
    """Internal: a stop was asked for while reading or sending; go and settle."""


@dataclass
class PublishCounts:
    """What one publish run did; records count once the broker acknowledged them."""

    published: int = 0
    skipped: int = 0  # lines an earlier run had checkpointed, and records found on the topic
    dead_lettered: int = 0
    files: int = 0
    world: int = 0  # world snapshots sent; not counted in `published`

    def line(self) -> str:
        """The final count line; the world part only when a snapshot was sent."""
        text = (
            f"published {self.published}, skipped {self.skipped}, "
            f"dead-lettered {self.dead_lettered} ({self.files} files)"
        )
        return f"{text}, world snapshots {self.world}" if self.world else text


@dataclass
class PublishStats:
    """Where a run's time went besides reading and sending: counts and seconds per kind.

    `bench/publish_throughput.py` prints them per file; nothing in them names a file.
    """

    checkpoint_writes: int = 0
    checkpoint_seconds: float = 0.0
    drains: int = 0  # waits until every record sent was acknowledged (or the run gave up)
    ack_waits: int = 0  # slices blocked on the oldest unacknowledged record
    ack_wait_seconds: float = 0.0
    world_probes: int = 0  # sessions whose working directory was looked at
    world_seconds: float = 0.0
    read_backs: int = 0  # lookups of an unsure file's records already on a topic
    read_back_seconds: float = 0.0


@dataclass
class Checkpoints:
    """Per-file read positions and unsure marks, kept in one JSON file written atomically.

    `unsure` maps a file to the topics' end offsets taken before its first record was sent:
    records past its position may be on the topic at or after those offsets.
    """

    path: Path
    positions: dict[str, ReadPosition] = field(default_factory=dict)
    unsure: dict[str, Floors] = field(default_factory=dict)
    # Each file's entry as written last, with the position it was written from: a run writes
    # the file before every file it publishes, so only what moved is encoded again.
    _encoded: dict[str, tuple[ReadPosition, bytes]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def load(cls, path: Path) -> Checkpoints:
        """Read the checkpoint file, or start empty when there is none."""
        if not path.exists():
            return cls(path)
        data = json.loads(path.read_text())
        positions = {k: ReadPosition.from_dict(v) for k, v in data.get("files", {}).items()}
        unsure = {
            name: {topic: {int(p): o for p, o in parts.items()} for topic, parts in floors.items()}
            for name, floors in data.get("unsure", {}).items()
        }
        return cls(path, positions, unsure)

    def save(self) -> None:
        """Write the file atomically (a crash leaves the old one or the new one)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        entries = []
        for name in sorted(self.positions):
            position = self.positions[name]
            encoded = self._encoded.get(name)
            if encoded is None or encoded[0] is not position:  # positions are frozen
                text = orjson.dumps(name) + b":" + orjson.dumps(position.to_dict())
                encoded = self._encoded[name] = (position, text)
            entries.append(encoded[1])
        body = b'{"files":{' + b",".join(entries) + b"}"
        if self.unsure:
            body += b',"unsure":' + orjson.dumps(self.unsure, option=orjson.OPT_NON_STR_KEYS)
        tmp.write_bytes(body + b"}")
        os.replace(tmp, self.path)


def default_checkpoint_path(bootstrap: str, topics: Topics) -> Path:
    """Where publish remembers its progress for one cluster and topic prefix."""
    base = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state"))
    digest = hashlib.sha256(f"{bootstrap}|{topics.prefix}".encode()).hexdigest()[:12]
    return base / "sessionfold" / "publish" / f"{digest}.json"


def make_producer(
    bootstrap: str, timeout_s: float = DEFAULT_TIMEOUT_S, security: KafkaSecurity = PLAINTEXT
) -> KafkaProducer:
    """An idempotent, acks=all producer, in order per partition, for records up to 17 MiB.

    Its own delivery timeout is longer than `timeout_s`, so it is publish's deadline that ends
    a long outage (the producer never drops a batch while publish still waits for it), and a
    send blocks at most a second before publish looks at its deadline again.
    """
    request_ms = 15_000
    linger_ms = 5
    return clients.producer(
        bootstrap,
        "sessionfold-publish",
        security,
        acks="all",
        enable_idempotence=True,
        # One request in flight per connection: a retried batch can never land behind a later
        # one, whatever the client does with sequence numbers after an error.
        max_in_flight_requests_per_connection=1,
        linger_ms=linger_ms,
        # A batch that fills is sent at once and wakes the sender thread, which then holds the
        # GIL the reading thread waits for: 16 KiB (the default) filled every 16 records or so.
        batch_size=256 * 1024,
        retries=2**31 - 1,
        retry_backoff_ms=200,
        request_timeout_ms=request_ms,
        delivery_timeout_ms=int(timeout_s * 1000) + request_ms + linger_ms + 5_000,
        max_block_ms=1_000,
        reconnect_backoff_max_ms=2_000,
    )


def abandon(producer: KafkaProducer) -> None:
    """Close the producer without waiting: what it still holds is dropped, never checkpointed.

    kafka-python's close() first waits for a flush and raises when it times out, so the sender
    is stopped first; what it had not sent fails, and close then finds nothing to wait for.
    """
    sender = getattr(producer, "_sender", None)
    if sender is not None:
        sender.force_close()
        sender.join(5)
    with contextlib.suppress(KafkaError):
        producer.close(timeout=0)


def dead_letter_record(letter: DeadLetter) -> bytes:
    """The dead-letter topic's record: where, why, how big, and the bytes it kept."""
    body: dict[str, Any] = letter.describe()
    body["raw_b64"] = base64.b64encode(letter.raw).decode("ascii")
    if len(letter.raw) < letter.size:
        body["raw_truncated"] = True
    return orjson.dumps(body)


def header_cwd(path: Path, session_id: str) -> str | None:
    """The `cwd` of the file's session header, for a run that resumed past the header."""
    try:
        header = header_of(path)
    except (OSError, ValueError):
        return None
    return None if header is None else _header_cwd(header, session_id)


def _header_cwd(header: dict[str, Any], session_id: str) -> str | None:
    cwd = header.get("cwd")
    return cwd if header.get("id") == session_id and isinstance(cwd, str) else None


def world_envelope(session_id: str, seq: int, facts: dict[str, Any]) -> WorldEnvelope:
    """A snapshot envelope; `seq` is the session's last envelope's, not a new number."""
    return WorldEnvelope(
        session_id=session_id,
        seq=seq,
        producer=PRODUCER,
        time=datetime.now(UTC).isoformat(timespec="milliseconds"),
        payload=WorldPayload(facts=facts),
    )


class TopicLog:
    """Reads back what session-events and the dead-letter topic hold, without a group."""

    def __init__(self, bootstrap: str, security: KafkaSecurity = PLAINTEXT) -> None:
        self.bootstrap = bootstrap
        self.security = security
        self._consumer: KafkaConsumer | None = None

    def _client(self) -> KafkaConsumer:
        if self._consumer is None:
            self._consumer = clients.reader(
                self.bootstrap,
                "sessionfold-publish-check",
                self.security,
                bootstrap_timeout_ms=10_000,
            )
        return self._consumer

    def end_offsets(self, topic: str, tick: Callable[[], None]) -> dict[int, int]:
        """Every partition's end offset, asked again until the broker answers or `tick` raises."""
        consumer = self._client()
        while True:
            tick()
            partitions = consumer.partitions_for_topic(topic)
            if partitions:
                tps = [TopicPartition(topic, p) for p in sorted(partitions)]
                with contextlib.suppress(KafkaTimeoutError):
                    ends = consumer.end_offsets(tps, timeout_ms=int(_SLICE_S * 5000))
                    return {tp.partition: offset for tp, offset in ends.items()}

    def last(
        self,
        topic: str,
        key: bytes,
        floors: dict[int, int],
        match: Callable[[ConsumerRecord], int | None],
        tick: Callable[[], None],
    ) -> int | None:
        """The value `match` gives the last record with `key` at or after `floors`."""
        ends = self.end_offsets(topic, tick)
        partition = partition_of(key, len(ends))
        tp = TopicPartition(topic, partition)

        def keyed(record: ConsumerRecord) -> int | None:
            return match(record) if record.key == key else None

        floor = floors.get(partition, 0)
        return last_match(self._client(), tp, floor, ends[partition], keyed, tick)

    def close(self) -> None:
        """Close the consumer, if one was opened."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def _entry_seq(session_id: str) -> Callable[[ConsumerRecord], int | None]:
    """A read-back match: the seq of one of the publisher's envelopes of `session_id`."""

    def match(record: ConsumerRecord) -> int | None:
        try:
            envelope = decode(record.value)
        except EnvelopeError:
            return None
        if isinstance(envelope, EntryEnvelope | PlaceholderEnvelope | WorldEnvelope):
            return envelope.seq if envelope.session_id == session_id else None
        return None

    return match


def _letter_line(source: str) -> Callable[[ConsumerRecord], int | None]:
    """A read-back match: the line of a dead letter of the file `source`."""

    def match(record: ConsumerRecord) -> int | None:
        try:
            body = orjson.loads(record.value)
        except orjson.JSONDecodeError:
            return None
        ok = isinstance(body, dict) and body.get("source") == source
        return body.get("line") if ok and isinstance(body.get("line"), int) else None

    return match


@dataclass
class _Sent:
    """One line's records on their way: the position after the line, and their futures."""

    name: str
    source: str
    position: ReadPosition | None  # None for a world snapshot or a line cut short by a stop
    futures: list[Future]
    closes: bool = False  # no records: the file's last line was read before this mark
    entries: int = 0
    letters: int = 0
    world: int = 0
    size: int = 0


@dataclass
class _Resume:
    """A file marked unsure: the floors to read back from, and what was found there."""

    floors: Floors
    seqs: dict[str, int] = field(default_factory=dict)  # session -> last seq on the topic
    lines: dict[bytes, int] = field(default_factory=dict)  # dead-letter key -> last line


@dataclass
class _WorldDue:
    """A snapshot owed to a session: lines of it were published after its last snapshot."""

    session_id: str
    seq: int


@dataclass
class _WorldLast:
    """The last snapshot of a session: the facts sent, and when git was last asked."""

    facts: dict[str, Any] | None
    probed: float


class Publisher:
    """Publishes files through one producer, keeping per-file checkpoints.

    With `topic_log`, files left unsure by an earlier run are read back so nothing is sent
    twice (without it, as in tests with a fake producer, nothing is read back). `timeout_s`
    bounds every wait for the broker; `should_stop` is asked between lines and during waits.

    With `world`, each file's new lines are followed by a snapshot of its session's working
    directory, when the file was written within `world_max_age_s`, git can take one, it
    differs from the last one sent, and the session's last probe is at least
    `world_interval_s` old (by `clock`).
    """

    def __init__(
        self,
        producer: KafkaProducer,
        topics: Topics,
        checkpoints: Checkpoints,
        on_progress: Callable[[int], None] | None = None,
        world: bool = True,
        world_interval_s: float = WORLD_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        world_max_age_s: float = WORLD_MAX_AGE_S,
        topic_log: TopicLog | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self.producer = producer
        self.topics = topics
        self.checkpoints = checkpoints
        self.counts = PublishCounts()
        self.stats = PublishStats()
        self.on_progress = on_progress or (lambda _bytes: None)
        self.world = world
        self.world_interval_s = world_interval_s
        self.clock = clock
        self.world_max_age_s = world_max_age_s
        self.topic_log = topic_log
        self.timeout_s = timeout_s
        self.should_stop = should_stop
        self._cwds: dict[str, str | None] = {}  # per file: its header's cwd
        self._world_due: dict[str, _WorldDue] = {}  # per file
        self._world_last: dict[str, _WorldLast] = {}  # per session
        # Per file: the reader that stopped at its checkpoint, so a tailing run reads on from
        # there without reading the file back (the ids before it, a translator's state).
        self._readers: dict[str, SessionFileReader] = {}
        self._inflight: deque[_Sent] = deque()
        self._inflight_bytes = 0
        self._since_checkpoint = 0
        self._floors: Floors | None = None  # end offsets below which this run wrote nothing
        self._progress_at = time.monotonic()  # the last acknowledgement (or wait start)
        self._stop_by: float | None = None  # the end of the stop grace, once asked to stop
        self._dirty = False  # checkpoints changed since the last save
        self._ahead: Sequence[Path] = ()  # the files after the current one in this pass
        self._marked: set[str] = set()  # files this run marked unsure: none needs a read-back
        self._unsent: set[str] = set()  # marked ahead, not reached yet
        self._unsettled: set[str] = set()  # files read to their end, not all acknowledged yet
        self.current: str | None = None  # the file being published (resolved path)

    # --- files --------------------------------------------------------------------------

    def publish_file(
        self,
        path: Path,
        final: bool = True,
        first_visit: bool = True,
        ahead: Sequence[Path] = (),
    ) -> None:
        """Send what `path` holds past its checkpoint; its checkpoint moves as it is acknowledged.

        Returns without waiting for the acknowledgements, so the next file's records follow
        this one's in the same requests; `drain` waits for them all. `ahead` are the files to
        be published next, which may be marked unsure in the same checkpoint write as this one.
        """
        name = str(path.resolve())
        self.current = name
        self._ahead = ahead
        if name in self._unsettled:
            # Given twice in a pass: its checkpoint must cover what the first time sent.
            self.drain()
        try:
            self._publish_file(name, path, final, first_visit)
        except (FileKindError, FileNotFoundError):
            # Not read at all (gone, or not a regular file): a mark made ahead for it goes.
            if name in self._unsent:
                self._unsent.discard(name)
                self.checkpoints.unsure.pop(name, None)
                self._dirty = True
            raise

    def _publish_file(self, name: str, path: Path, final: bool, first_visit: bool) -> None:
        start = self.checkpoints.positions.get(name, ReadPosition())
        if path.stat().st_size < start.offset:
            # The file shrank: pi rewrote it (a migration). Its lines are new; read from 0.
            log.warning("file shrank; republishing from the start", extra={"file": name})
            start = ReadPosition()
        reader = self._readers.pop(name, None)
        if reader is None or reader.position != start:
            reader = SessionFileReader(path, start)
        if first_visit:
            self.counts.skipped += start.line
        resume = self._resume(name)
        if resume is not None:
            # What the topics hold of this session must be all there is before reading it back
            # (another file may hold the same session, its records still on their way).
            self.drain()
        sent = 0
        last_offset = start.offset
        try:
            for records in reader.lines(final=final):
                self._check_stop()
                sent += self._send_line(name, path, reader.position, records, resume)
                self.on_progress(reader.position.offset - last_offset)
                last_offset = reader.position.offset
            session_id = reader.position.session_id
            if self.world and sent and session_id is not None and self._live(path):
                # The last envelope's seq: a snapshot takes no number, so entries keep theirs.
                self._world_due[name] = _WorldDue(session_id, reader.position.next_seq - 1)
            self._send_world(name, path)
        except _StopReading:
            # The file was not read to its end: it keeps its unsure mark (a re-run reads back
            # what of it landed), and what was sent gets the stop's grace to be acknowledged.
            self._stop()
        self._readers[name] = reader
        # Read to its end: once everything before this mark is acknowledged, the file's
        # checkpoint covers all it sent, and its unsure mark goes.
        self._inflight.append(_Sent(name, str(path), None, [], closes=True))
        self._unsettled.add(name)
        self._settle()
        if self.should_stop():
            self._stop()

    def _resume(self, name: str) -> _Resume | None:
        """The read-back state of a file an earlier run left unsure, or None."""
        floors = self.checkpoints.unsure.get(name)
        if floors is None or self.topic_log is None or name in self._marked:
            return None
        return _Resume(floors)

    def _send_line(
        self,
        name: str,
        path: Path,
        position: ReadPosition,
        records: list[Any],
        resume: _Resume | None,
    ) -> int:
        """Send one line's records (those not already on the topic); the envelopes sent."""
        sent = _Sent(name, str(path), position, [])
        try:
            for record in records:
                if resume is not None and self._already_there(record, resume):
                    self.counts.skipped += 1
                    continue
                self._mark_unsure(name)
                self._send(record, sent)
                self._note_header(name, record)
        except _StopReading:
            if sent.futures:
                # Part of the line went out: wait for it, but its position is not reached,
                # and the file stays unsure so a re-run finds what of it landed.
                sent.position = None
                self._track(sent)
            raise
        self._track(sent)
        return sent.entries

    def _already_there(self, record: Any, resume: _Resume) -> bool:
        """Whether an earlier run's record for this one is on its topic already."""
        if isinstance(record, DeadLetter):
            key = self._letter_key(record)
            if key not in resume.lines:
                floors = resume.floors.get(self.topics.dead_letters, {})
                found = self._read_back(self.topics.dead_letters, key, floors, record.source)
                resume.lines[key] = found or 0
            return record.line <= resume.lines[key]
        session = record.session_id
        if session not in resume.seqs:
            floors = resume.floors.get(self.topics.session_events, {})
            found = self._read_back(self.topics.session_events, session.encode(), floors, None)
            resume.seqs[session] = found or 0
        return bool(record.seq <= resume.seqs[session])

    def _read_back(
        self, topic: str, key: bytes, floors: dict[int, int], source: str | None
    ) -> int | None:
        assert self.topic_log is not None
        match = _letter_line(source) if source is not None else _entry_seq(key.decode())
        started = time.monotonic()
        try:
            return self.topic_log.last(topic, key, floors, match, lambda: self._tick(started))
        finally:
            self.stats.read_backs += 1
            self.stats.read_back_seconds += time.monotonic() - started

    def _mark_unsure(self, name: str) -> None:
        """Before a file's first record goes out: remember where its records may land.

        The files after it in the pass are marked in the same write (an earlier mark, lower
        floors, is as true for them), unless an earlier run left them marked.
        """
        if self.topic_log is None:
            return
        self._unsent.discard(name)
        if name in self.checkpoints.unsure:
            return
        if self._floors is None:
            started = time.monotonic()
            self._floors = {
                topic: self.topic_log.end_offsets(topic, lambda: self._tick(started))
                for topic in (self.topics.session_events, self.topics.dead_letters)
            }
        self.checkpoints.unsure[name] = copy.deepcopy(self._floors)
        self._marked.add(name)
        for path in self._ahead[: MARK_AHEAD - 1]:
            later = str(path.resolve())
            if later not in self.checkpoints.unsure:
                self.checkpoints.unsure[later] = copy.deepcopy(self._floors)
                self._marked.add(later)
                self._unsent.add(later)
        self._write_checkpoints()

    # --- sending ------------------------------------------------------------------------

    def _send(self, record: Any, sent: _Sent) -> None:
        """Send one envelope or dead letter, adding its future to `sent`."""
        if isinstance(record, DeadLetter):
            value = dead_letter_record(record)
            future = self._produce(self.topics.dead_letters, self._letter_key(record), value)
            sent.letters += 1
        else:
            value = encode(record)
            try:
                future = self._produce(
                    self.topics.session_events, record.session_id.encode(), value
                )
            except MessageSizeTooLargeError:
                # A last guard: the reader dead-letters every entry whose envelope would not fit
                # (session_file.envelope_fits) before it takes a seq, so only a producer whose
                # limit is below `record_fits`'s gets here; the seq is then lost.
                self._send(_too_large_envelope(record, sent.source, len(value)), sent)
                return
            sent.entries += 1
        sent.futures.append(future)
        sent.size += len(value)

    def _letter_key(self, letter: DeadLetter) -> bytes:
        return (letter.session_id or letter.source).encode()

    def _produce(self, topic: str, key: bytes, value: bytes) -> Future:
        """producer.send, asked again while it times out on metadata or buffer space."""
        started = time.monotonic()
        while True:
            try:
                return self.producer.send(topic, key=key, value=value)
            except KafkaTimeoutError:
                # Nothing was queued: the broker is away. Try again until the deadline.
                self._tick(started, reading=True)

    def _track(self, sent: _Sent) -> None:
        """Keep a line's futures; wait for acknowledgements when too many are unanswered."""
        self._inflight.append(sent)
        self._inflight_bytes += sent.size
        self._settle()
        if len(self._inflight) > WINDOW_LINES or self._inflight_bytes > WINDOW_BYTES:
            started = time.monotonic()
            while len(self._inflight) > WINDOW_LINES // 2 or (
                self._inflight_bytes > WINDOW_BYTES // 2
            ):
                self._wait_oldest(started, reading=True)

    # --- acknowledgements ---------------------------------------------------------------

    def _settle(self) -> None:
        """Account for the lines at the head whose records were all acknowledged."""
        while self._inflight and all(f.is_done for f in self._inflight[0].futures):
            head = self._inflight[0]
            failed = next((f for f in head.futures if f.failed()), None)
            if failed is not None:
                self._fail(type(failed.exception).__name__)
            self._inflight.popleft()
            self._inflight_bytes -= head.size
            self._progress_at = time.monotonic()
            self._acknowledged(head)

    def _acknowledged(self, head: _Sent) -> None:
        self.counts.published += head.entries
        self.counts.dead_lettered += head.letters
        self.counts.world += head.world
        for future in head.futures:
            self._raise_floor(future.value)
        if head.closes:
            self._unsettled.discard(head.name)
            self._unsent.discard(head.name)
            if self.checkpoints.unsure.pop(head.name, None) is not None:
                self._dirty = True
        if head.position is not None:
            self.checkpoints.positions[head.name] = head.position
            self._dirty = True
            self._since_checkpoint += head.entries + head.letters
            if self._since_checkpoint >= CHECKPOINT_EVERY:
                self._save()

    def _raise_floor(self, metadata: Any) -> None:
        """This run's records are at or after the floors: move them past an acknowledged one."""
        if self._floors is None or metadata is None:
            return
        parts = self._floors.setdefault(metadata.topic, {})
        parts[metadata.partition] = max(parts.get(metadata.partition, 0), metadata.offset + 1)

    def drain(self) -> None:
        """Wait until every record sent is acknowledged, then write the checkpoint.

        Raises `PublishFailed` past the deadline, and `PublishStopped` once a stop's grace ran
        out with records still unacknowledged.
        """
        started = time.monotonic()
        self.stats.drains += 1
        while self._inflight:
            self._wait_oldest(started, reading=False)
        if self._dirty:
            self._save()

    def _wait_oldest(self, started: float, reading: bool) -> None:
        """Wait a slice for the oldest unacknowledged record, then settle."""
        pending = next((f for f in self._inflight[0].futures if not f.is_done), None)
        if pending is not None:
            waited = time.monotonic()
            with contextlib.suppress(KafkaError):
                pending.get(timeout=_SLICE_S)
            self.stats.ack_waits += 1
            self.stats.ack_wait_seconds += time.monotonic() - waited
        self._settle()
        if self._inflight:
            self._tick(started, reading=reading)

    def _tick(self, started: float, reading: bool = False) -> None:
        """Raise once the broker has been silent past the deadline, or a stop asks to."""
        now = time.monotonic()
        if self.should_stop():
            if reading:
                raise _StopReading
            if self._stop_by is None:
                self._stop_by = now + STOP_GRACE_S
            if now > self._stop_by:
                self._save()
                raise PublishStopped(settled=False)
        if now - max(started, self._progress_at) > self.timeout_s:
            self._fail("timeout")

    def _check_stop(self) -> None:
        if self.should_stop():
            raise _StopReading

    def _stop(self) -> NoReturn:
        """Stop reading: wait for what was sent (within the stop's grace), checkpoint, raise."""
        self.drain()
        self._save()
        raise PublishStopped(settled=True)

    def _fail(self, code: str) -> None:
        """Checkpoint what was acknowledged and give up."""
        self._save()
        raise PublishFailed(code)

    def _save(self) -> None:
        self._write_checkpoints()
        self._since_checkpoint = 0
        self._dirty = False

    def _write_checkpoints(self) -> None:
        started = time.monotonic()
        self.checkpoints.save()
        self.stats.checkpoint_writes += 1
        self.stats.checkpoint_seconds += time.monotonic() - started

    def pending(self) -> int:
        """How many lines were sent but not acknowledged (they are not checkpointed)."""
        return sum(1 for sent in self._inflight if sent.futures)

    def resumes_at(self) -> str | None:
        """The file a re-run resumes in: that of the oldest unacknowledged line, if any."""
        oldest = next((sent for sent in self._inflight if sent.futures), None)
        return oldest.name if oldest is not None else self.current

    # --- world snapshots ----------------------------------------------------------------

    def _live(self, path: Path) -> bool:
        """Whether the file was written recently enough for today's workspace to be its."""
        try:
            return time.time() - path.stat().st_mtime <= self.world_max_age_s
        except OSError:
            return False

    def _note_header(self, name: str, record: Any) -> None:
        if isinstance(record, EntryEnvelope) and record.payload.entry.get("type") == "session":
            self._cwds[name] = _header_cwd(record.payload.entry, record.session_id)

    def _send_world(self, name: str, path: Path) -> None:
        """Send the snapshot `name` is owed, unless its session was probed too recently."""
        due = self._world_due.get(name)
        if due is None:
            return
        last = self._world_last.get(due.session_id)
        now = self.clock()
        if last is not None and now - last.probed < self.world_interval_s:
            return  # stays owed: a later call (with --follow) takes it
        del self._world_due[name]
        facts = self._probe(name, path, due.session_id)
        sent = last.facts if last is not None else None
        if facts is None or facts == sent:
            self._world_last[due.session_id] = _WorldLast(sent, now)
            return
        envelope = encode(world_envelope(due.session_id, due.seq, facts))
        future = self._produce(self.topics.session_events, due.session_id.encode(), envelope)
        self._track(_Sent(name, str(path), None, [future], world=1, size=len(envelope)))
        self._world_last[due.session_id] = _WorldLast(facts, now)

    def _probe(self, name: str, path: Path, session_id: str) -> dict[str, Any] | None:
        """The facts of the session's working directory, when it names one that exists."""
        if name not in self._cwds:
            self._cwds[name] = header_cwd(path, session_id)
        cwd = self._cwds[name]
        # Relative would mean relative to wherever publish runs: not the session's directory.
        started = time.monotonic()
        try:
            if cwd is None or not Path(cwd).is_absolute() or not Path(cwd).is_dir():
                return None
            return world_facts(Path(cwd))
        finally:
            self.stats.world_probes += 1
            self.stats.world_seconds += time.monotonic() - started


def _too_large_envelope(envelope: EntryEnvelope, source: str, size: int) -> DeadLetter:
    """The dead letter of an envelope too large for the topics: where and how big, no bytes."""
    return DeadLetter(
        source=source,
        line=envelope.payload.line,
        error=ENTRY_TOO_LARGE_ERROR,
        reason=ENTRY_TOO_LARGE,
        size=size,
        session_id=envelope.session_id,
    )


def publish_paths(
    publisher: Publisher,
    paths: Iterable[Path],
    follow: bool = False,
    poll_seconds: float = 0.5,
    should_stop: Callable[[], bool] | None = None,
) -> PublishCounts:
    """Publish every session file under `paths`; with `follow`, keep tailing until stopped.

    A stop (the publisher's `should_stop`, or `should_stop` here) ends a follow normally
    once everything sent is acknowledged; without `follow` it raises `PublishStopped`.
    """
    if should_stop is not None:
        publisher.should_stop = should_stop
    roots = list(paths)
    seen: set[Path] = set()
    try:
        while True:
            files = list(session_files(roots))
            for index, path in enumerate(files):
                first_visit = path not in seen
                if first_visit:
                    seen.add(path)
                    publisher.counts.files += 1
                ahead = files[index + 1 : index + MARK_AHEAD]
                try:
                    publisher.publish_file(path, not follow, first_visit, ahead)
                except (FileKindError, FileNotFoundError) as exc:
                    # Replaced by a FIFO or a device, or gone, since it was listed: never read it.
                    log.warning(
                        "file skipped", extra={"file": str(path), "error": type(exc).__name__}
                    )
            publisher.drain()
            if not follow or publisher.should_stop():
                return publisher.counts
            _sleep_unless_stopped(poll_seconds, publisher.should_stop)
    except PublishStopped as stopped:
        if follow and stopped.settled:
            return publisher.counts
        raise


def _sleep_unless_stopped(seconds: float, should_stop: Callable[[], bool]) -> None:
    until = time.monotonic() + seconds
    while not should_stop() and (left := until - time.monotonic()) > 0:
        time.sleep(min(left, _SLICE_S))
