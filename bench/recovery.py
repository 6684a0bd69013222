"""Seconds from a fold worker's restart to serving again, memory:// against rocksdb://.

    SESSIONFOLD_BOOTSTRAP=127.0.0.1:29092 .venv/bin/python bench/recovery.py \
        [--sessions 200] [--turns 40] [--partitions 4] [--rounds 2]

A generated fleet is published to fresh topics and folded by one `--role all` worker with
`--store rocksdb://` until the state API gives the embedded fold's state for every session. Then,
`--rounds` times: the worker is SIGKILLed and started again on the same data dir; then SIGKILLed
and a memory:// worker of the same group (a data dir of its own) is started in its place. For
each start it prints the seconds until the worker serves again (its fleet gauge counts every
session, which happens once the state table is recovered, and a probe session per partition
reads back as the embedded fold has it) and the changelog records it read back
(`sessionfold_state_records_recovered_total`). Every session is checked after each start
(untimed). After a SIGKILL the group waits up to the session timeout (6 s) for the dead member
before the new one is given its partitions; that wait is part of every figure.

Needs a running broker (SESSIONFOLD_BOOTSTRAP, default 127.0.0.1:9092). Workers are
subprocesses, stopped at the end whatever happens; their logs stay in a temporary directory,
named at the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import orjson
from kafka_pipeline import free_port, log  # bench/ is on the path when a bench runs
from prometheus_client.parser import text_string_to_metric_families

from sessionfold.streams.kafka.topics import Topics, ensure_topics, partition_of
from sessionfold.streams.publishing.publisher import (
    Checkpoints,
    Publisher,
    make_producer,
    publish_paths,
)
from sessionfold.streams.runtime.embedded import fold_files
from sessionfold.streams.tools import broker
from sessionfold.streams.tools.synthetic import write_fleet

TOKEN = "bench-recovery-token-0123456789abcdef"
RECOVERED = "sessionfold_state_records_recovered_total"


class Worker:
    """One `sessionfold worker --role all` on a data dir of its own, restartable."""

    def __init__(self, bootstrap: str, prefix: str, partitions: int, store: str, work: Path):
        self.store = store
        self.port = free_port()
        self.log_path = work / f"worker-{store.split(':')[0]}.log"
        self.argv = [sys.executable, "-m", "sessionfold.streams.cli", "worker", "--role", "all"]
        self.argv += ["--bootstrap", bootstrap, "--topic-prefix", prefix]
        self.argv += ["--partitions", str(partitions), "--web-port", str(self.port)]
        self.argv += ["--store", store, "--data-dir", str(work / f"data-{store.split(':')[0]}")]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL of its web server."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the process (its output appended to its log)."""
        env = {**os.environ, "SESSIONFOLD_API_TOKEN": TOKEN}
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=env
            )

    def kill(self) -> None:
        """SIGKILL: no leave-group, no commit, no flush."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()

    def alive(self) -> None:
        """Raise if the process exited."""
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"worker exited with {self.process.returncode}: {self.log_path}")

    def metrics(self, client: httpx.Client) -> dict[str, float]:
        """One scrape, summed over labels."""
        text = client.get(f"{self.url}/metrics", timeout=5).text
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        return totals

    def state(self, client: httpx.Client, session_id: str) -> Any:
        """A session's state from the state API, or None."""
        headers = {"Authorization": f"Bearer {TOKEN}"}
        response = client.get(f"{self.url}/sessions/{session_id}", timeout=30, headers=headers)
        return orjson.loads(response.content) if response.status_code == 200 else None


