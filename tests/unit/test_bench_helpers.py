"""The bench helpers whose figures the Kafka pipeline bench prints (bench/cpu_use.py,
bench/runtime_layer.py): CPU seconds read from /proc, the pid behind a port, which limit a run
hit, and the fold runtime measured without Kafka."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from pathlib import Path

import pytest

# bench/ holds scripts, not a package: its helpers are imported the way the scripts import them.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from cpu_use import CpuUse, binding_limit, cpu_seconds, listening_pid, used
from fold_throughput import Baseline
from runtime_layer import memory_runtime, runtime_cpu_seconds

from sessionfold.events.envelope import encode
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.tools.synthetic import generate_session, write_session
from sessionfold.streams.worker.agents import SourceRecord


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_cpu_seconds_counts_this_process_and_none_for_a_gone_one() -> None:
    before = cpu_seconds(os.getpid())
    _burn(0.2)
    spent = used(before, cpu_seconds(os.getpid()))
    assert spent is not None and spent >= 0.15
    assert cpu_seconds(2**22 + 1) is None  # above the kernel's pid limit: never a process
    assert used(None, 1.0) is None


def test_listening_pid_finds_the_process_behind_a_port() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert listening_pid(port) == os.getpid()
    assert listening_pid(port) is None


@pytest.mark.parametrize(
    ("folds", "expected"),
    [
        ([0.95, 0.95], "CPU-bound on this machine"),  # 1.9 of 2 CPUs
        ([0.9], "fold-CPU-bound"),  # one core busy, the machine not
        ([0.4], "latency-bound, it waits"),
    ],
)
def test_binding_limit_names_the_limit_a_run_hit(folds: list[float], expected: str) -> None:
    cpu = CpuUse(wall=1.0, folds=folds, summarizer=0.0, broker=None, bench=0.0)
    clause = binding_limit(cpu, events=1_000, embedded_us=150.0, cpus=2)
    assert expected in clause
    if "fold" in clause:
        assert f"{sum(folds) * 1e6 / 1_000:,.0f} us/event" in clause


def test_runtime_layer_folds_every_record_and_answers_its_requests(tmp_path: Path) -> None:
    """The runtime bench folds a session through FoldRuntime with its flushes answered, and
    measures it: the same head a runtime over an in-memory table reaches by itself."""
    path = write_session(tmp_path, generate_session(3, 30)).path
    records = [
        (r.session_id.encode(), encode(r))
        for r in read_session_file(path)
        if not isinstance(r, DeadLetter)
    ]
    assert runtime_cpu_seconds(records) > 0.0
    runtime, sent = memory_runtime(Topics("t."))

    async def fold_all() -> None:
        for n, (key, value) in enumerate(records):
            await runtime.fold(SourceRecord("t.session-events", 0, n, key, value))
        await (await runtime.commit())

    asyncio.run(fold_all())
    assert any(o.topic == "t.flush-requests" for o in sent)  # the fleet asks for flushes


def test_the_fold_of_another_commit_is_timed_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 3x target's baseline: a commit's tree and this one fold the file in subprocesses,
    a pair per round; a commit that is not there, or a tree that cannot fold, gives no figure
    and says why."""
    path = write_session(tmp_path, generate_session(5, 12)).path
    here = Baseline("HEAD")
    try:
        pairs = here.multiples(path, rounds=2, repeat=1)
        assert len(pairs) == 2 and all(p > 0.0 for p in pairs), here.error
    finally:
        here.close()
    missing = Baseline("0" * 40)
    try:
        assert missing.multiples(path, rounds=2, repeat=1) == []
        assert missing.error is not None and "git archive" in missing.error
    finally:
        missing.close()
    monkeypatch.setattr("fold_throughput.BASELINE_FOLD", "raise SystemExit('no fold here')")
    broken = Baseline("HEAD")
    try:
        assert broken.multiples(path, rounds=2, repeat=1) == []
        assert broken.error == "no fold here"
    finally:
        broken.close()
