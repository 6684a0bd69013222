"""Flush requests answered while partitions move: a fold worker frozen past its session timeout.

A frozen worker (SIGSTOP: no heartbeat, no commit, as when a fold step holds the GIL for a
minute) is dropped from its group and its partitions move to the other fold worker, while the
summarizer answers the requests the new owner raises. Resumed, the frozen worker still holds
the batch it was folding. Every session must end with no request outstanding and the embedded
runtime's state, both as the workers hold it and as the changelog rebuilds it after a restart of
every fold worker.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from conftest import unique_topic_prefix
from kafka_workers import WorkerProcess, generate_fleet, metric_sum, publish_tree, wait_converged

from sessionfold.events.envelope import LedgerRequestEnvelope, encode
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file, session_files
from sessionfold.streams.runtime.embedded import FLUSH_REQUESTS, EmbeddedRuntime, fold_files
from sessionfold.streams.worker.agents import OFFLOAD_BYTES
from sessionfold.streams.worker.fault_injection import ENV_TEST_FOLD_HOOK

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: Longer than the workers' session timeout (6 s): the group drops the frozen worker.
FROZEN_S = 10.0


def _freeze_point(paths: list[Path]) -> tuple[str, int]:
    """The event right after one that raises a pruning flush request, in the middle of the
    fleet: frozen there, the worker's open batch holds the request and the barrier it raised."""
    runtime = EmbeddedRuntime()
    for path in paths:
        for record in read_session_file(path):
            if not isinstance(record, DeadLetter):
                runtime.publish(record)
    requests = [e for e in runtime.log[FLUSH_REQUESTS] if not isinstance(e, LedgerRequestEnvelope)]
    middle = requests[len(requests) // 2]
    return middle.session_id, middle.seq + 1


@pytest.fixture(scope="module")
def small_fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """`generate --sessions 24 --turns 50 --seed 5` and its embedded states."""
    root = generate_fleet(tmp_path_factory.mktemp("rebalance-fleet"), 24, 50, seed=5)
    return root, fold_files(list(session_files([root])))["sessions"]


def test_requests_answered_while_a_frozen_fold_worker_loses_its_partitions(
    kafka_bootstrap: str, small_fleet: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """Two fold workers and a summarizer. A fold worker freezes in the middle of a batch that
    raised a flush request, and stays frozen past its session timeout; the other takes its
    partitions, raises the request again and applies its answer; the frozen one is resumed.
    Every session ends as the embedded runtime folds it, with nothing outstanding, and so it
    does again once every fold worker is restarted and has rebuilt its state from the
    changelog."""
    root, expected = small_fleet
    session, seq = _freeze_point(list(session_files([root])))
    prefix = unique_topic_prefix()
    publish_tree(kafka_bootstrap, prefix, 4, [root], tmp_path / "publish.json")
    folds = [
        WorkerProcess(kafka_bootstrap, prefix, "fold", 4, tmp_path, name=f"fold-{n}") for n in "ab"
    ]
    summarize = WorkerProcess(kafka_bootstrap, prefix, "summarize", 4, tmp_path)
    workers = [*folds, summarize]
    try:
        summarize.start()
        for worker in folds:  # whichever folds that event first freezes; then maybe the other
            worker.start(env={ENV_TEST_FOLD_HOOK: f"freeze:{session}:{seq}"})
        for worker in workers:
            worker.wait_web()
        freezes = _resume_frozen(folds)
        assert freezes >= 1, "no fold worker reached the freeze point"
        wait_converged(workers, folds[1].url, expected, timeout=240)
        assert _missing(folds) == 0  # no session's events jumped a hole on the way
        for worker in folds:
            worker.stop()
        for worker in folds:
            worker.start()
        for worker in folds:
            worker.wait_web()
        wait_converged(workers, folds[0].url, expected, timeout=180)
        assert _missing(folds) == 0
    finally:
        for worker in workers:
            worker.resume()
            worker.stop()


def _missing(folds: list[WorkerProcess]) -> float:
    """Session events the fold workers skipped past since they started (a loss)."""
    return sum(metric_sum(w.metrics(), "sessionfold_events_missing_total") for w in folds)


def _resume_frozen(folds: list[WorkerProcess]) -> int:
    """Resume each fold worker that freezes itself, FROZEN_S after it did; how many did."""
    freezes = 0
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and freezes < len(folds):
        frozen = [w for w in folds if w.stopped()]
        if not frozen:
            time.sleep(0.2)
            continue
        time.sleep(FROZEN_S)
        for worker in frozen:
            worker.resume()
        freezes += len(frozen)
        deadline = min(deadline, time.monotonic() + 30)  # the other may reach it too
    return freezes


#: Longer than the session timeout and the rebalance timeout's share a revocation may take.
SLOW_STEP_S = 12.0


def test_a_slow_fold_step_keeps_the_worker_serving_and_its_partitions(
    kafka_bootstrap: str, shared_sessions: Path, tmp_path: Path
) -> None:
    """A fold step that takes 12 s on a large entry (a test hook sleeping in it) leaves the
    worker's event loop free: /metrics answers meanwhile, the worker keeps its partitions (no
    second "Worker ready"), and the session ends as the embedded runtime folds it."""
    path = shared_sessions / "before-compaction.jsonl"
    envelopes = [r for r in read_session_file(path) if not isinstance(r, DeadLetter)]
    large = next(e for e in envelopes if len(encode(e)) >= OFFLOAD_BYTES)
    expected = fold_files([path])["sessions"]
    prefix = unique_topic_prefix()
    worker = WorkerProcess(kafka_bootstrap, prefix, "all", 1, tmp_path)
    hook = f"sleep:{large.session_id}:{large.seq}:{SLOW_STEP_S}"
    try:
        worker.start(env={ENV_TEST_FOLD_HOOK: hook})
        worker.wait_web()
        publish_tree(kafka_bootstrap, prefix, 1, [path], tmp_path / "publish.json")
        deadline = time.monotonic() + 120
        while metric_sum(worker.metrics(), "sessionfold_events_folded_total") == 0:
            assert time.monotonic() < deadline, worker.log_tail()
            time.sleep(0.2)
        answered = 0
        slow_until = time.monotonic() + SLOW_STEP_S - 2
        while time.monotonic() < slow_until:
            worker.metrics()  # raises when the web server does not answer within 10 s
            answered += 1
            time.sleep(0.5)
        assert answered >= 10
        wait_converged([worker], worker.url, expected, timeout=180)
        assert worker.log_path.read_text().count("Worker ready") == 1, worker.log_tail()
    finally:
        worker.stop()
