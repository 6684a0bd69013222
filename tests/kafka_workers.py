"""Kafka workers as subprocesses for the runtime tests: start, wait, scrape, kill, compare.

Not a test module: the Kafka runtime tests import it (`from kafka_workers import ...`), which
works because pytest puts `tests/` on sys.path for its rootdir conftest. Each worker is
`python -m sessionfold.streams.cli worker ...` on a free port, logging to a file in the test's
tmp dir (its tail is shown when something fails). Every worker runs with `API_TOKEN` (one per
test run, so every fold worker of a test shares it and forwarded requests carry it) unless a
test passes another or None; the helpers here send it.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx
import orjson
from kafka import TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from sessionfold.streams.cli import app as cli
from sessionfold.streams.kafka import clients
from sessionfold.streams.kafka.topics import Topics, ensure_topics
from sessionfold.streams.publishing.publisher import (
    Checkpoints,
    Publisher,
    make_producer,
    publish_paths,
)

#: Samples of one scrape: (name, sorted label pairs) -> value.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

#: The state API token of the test run's workers.
API_TOKEN = secrets.token_urlsafe(24)


def auth(token: str | None = API_TOKEN) -> dict[str, str]:
    """Headers carrying the API token (none for None)."""
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def canonical(value: Any) -> bytes:
    """The canonical JSON the equivalence tests compare."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def generate_fleet(root: Path, sessions: int, turns: int, seed: int) -> Path:
    """`sessionfold generate --sessions S --turns T --seed N ROOT`; ROOT."""
    args = ["generate", "--sessions", str(sessions), "--turns", str(turns), "--seed", str(seed)]
    result = CliRunner().invoke(cli, [*args, str(root)])
    assert result.exit_code == 0, result.output
    return root


def publish_tree(
    bootstrap: str, prefix: str, partitions: int, roots: Iterable[Path], state: Path
) -> int:
    """Publish session files with the Publisher (topics created first); envelopes published."""
    topics = Topics(prefix)
    ensure_topics(bootstrap, topics, partitions)
    producer = make_producer(bootstrap)
    try:
        counts = publish_paths(Publisher(producer, topics, Checkpoints(state)), list(roots))
    finally:
        producer.close()
    return counts.published


class WorkerProcess:
    """One `sessionfold worker` subprocess."""

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        role: str,
        partitions: int,
        work_dir: Path,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        api_token: str | None = API_TOKEN,
    ) -> None:
        self.bootstrap = bootstrap
        self.prefix = prefix
        self.role = role
        self.partitions = partitions
        self.name = name or role
        self.port = free_port()
        self.work_dir = work_dir
        self.log_path = work_dir / f"{self.name}.log"
        self.env = dict(env or {})
        self.api_token = api_token
        if api_token is not None:
            self.env.setdefault("SESSIONFOLD_API_TOKEN", api_token)
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        """Base URL of its web server."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, env: Mapping[str, str] | None = None) -> WorkerProcess:
        """Start (or restart) the process; `env` adds variables for this start only."""
        command = [sys.executable, "-m", "sessionfold.streams.cli", "worker"]
        command += ["--role", self.role, "--bootstrap", self.bootstrap]
        command += ["--topic-prefix", self.prefix, "--partitions", str(self.partitions)]
        command += ["--web-port", str(self.port)]  # bound to 127.0.0.1 by default
        command += ["--data-dir", str(self.work_dir / "data")]
        environment = {**os.environ, **self.env, **(env or {})}
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n==== start {self.starts} ====\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=environment
            )
        return self

    def wait_web(self, timeout: float = 60.0) -> None:
        """Wait until its web server answers /health."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"{self.name} web server never answered\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: no leave-group, no commit, no flush."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def pause(self) -> None:
        """SIGSTOP: the whole process freezes (no heartbeat, no commit), as a stalled one does."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT: a paused process goes on from where it stopped."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def stopped(self) -> bool:
        """Whether the process is stopped by a signal (it froze itself, or `pause`)."""
        if self.process is None or self.process.poll() is not None:
            return False
        stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        return stat.rpartition(")")[2].split()[0] == "T"

    def stop(self) -> None:
        """SIGTERM (a graceful leave), then SIGKILL if it hangs."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()

    def metrics(self) -> Samples:
        """One scrape of its /metrics, parsed."""
        response = httpx.get(f"{self.url}/metrics", timeout=10)
        assert response.status_code == 200, response.text
        return parse_metrics(response.text)

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of its log."""
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            code = self.process.returncode
            raise AssertionError(f"{self.name} exited with {code}\n{self.log_tail()}")


def parse_metrics(text: str) -> Samples:
    """Samples of a Prometheus text exposition."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metric(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value (0 when absent)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def metric_sum(samples: Samples, name: str) -> float:
    """The sum of a metric's samples over all label values."""
    return sum(value for (sample, _), value in samples.items() if sample == name)


