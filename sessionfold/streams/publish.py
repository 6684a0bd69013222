"""Publishing pi session files to Kafka: once each, in order, resumable.

Each file is read from where the last run left it (a checkpoint per file), its envelopes go to
session-events keyed by session id, its dead letters to the dead-letter topic. The checkpoint
moves only after the broker has acknowledged everything before it, so a crash or a broker
restart republishes at most the unacknowledged tail (the idempotent producer and the folds'
sequence check make that harmless) and a finished run re-run publishes nothing.

After a file's new lines, a `world` envelope (a read-only git snapshot of the session's working
directory, see `world.py`) follows them on the same key. It takes no sequence number of its
own: its seq is that of the session's last envelope before it, so every entry keeps the seq a
plain read of the file gives it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from kafka import KafkaProducer

from sessionfold.events.envelope import EntryEnvelope, WorldEnvelope, WorldPayload, encode
from sessionfold.events.lines import split_line
from sessionfold.streams.kafka_security import PLAINTEXT, KafkaSecurity, kafka_python_options
from sessionfold.streams.session_file import (
    DeadLetter,
    ReadPosition,
    SessionFileReader,
    session_files,
)
from sessionfold.streams.topics import Topics
from sessionfold.streams.world import world_facts

log = logging.getLogger(__name__)

#: How many records go out between two acknowledged checkpoints.
CHECKPOINT_EVERY = 500

#: The shortest time between two world snapshots of one session (each costs five git runs).
WORLD_INTERVAL_S = 10.0
#: A snapshot describes the workspace now: only a file written this recently (a live or just
#: finished session) gets one, never an old transcript published after the fact.
WORLD_MAX_AGE_S = 3600.0

PRODUCER = "sessionfold-publish"


@dataclass
class PublishCounts:
    """What one publish run did."""

    published: int = 0
    skipped: int = 0  # lines already published by an earlier run
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
class Checkpoints:
    """Per-file read positions, kept in one JSON file written atomically."""

    path: Path
    positions: dict[str, ReadPosition] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Checkpoints:
        """Read the checkpoint file, or start empty when there is none."""
        if not path.exists():
            return cls(path)
        data = json.loads(path.read_text())
        return cls(path, {k: ReadPosition.from_dict(v) for k, v in data.get("files", {}).items()})

    def save(self) -> None:
        """Write the file atomically (a crash leaves the old one or the new one)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        body = {"files": {k: v.to_dict() for k, v in sorted(self.positions.items())}}
        tmp.write_text(json.dumps(body, indent=1))
        os.replace(tmp, self.path)


def default_checkpoint_path(bootstrap: str, topics: Topics) -> Path:
    """Where publish remembers its progress for one cluster and topic prefix."""
    base = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state"))
    digest = hashlib.sha256(f"{bootstrap}|{topics.prefix}".encode()).hexdigest()[:12]
    return base / "sessionfold" / "publish" / f"{digest}.json"


def make_producer(bootstrap: str, security: KafkaSecurity = PLAINTEXT) -> KafkaProducer:
    """An idempotent, acks=all producer that rides out a broker restart of a minute or two."""
    return KafkaProducer(
        bootstrap_servers=bootstrap,
        **kafka_python_options(security),
        client_id="sessionfold-publish",
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        retries=2**31 - 1,
        retry_backoff_ms=200,
        request_timeout_ms=15_000,
        delivery_timeout_ms=180_000,
        reconnect_backoff_max_ms=2_000,
    )


def dead_letter_record(letter: DeadLetter) -> bytes:
    """The dead-letter topic's record: where, why, how big, and the bytes themselves."""
    body: dict[str, Any] = letter.describe()
    body["raw_b64"] = base64.b64encode(letter.raw).decode("ascii")
    return orjson.dumps(body)


def header_cwd(path: Path, session_id: str) -> str | None:
    """The `cwd` of the file's session header, for a run that resumed past the header."""
    try:
        with path.open("rb") as handle:
            for line in handle:
                values, _rest = split_line(line.rstrip(b"\r\n"))
                for value in values:
                    if _is_header(value):
                        return _header_cwd(value, session_id)
    except OSError:
        return None
    return None


