"""Recovery from local state on the real broker: a `--store rocksdb://` worker killed mid-fold
and restarted on its data dir folds to the embedded runtime's state, and a restart reads far fewer
changelog records than a `memory://` worker's start (which reads the whole changelog).

The seconds from a restart to serving every session's state are printed (information only).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import unique_topic_prefix
from kafka_workers import (
    WorkerProcess,
    end_offsets,
    generate_fleet,
    metric,
    mismatches,
    publish_tree,
    wait_converged,
    wait_progress,
)

from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.session_file import session_files
from sessionfold.streams.runtime.embedded import fold_files

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 3
RECOVERED = "sessionfold_state_records_recovered_total"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_fleet(tmp_path_factory.mktemp("recovery-fleet"), 40, 40, seed=13)


def test_a_rocksdb_worker_restarts_from_its_local_state(
    kafka_bootstrap: str, fleet: Path, tmp_path: Path
) -> None:
    """SIGKILLed mid-fold and restarted on the same data dir, a rocksdb:// worker folds to the
    embedded state; SIGKILLed idle and restarted, it serves the same state again having read a
    small part of the changelog a memory:// worker of the same group reads at its start."""
    prefix = unique_topic_prefix()
    topics = Topics(prefix)
    group = f"{prefix}worker"
    expected = fold_files(list(session_files([fleet])))["sessions"]
    published = publish_tree(kafka_bootstrap, prefix, PARTITIONS, [fleet], tmp_path / "pub.json")
    local_env = {"SESSIONFOLD_STORE": "rocksdb://"}
    rocks = WorkerProcess(
        kafka_bootstrap, prefix, "all", PARTITIONS, tmp_path / "rocks", "rocks", local_env
    )
    memory = WorkerProcess(kafka_bootstrap, prefix, "all", PARTITIONS, tmp_path / "memory")
    for worker in (rocks, memory):
        worker.work_dir.mkdir()
    try:
        rocks.start().wait_web()
        # Early: the whole fleet folds in seconds, and commits come in steps.
        at = wait_progress(kafka_bootstrap, group, topics, published, 0.1)
        rocks.kill()
        rocks.start()
        wait_converged([rocks], rocks.url, expected, timeout=420)
        assert at < published, "the fold finished before the kill"
        changelog = sum(end_offsets(kafka_bootstrap, f"{group}-state-changelog").values())

        rocks.kill()
        rocks_s, rocks_read = _serve_again(rocks, expected)
        rocks.kill()
        memory_s, memory_read = _serve_again(memory, expected)
        memory.kill()
        print(
            f"\nrestart to serving {len(expected)} sessions ({changelog} changelog records): "
            f"rocksdb:// {rocks_s:.1f}s reading {rocks_read:.0f} records, "
            f"memory:// {memory_s:.1f}s reading {memory_read:.0f} records"
        )
        assert memory_read > 0
        assert rocks_read * 10 <= memory_read
    finally:
        rocks.stop()
        memory.stop()


def test_rocksdb_workers_hand_partitions_over_and_back(
    kafka_bootstrap: str, fleet: Path, tmp_path: Path
) -> None:
    """Two rocksdb:// workers (a data dir each): one is SIGKILLed mid-fold, the other takes its
    partitions and folds on; restarted, the first takes some back, reads from its local store
    what the other wrote meanwhile, and both fold to the embedded state."""
    prefix = unique_topic_prefix()
    topics = Topics(prefix)
    expected = fold_files(list(session_files([fleet])))["sessions"]
    published = publish_tree(kafka_bootstrap, prefix, PARTITIONS, [fleet], tmp_path / "pub.json")
    local_env = {"SESSIONFOLD_STORE": "rocksdb://"}
    workers = [
        WorkerProcess(kafka_bootstrap, prefix, "all", PARTITIONS, tmp_path / name, name, local_env)
        for name in ("rocks-a", "rocks-b")
    ]
    victim, survivor = workers
    for worker in workers:
        worker.work_dir.mkdir()
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.wait_web()
        at = wait_progress(kafka_bootstrap, f"{prefix}worker", topics, published, 0.3)
        victim.kill()
        wait_progress(kafka_bootstrap, f"{prefix}worker", topics, published, 0.6)
        victim.start()
        wait_converged(workers, survivor.url, expected, timeout=420)
        assert at < published, "the fold finished before the kill"
        # Through the restarted worker too (Faust may rebalance once more as it settles).
        wait_converged(workers, victim.url, expected, timeout=120)
        read = [metric(w.metrics(), RECOVERED) for w in workers]
        owned = [metric(w.metrics(), "sessionfold_active_sessions") for w in workers]
        print(f"\nrecords recovered {read}, sessions owned {owned}")
        assert all(n > 0 for n in owned), f"one worker owns nothing: {owned}"
    finally:
        for worker in workers:
            worker.stop()


def _serve_again(worker: WorkerProcess, expected: dict[str, Any]) -> tuple[float, float]:
    """Start `worker`; seconds until it serves every expected state, records it recovered."""
    started = time.monotonic()
    worker.start()
    deadline = started + 300
    while time.monotonic() < deadline:
        worker._check_alive()
        try:
            if not mismatches(worker.url, expected):
                seconds = time.monotonic() - started
                return seconds, metric(worker.metrics(), RECOVERED)
        except (httpx.HTTPError, orjson.JSONDecodeError):
            pass  # not listening yet, or not serving state yet (a plain-text error)
        time.sleep(0.25)
    raise AssertionError(f"{worker.name} did not serve again\n{worker.log_tail()}")
