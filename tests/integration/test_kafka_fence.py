"""The changelog fence on the real broker: a late write of a worker that had lost its partitions
(what a stall past the session timeout leaves, kafka/fence.py) changes no recovered state.

The late write is made by hand, so the test is exact: the oldest value of the changelog's most
written key goes back in behind the worker's writes, with an epoch below theirs, as a stalled
worker's queued write lands. A restarted worker (memory://: the
whole changelog; rocksdb://: the records after its persisted offset) must serve the embedded
fold's state; without the fence that late write is the key's last value, and recovery takes it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from conftest import unique_topic_prefix
from kafka.structs import TopicPartition
from kafka_workers import WorkerProcess, generate_fleet, metric_sum, publish_tree, wait_converged

from sessionfold.streams.kafka import clients
from sessionfold.streams.kafka.fence import FENCE_HEADER, encode_epoch, epoch_of
from sessionfold.streams.publishing.session_file import session_files
from sessionfold.streams.runtime.embedded import fold_files

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 2
FENCED = "sessionfold_state_records_fenced_total"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_fleet(tmp_path_factory.mktemp("fence-fleet"), 6, 12, seed=5)


def changelog(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes | None, int | None]]:
    """Every record of the changelog: (partition, key, value, epoch), in each partition's order."""
    consumer = clients.reader(bootstrap, "sessionfold-test", consumer_timeout_ms=3000)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        records = []
        for message in consumer:
            epoch = epoch_of(message.headers)
            records.append((message.partition, message.key, message.value, epoch))
        return records
    finally:
        consumer.close()


def write_late(bootstrap: str, topic: str) -> None:
    """Write the oldest record of the changelog's most written session behind its newest, as a
    stalled worker's queued write lands: of an epoch below every one there. A record is a
    session's journal of a batch (kafka/changelog.py): the oldest holds the first values of rows
    written since, its session's head among them."""
    records = changelog(bootstrap, topic)
    assert records and all(epoch is not None for *_, epoch in records), "records with no epoch"
    session = Counter((p, k.split(b"/")[0]) for p, k, v, _s in records if v is not None)
    (partition, owner), _count = session.most_common(1)[0]
    written = [(k, v) for p, k, v, _s in records if p == partition and k.split(b"/")[0] == owner]
    name, oldest = written[0]
    assert oldest != written[-1][1], "the most written session never changed"
    late = min(epoch for *_, epoch in records if epoch is not None) - 1
    producer = clients.producer(bootstrap, "sessionfold-test")
    try:
        headers = [(FENCE_HEADER, encode_epoch(late))]
        producer.send(topic, key=name, value=oldest, partition=partition, headers=headers).get(30)
    finally:
        producer.close()


@pytest.mark.parametrize("store", ["memory://", "rocksdb://"])
def test_a_late_write_of_a_worker_that_lost_its_partitions_changes_no_recovered_state(
    kafka_bootstrap: str, fleet: Path, tmp_path: Path, store: str
) -> None:
    prefix = unique_topic_prefix()
    expected = fold_files(list(session_files([fleet])))["sessions"]
    publish_tree(kafka_bootstrap, prefix, PARTITIONS, [fleet], tmp_path / "pub.json")
    worker = WorkerProcess(
        kafka_bootstrap, prefix, "all", PARTITIONS, tmp_path, env={"SESSIONFOLD_STORE": store}
    )
    try:
        worker.start().wait_web()
        wait_converged([worker], worker.url, expected, timeout=180)
        worker.stop()
        write_late(kafka_bootstrap, f"{prefix}worker-state-changelog")

        worker.start().wait_web()
        wait_converged([worker], worker.url, expected, timeout=60)
        assert metric_sum(worker.metrics(), FENCED) == 1
    finally:
        worker.kill()
