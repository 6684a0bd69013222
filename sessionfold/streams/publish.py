"""Publishing pi session files to Kafka: once each, in order, resumable.

Each file is read from where the last run left it (a checkpoint per file), its envelopes go to
session-events keyed by session id, its dead letters to the dead-letter topic. The checkpoint
moves only after the broker has acknowledged everything before it, so a crash or a broker
restart republishes at most the unacknowledged tail (the idempotent producer and the folds'
sequence check make that harmless) and a finished run re-run publishes nothing.
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
from pathlib import Path
from typing import Any

import orjson
from kafka import KafkaProducer

from sessionfold.events.envelope import encode
from sessionfold.streams.session_file import (
    DeadLetter,
    ReadPosition,
    SessionFileReader,
    session_files,
)
from sessionfold.streams.topics import Topics

log = logging.getLogger(__name__)

#: How many records go out between two acknowledged checkpoints.
CHECKPOINT_EVERY = 500


@dataclass
class PublishCounts:
    """What one publish run did."""

    published: int = 0
    skipped: int = 0  # lines already published by an earlier run
    dead_lettered: int = 0
    files: int = 0

    def line(self) -> str:
        """The final count line."""
        return (
            f"published {self.published}, skipped {self.skipped}, "
            f"dead-lettered {self.dead_lettered} ({self.files} files)"
        )


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


def make_producer(bootstrap: str) -> KafkaProducer:
    """An idempotent, acks=all producer that rides out a broker restart of a minute or two."""
    return KafkaProducer(
        bootstrap_servers=bootstrap,
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


class Publisher:
    """Publishes files through one producer, keeping per-file checkpoints."""

    def __init__(
        self,
        producer: KafkaProducer,
        topics: Topics,
        checkpoints: Checkpoints,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        self.producer = producer
        self.topics = topics
        self.checkpoints = checkpoints
        self.counts = PublishCounts()
        self.on_progress = on_progress or (lambda _bytes: None)

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
        for records in reader.lines(final=final):
            for record in records:
                self._send(record)
            since_checkpoint += len(records)
            if since_checkpoint >= CHECKPOINT_EVERY:
                self._checkpoint(name, reader.position)
                since_checkpoint = 0
            self.on_progress(reader.position.offset - last_offset)
            last_offset = reader.position.offset
        if reader.position != start:
            self._checkpoint(name, reader.position)

    def _send(self, record: Any) -> None:
        if isinstance(record, DeadLetter):
            key = (record.session_id or record.source).encode()
            self.producer.send(self.topics.dead_letters, key=key, value=dead_letter_record(record))
            self.counts.dead_lettered += 1
        else:
            self.producer.send(
                self.topics.session_events, key=record.session_id.encode(), value=encode(record)
            )
            self.counts.published += 1

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