def _is_header(value: Any) -> bool:
    # The reader's rule: the first object of type session with an id is the header.
    return (
        isinstance(value, dict)
        and value.get("type") == "session"
        and isinstance(value.get("id"), str)
    )


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
    ) -> None:
        self.producer = producer
        self.topics = topics
        self.checkpoints = checkpoints
        self.counts = PublishCounts()
        self.on_progress = on_progress or (lambda _bytes: None)
        self.world = world
        self.world_interval_s = world_interval_s
        self.clock = clock
        self.world_max_age_s = world_max_age_s
        self._cwds: dict[str, str | None] = {}  # per file: its header's cwd
        self._world_due: dict[str, _WorldDue] = {}  # per file
        self._world_last: dict[str, _WorldLast] = {}  # per session

    def publish_file(self, path: Path, final: bool = True, first_visit: bool = True) -> None:
        """Publish what `path` holds past its checkpoint, then move the checkpoint."""
        name = str(path.resolve())
        start = self.checkpoints.positions.get(name, ReadPosition())
        if path.stat().st_size < start.offset:
            # The file shrank: pi rewrote it (a migration). Its lines are new; read from 0.
            log.warning("file shrank; republishing from the start", extra={"file": name})
            start = ReadPosition()
        reader = SessionFileReader(path, start)
        if first_visit:
            self.counts.skipped += start.line
        since_checkpoint = 0
        last_offset = start.offset
        sent = 0
        for records in reader.lines(final=final):
            for record in records:
                sent += self._send(record)
                self._note_header(name, record)
            since_checkpoint += len(records)
            if since_checkpoint >= CHECKPOINT_EVERY:
                self._checkpoint(name, reader.position)
                since_checkpoint = 0
            self.on_progress(reader.position.offset - last_offset)
            last_offset = reader.position.offset
        session_id = reader.position.session_id
        if self.world and sent and session_id is not None and self._live(path):
            # The last envelope's seq: a snapshot takes no number, so entries keep theirs.
            self._world_due[name] = _WorldDue(session_id, reader.position.next_seq - 1)
        self._send_world(name, path)
        if reader.position != start:
            self._checkpoint(name, reader.position)

    def _send(self, record: Any) -> int:
        """Send one record; 1 when it was an envelope of the session, 0 for a dead letter."""
        if isinstance(record, DeadLetter):
            key = (record.session_id or record.source).encode()
            self.producer.send(self.topics.dead_letters, key=key, value=dead_letter_record(record))
            self.counts.dead_lettered += 1
            return 0
        self.producer.send(
            self.topics.session_events, key=record.session_id.encode(), value=encode(record)
        )
        self.counts.published += 1
        return 1

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
        envelope = world_envelope(due.session_id, due.seq, facts)
        self.producer.send(
            self.topics.session_events, key=due.session_id.encode(), value=encode(envelope)
        )
        self.counts.world += 1
        self._world_last[due.session_id] = _WorldLast(facts, now)

    def _probe(self, name: str, path: Path, session_id: str) -> dict[str, Any] | None:
        """The facts of the session's working directory, when it names one that exists."""
        if name not in self._cwds:
            self._cwds[name] = header_cwd(path, session_id)
        cwd = self._cwds[name]
        # Relative would mean relative to wherever publish runs: not the session's directory.
        if cwd is None or not Path(cwd).is_absolute() or not Path(cwd).is_dir():
            return None
        return world_facts(Path(cwd))

    def _checkpoint(self, name: str, position: ReadPosition) -> None:
        # flush() returns once every send so far is acknowledged (or raises): only then is the
        # position safe to remember.
        self.producer.flush()
        self.checkpoints.positions[name] = position
        self.checkpoints.save()


def publish_paths(
    publisher: Publisher,
    paths: Iterable[Path],
    follow: bool = False,
    poll_seconds: float = 0.5,
    should_stop: Callable[[], bool] = lambda: False,
) -> PublishCounts:
    """Publish every session file under `paths`; with `follow`, keep tailing until stopped."""
    roots = list(paths)
    seen: set[Path] = set()
    while True:
        for path in session_files(roots):
            first_visit = path not in seen
            if first_visit:
                seen.add(path)
                publisher.counts.files += 1
            publisher.publish_file(path, final=not follow, first_visit=first_visit)
        publisher.producer.flush()
        if not follow or should_stop():
            return publisher.counts
        time.sleep(poll_seconds)
