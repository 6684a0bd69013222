"""A session whose changelog went back to waiting on answers already consumed, freed by a restart.

A fold worker that lost its partitions while it stalled can still write a batch late (the window
StallGuard leaves open): the changelog then ends with an older state of the session, in which it
waits on requests whose answers were consumed and committed. Here that state is made for real:
the session's state table rows at a point where it waits (the summarizer down) are written back
to the changelog after the answers were applied, as one late journal record. Restarted, the fold
worker must send those requests again, and the session end as the embedded runtime folds it.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import unique_topic_prefix
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka_workers import WorkerProcess, metric, metric_sum, publish_tree, wait_converged

from sessionfold.streams.kafka import changelog
from sessionfold.streams.runtime.embedded import fold_files

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
#: Largest part of the late journal (the broker's and the producer's limit is 1 MiB).
LATE_PART_BYTES = 512 * 1024


def _changelog(prefix: str) -> str:
    """The state table's changelog topic (Faust: `<app id>-<table>-changelog`)."""
    return f"{prefix}worker-state-changelog"


def _rows(bootstrap: str, topic: str) -> dict[str, bytes]:
    """The state table's rows as recovery rebuilds them from partition 0 of its changelog:
    every record in offset order, journals applied (kafka/changelog.py)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id="sessionfold-test")
    partition = TopicPartition(topic, 0)
    reader = changelog.Reader()
    rows: dict[str, bytes] = {}
    try:
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        end = consumer.end_offsets([partition])[partition]
        deadline = time.monotonic() + 60
        while consumer.position(partition) < end:
            assert time.monotonic() < deadline, "changelog not read within 60 s"
            for records in consumer.poll(timeout_ms=1000).values():
                for record in records:
                    key = record.key.decode()
                    writes = reader.writes(key, record.value, 0)
                    for row, value in writes if writes is not None else [(key, record.value)]:
                        if value is None:
                            rows.pop(row, None)
                        else:
                            rows[row] = value
        return rows
    finally:
        consumer.close()


def _wait_waiting(fold: WorkerProcess, timeout: float = 120.0) -> None:
    """Wait until the fold worker has read every session event and its session waits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        samples = fold.metrics()
        read = metric_sum(samples, "sessionfold_events_folded_total") > 0
        lag = metric_sum(samples, "sessionfold_consumer_lag_records")
        if read and lag == 0 and metric(samples, "sessionfold_outstanding_flushes") == 1:
            return
        time.sleep(0.5)
    raise AssertionError(f"the session never waited on a request\n{fold.log_tail()}")


def _write_back(bootstrap: str, topic: str, older: dict[str, bytes]) -> int:
    """End the changelog with the older state: one late journal record per session that puts
    the older value of each row that differs and deletes the rows made since (what a stalled
    worker's late batch does); how many rows it sets back. Each session's changelog position
    row stays as it is, so the records written after take their places in the ring."""
    now = _rows(bootstrap, topic)
    back: dict[str, list[tuple[str, bytes | None]]] = {}
    for key in sorted(older.keys() | now.keys()):
        owner = changelog.owner_of(key)
        if older.get(key) != now.get(key) and key != changelog.position_key(owner, 0):
            back.setdefault(owner, []).append((key, older.get(key)))
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for owner, writes in back.items():
            at = changelog.Position.decode(now.get(changelog.position_key(owner, 0)))
            parts = changelog.split(writes, LATE_PART_BYTES)  # one journal in parts, in order
            row = (changelog.position_key(owner, 0), replace(at, next=at.next + len(parts)))
            for n, part in enumerate(parts):
                last = [(row[0], row[1].encode())] if n == len(parts) - 1 else []
                position = at.next + n
                value = changelog.encode_record(
                    changelog.JOURNAL, position, n, len(parts), [*part, *last]
                )
                key = changelog.record_key(owner, 0, position)
                producer.send(topic, key=key.encode(), value=value, partition=0)
        producer.flush(60)
    finally:
        producer.close()
    return sum(map(len, back.values()))


def test_a_restart_frees_a_session_whose_changelog_waits_on_consumed_answers(
    kafka_bootstrap: str, shared_sessions: Path, tmp_path: Path
) -> None:
    """The session's changelog state goes back to waiting on requests (a pruning flush and a
    ledger pass) whose answers were consumed and committed; after a restart of the workers the
    fold sends them again, and the session ends as the embedded runtime folds it, with nothing
    outstanding."""
    path = shared_sessions / "before-compaction.jsonl"
    expected: dict[str, Any] = fold_files([path])["sessions"]
    prefix = unique_topic_prefix()
    changelog_topic = _changelog(prefix)
    publish_tree(kafka_bootstrap, prefix, 1, [path], tmp_path / "publish.json")
    fold = WorkerProcess(kafka_bootstrap, prefix, "fold", 1, tmp_path)
    summarize = WorkerProcess(kafka_bootstrap, prefix, "summarize", 1, tmp_path)
    workers = [fold, summarize]
    try:
        fold.start()
        fold.wait_web()
        _wait_waiting(fold)  # no summarizer yet: the barriers stay up, later events held
        fold.stop()
        waiting = _rows(kafka_bootstrap, changelog_topic)
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.wait_web()
        wait_converged(workers, fold.url, expected, timeout=180)
        for worker in workers:
            worker.stop()
        assert _write_back(kafka_bootstrap, changelog_topic, waiting) > 0
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.wait_web()
        wait_converged(workers, fold.url, expected, timeout=120)
        resent = fold.metrics()
        assert metric(resent, "sessionfold_requests_resent_total", kind="pruning") == 1
        assert metric(resent, "sessionfold_requests_resent_total", kind="ledger") == 1
    finally:
        for worker in workers:
            worker.stop()