def canonical(value: Any) -> bytes:
    """Canonical JSON, to compare states."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def serving(
    worker: Worker, client: httpx.Client, expected: dict[str, Any], probes: Sequence[str]
) -> bool:
    """Whether the worker holds every session and answers the probes as expected."""
    worker.alive()
    try:
        if worker.metrics(client).get("sessionfold_active_sessions", 0) < len(expected):
            return False
        return all(
            canonical(worker.state(client, sid)) == canonical(expected[sid]) for sid in probes
        )
    except (httpx.HTTPError, orjson.JSONDecodeError):
        return False


def wrong_sessions(worker: Worker, client: httpx.Client, expected: dict[str, Any]) -> int:
    """Sessions whose state differs from the expected."""
    return sum(
        canonical(worker.state(client, sid)) != canonical(state) for sid, state in expected.items()
    )


def restart(
    worker: Worker, client: httpx.Client, expected: dict[str, Any], probes: Sequence[str]
) -> tuple[float, float]:
    """Start `worker`; seconds until it serves, changelog records it read back."""
    started = time.monotonic()
    worker.start()
    deadline = started + 600
    while not serving(worker, client, expected, probes):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no service within 600 s: {worker.log_path}")
        time.sleep(0.1)
    seconds = time.monotonic() - started
    recovered = worker.metrics(client).get(RECOVERED, 0.0)
    wrong = wrong_sessions(worker, client, expected)
    if wrong:
        raise AssertionError(f"{wrong} sessions differ after a restart: {worker.log_path}")
    return seconds, recovered


def main(argv: Sequence[str] | None = None) -> int:
    """Run the measurement; print one line per start and a summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    bootstrap = os.environ.get("SESSIONFOLD_BOOTSTRAP", "127.0.0.1:9092")
    if not broker.probe(bootstrap, timeout_s=10.0):
        print(f"no broker answers at {bootstrap}", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="sessionfold-recovery-"))
    prefix = f"b{uuid4().hex[:8]}."
    topics = Topics(prefix)
    log(f"generating {args.sessions} sessions x {args.turns} turns in {work}")
    paths = [w.path for w in write_fleet(work / "fleet", args.sessions, args.turns, args.seed)]
    expected = orjson.loads(orjson.dumps(fold_files(paths)["sessions"]))
    by_partition: dict[int, str] = {}
    for session_id in sorted(expected):
        by_partition.setdefault(partition_of(session_id, args.partitions), session_id)
    probes = list(by_partition.values())
    ensure_topics(bootstrap, topics, args.partitions)
    producer = make_producer(bootstrap)
    try:
        published = publish_paths(
            Publisher(producer, topics, Checkpoints(work / "publish.json")), paths
        )
    finally:
        producer.close()
    log(f"published {published.published} events")
    rocks = Worker(bootstrap, prefix, args.partitions, "rocksdb://", work)
    memory = Worker(bootstrap, prefix, args.partitions, "memory://", work)
    figures: dict[str, list[tuple[float, float]]] = {"rocksdb://": [], "memory://": []}
    with httpx.Client() as client:
        try:
            started = time.monotonic()
            rocks.start()
            deadline = started + 900
            while not serving(rocks, client, expected, list(expected)):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the fleet was not folded in 900 s: {rocks.log_path}")
                time.sleep(2)
            log(f"folded by rocksdb:// in {time.monotonic() - started:.1f}s")
            for round_no in range(1, args.rounds + 1):
                for worker in (rocks, memory):
                    rocks.kill()
                    memory.kill()
                    seconds, recovered = restart(worker, client, expected, probes)
                    figures[worker.store].append((seconds, recovered))
                    log(
                        f"round {round_no} {worker.store}: serving again {seconds:.1f}s after "
                        f"its start, {recovered:.0f} changelog records read"
                    )
        finally:
            rocks.stop()
            memory.stop()
    fleet = f"{args.sessions} sessions x {args.turns} turns, {args.partitions} partitions"
    print(f"\nrecovery, {fleet}, {published.published} events")
    for store, runs in figures.items():
        seconds = ", ".join(f"{s:.1f}" for s, _r in runs)
        records = ", ".join(f"{r:.0f}" for _s, r in runs)
        print(f"  {store:<11} restart to serving: {seconds} s; records read: {records}")
    print(f"(logs in {work})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