def quiet(workers: Iterable[WorkerProcess], sessions: int) -> bool:
    """Whether the fold workers hold every session, nothing is held or outstanding, no lag."""
    fold_workers = [w for w in workers if w.role in ("fold", "all")]
    scrapes = [w.metrics() for w in workers]
    folds = [w.metrics() for w in fold_workers]
    owned = sum(metric(s, "sessionfold_active_sessions") for s in folds)
    busy = sum(
        metric(s, "sessionfold_held_events") + metric(s, "sessionfold_outstanding_flushes")
        for s in folds
    )
    lag = sum(metric_sum(s, "sessionfold_consumer_lag_records") for s in scrapes)
    return owned >= sessions and busy == 0 and lag == 0


def fetch_state(url: str, session_id: str, token: str | None = API_TOKEN) -> tuple[int, Any]:
    """GET /sessions/{id} with the token: status and JSON body."""
    response = httpx.get(f"{url}/sessions/{session_id}", timeout=60, headers=auth(token))
    return response.status_code, orjson.loads(response.content)


def mismatches(url: str, expected: Mapping[str, Any]) -> list[str]:
    """Sessions whose state from the API differs from the expected (canonical JSON)."""
    wrong = []
    for session_id, state in expected.items():
        status, body = fetch_state(url, session_id)
        if status != 200 or canonical(body) != canonical(state):
            wrong.append(session_id)
    return wrong


def describe_difference(url: str, session_id: str, state: Mapping[str, Any]) -> str:
    """Which top-level fields of one session differ (for a failure message)."""
    status, body = fetch_state(url, session_id)
    if status != 200:
        return f"{session_id}: HTTP {status} {body}"
    fields = sorted(
        k for k in set(state) | set(body) if canonical(state.get(k)) != canonical(body.get(k))
    )
    return f"{session_id}: fields {fields}"


def wait_converged(
    workers: list[WorkerProcess],
    url: str,
    expected: Mapping[str, Any],
    timeout: float,
    sessions: int | None = None,
) -> float:
    """Wait until the state API gives the expected state for every session; seconds taken.

    The cheap check (metrics say the fleet is quiet) comes first, so the workers are not slowed
    by whole-state reads while they fold.
    """
    started = time.monotonic()
    deadline = started + timeout
    wrong: list[str] = list(expected)
    while time.monotonic() < deadline:
        for worker in workers:
            worker._check_alive()
        try:
            if quiet(workers, sessions or len(expected)):
                wrong = mismatches(url, expected)
                if not wrong:
                    return time.monotonic() - started
        except httpx.HTTPError:
            pass  # a worker is restarting or rebalancing
        time.sleep(2)
    details = [describe_difference(url, sid, expected[sid]) for sid in wrong[:3]]
    tails = "\n".join(f"--- {w.name}\n{w.log_tail(25)}" for w in workers)
    gauges = {w.name: _gauges(w) for w in workers}
    raise AssertionError(
        f"{len(wrong)} sessions differ after {timeout:.0f}s: {details}\n{gauges}\n{tails}"
    )


def _gauges(worker: WorkerProcess) -> dict[str, float]:
    try:
        samples = worker.metrics()
    except (httpx.HTTPError, AssertionError) as exc:
        return {"scrape failed": 0.0, type(exc).__name__: 0.0}
    names = ("active_sessions", "held_events", "outstanding_flushes", "consumer_lag_records")
    return {name: metric_sum(samples, f"sessionfold_{name}") for name in names}


def committed(bootstrap: str, group: str, topic: str) -> int:
    """Offsets the consumer group has committed on `topic`, summed over partitions."""
    admin = clients.admin(bootstrap, "sessionfold-test")
    try:
        offsets = admin.list_group_offsets({group: None}).get(group, {})
    finally:
        admin.close()
    return sum(meta.offset for tp, meta in offsets.items() if tp.topic == topic and meta.offset > 0)


def wait_progress(bootstrap: str, group: str, topics: Topics, total: int, fraction: float) -> int:
    """Wait until `group` has committed `fraction` of `total` session events; the count then."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        done = committed(bootstrap, group, topics.session_events)
        if done >= fraction * total:
            return done
        time.sleep(0.5)
    raise AssertionError(f"the fold did not reach {fraction:.0%} of the events")


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """The end offset of every partition of `topic`."""
    consumer = clients.reader(bootstrap, "sessionfold-test")
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(partitions).items()}
    finally:
        consumer.close()
