"""What a fold holds per session and what a worker process costs in memory (bench helpers).

- The embedded runtime's state: the DictStore's rows of each session, sized as canonical JSON
  (key plus sorted-keys orjson value), the same bytes a fold worker keeps for that session.
- The Kafka runtime's state: the fold worker's changelog topic read without a group, each
  record's key and value bytes summed per session: every write (what a `memory://` worker
  replays to recover until the broker compacts the topic) and the last value of each key
  (what is live, and what compaction leaves).
- A process's resident set, from /proc/PID/status.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson
from kafka import TopicPartition

from sessionfold.projections.store import DictStore
from sessionfold.streams.kafka import clients
from sessionfold.streams.kafka.security import PLAINTEXT, KafkaSecurity
from sessionfold.streams.kafka.topic_reader import read_topic
from sessionfold.streams.publishing.session_file import read_session_file
from sessionfold.streams.runtime.embedded import EmbeddedRuntime


@dataclass(frozen=True)
class SessionSizes:
    """Bytes of state per session, and the messages on each session's branch."""

    bytes_by_session: dict[str, int]
    messages_by_session: dict[str, int]

    @property
    def mean(self) -> float:
        """Mean bytes per session."""
        return statistics.fmean(self.bytes_by_session.values()) if self.bytes_by_session else 0.0

    @property
    def max(self) -> int:
        """Bytes of the largest session."""
        return max(self.bytes_by_session.values(), default=0)

    @property
    def per_message(self) -> float:
        """Bytes of state per branch message, over the whole fleet."""
        messages = sum(self.messages_by_session.get(s, 0) for s in self.bytes_by_session)
        return sum(self.bytes_by_session.values()) / messages if messages else 0.0


def session_of(key: str) -> str:
    """The session a store key belongs to: keys are `sid/part/...` (projections/store.py)."""
    return key.split("/", 1)[0]


def store_sizes(store: DictStore) -> dict[str, int]:
    """Canonical JSON bytes (key + value) of each session's rows."""
    sizes: dict[str, int] = {}
    for key, value in store.items():
        size = len(key.encode()) + len(orjson.dumps(value, option=orjson.OPT_SORT_KEYS))
        sid = session_of(key)
        sizes[sid] = sizes.get(sid, 0) + size
    return sizes


def embedded_sizes(paths: Iterable[Path]) -> SessionSizes:
    """Fold the files embedded and size each session's rows."""
    runtime = EmbeddedRuntime()
    for path in paths:
        for record in read_session_file(path):
            runtime.publish(record)
    messages = {
        sid: sum(runtime.session_state(sid)["counts"]["messages"].values())
        for sid in runtime.sessions()
    }
    return SessionSizes(store_sizes(runtime.store), messages)


@dataclass(frozen=True)
class ChangelogSizes:
    """A changelog topic read whole: every write, and the last value of each key."""

    records: int
    written: SessionSizes
    live: SessionSizes

    @property
    def total_bytes(self) -> int:
        """Key and value bytes of every record."""
        return sum(self.written.bytes_by_session.values())


def changelog_sizes(
    bootstrap: str,
    topic: str,
    messages: dict[str, int],
    security: KafkaSecurity = PLAINTEXT,
) -> ChangelogSizes:
    """Read `topic` from the beginning; `messages` is each session's branch messages, and
    sessions it does not name (another phase's) are left out."""
    written: dict[str, int] = {}
    last: dict[bytes, tuple[str, int]] = {}
    records = 0
    for record in read_topic(bootstrap, topic, security=security):
        records += 1
        key = record.key or b""
        size = len(key) + len(record.value or b"")
        sid = session_of(key.decode(errors="replace"))
        if sid not in messages:
            continue
        written[sid] = written.get(sid, 0) + size
        if record.value is None:
            last.pop(key, None)  # a tombstone: the key is deleted
        else:
            last[key] = (sid, size)
    live: dict[str, int] = {}
    for sid, size in last.values():
        live[sid] = live.get(sid, 0) + size
    return ChangelogSizes(records, SessionSizes(written, messages), SessionSizes(live, messages))


def topic_records(bootstrap: str, topic: str, security: KafkaSecurity = PLAINTEXT) -> int:
    """Records between the beginning and the end offsets of every partition of `topic`."""
    consumer = clients.reader(bootstrap, "sessionfold-bench-offsets", security)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        if not partitions:
            return 0
        begins = consumer.beginning_offsets(partitions)
        ends = consumer.end_offsets(partitions)
        return sum(ends[tp] - begins[tp] for tp in partitions)
    finally:
        consumer.close()


def rss_bytes(pid: int) -> int:
    """Resident set size of a live process (VmRSS), or 0 if it has gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024  # reported in kB
    return 0
