"""The Kafka runtime measured end to end, side by side in one run on one broker.

    .venv/bin/python bench/kafka_pipeline.py [--sessions 16] [--turns 80] [--partitions 4]
        [--fleet-sessions 1000 [--fleet-turns 8] [--profile]] [--recovery]

- Fold throughput through Faust: events/s from the first publish of a generated fleet until
  every event is folded and no flush barrier is up (the workers' own /metrics: events folded,
  held events, outstanding flushes, consumer lag), with one fold worker and a summarizer worker.
- Its ratio to a raw aiokafka consume of the same topic (the transport's ceiling; target >= 0.5),
  next to the embedded fold of the same files (the fold's own ceiling, no Kafka).
- With `--fleet-sessions`, the same from a backlog: the fleet published before the fold workers
  start, timed from when all are assigned and folding until complete (a fold catching up after
  an outage, and the fold's own rate with no publisher sharing the CPUs), with one fold worker
  and with two.
- Publish-to-projection latency, p50 and p99: single events of a new session, each published
  with a timestamp, the state API polled until the session's message count reflects it.
- One fold worker against two, on the same fleet over `--partitions` partitions.
- The state the workers hold is compared with the embedded fold's, session by session.
- State per session: the embedded fold's rows (canonical JSON) for the fleet at `--turns` and at
  4x as many, per session and per branch message; the fold worker's changelog topic read back,
  every write and the last value of each key, per session.
- The fold worker's RSS (VmRSS) assigned and idle, and once the fleet is folded.
- Where a fold worker's CPU goes: the CPU seconds of every fold worker, the summarizer, the broker
  and the bench (bench/cpu_use.py); the worker's CPU per event next to the embedded fold's and
  next to `FoldRuntime` over an in-memory table (bench/runtime_layer.py: our batches and journals
  without Kafka); where the fold agent's time goes (sessionfold_fold_agent_seconds_total:
  folding, awaiting its commit, awaiting records); from a backlog, Faust's floor (a Faust agent
  that does nothing, bench/faust_floor.py) against the per-worker target's CPU budget per event;
  and a "what binds" line for each target not met.
- `--fleet-sessions N`: a second fleet of N sessions of `--fleet-turns` turns, folded by one and
  by two fold workers against the embedded fold of the same files; the changelog and RSS figures
  are then taken on it.
- `--profile`: with `--fleet-sessions`, one more backlog run with one fold worker, sampled by
  py-spy (bench/worker_layers.py): its main thread by layer (pure fold, envelope decode, Faust
  delivery, producer, fold runtime, waiting), the figures above left unsampled.
- `--recovery`: once the fleet (the `--fleet-sessions` one if given) is folded, the fold worker
  is SIGKILLed and another started with the same app id; the seconds until the state API serves
  every session as the embedded fold has it, and the changelog records it replays.

Each figure with a target in issue #13 is printed next to it, met or NOT met: one fold worker
>= 0.8 of the embedded fold, two >= 1.8x one, recovery <= 10 s, state per message flat as
sessions grow (4x the turns: <= 1.25x the bytes per message); and next to what the issue
measured when it was filed (0.21 of the embedded fold per worker, 1.3x for two, 116 s to recover).

Uses the broker at SESSIONFOLD_BOOTSTRAP when it answers (with the Kafka security settings of
the SESSIONFOLD_SECURITY_PROTOCOL, SESSIONFOLD_SSL_* and SESSIONFOLD_SASL_* variables, which the
workers inherit); otherwise starts one from Maven Central on a free port with a temporary data
dir, and stops it at the end. Workers are
subprocesses (`sessionfold worker`), stopped with SIGTERM at the end, whatever happens. Every wait
is bounded, so the run takes a few minutes at most.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import orjson
from aiokafka import TopicPartition
from cpu_use import CpuUse, binding_limit, listening_pid, snapshot, used
from faust_floor import Floor, floor
from kafka import KafkaProducer
from prometheus_client.parser import text_string_to_metric_families
from runtime_layer import runtime_cpu_seconds
from sizing import (
    ChangelogSizes,
    SessionSizes,
    changelog_sizes,
    embedded_sizes,
    rss_bytes,
    topic_records,
)
from worker_layers import Layers, Recording

from sessionfold.events.envelope import decode, encode
from sessionfold.streams.kafka import clients
from sessionfold.streams.kafka.security import (
    ENV_NAMES,
    PLAINTEXT,
    KafkaSecurity,
    security_from_env,
)
from sessionfold.streams.kafka.topics import Topics, ensure_topics, partition_of
from sessionfold.streams.publishing.publisher import make_producer
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.runtime.config_files import load_config
from sessionfold.streams.runtime.embedded import EmbeddedRuntime, fold_files
from sessionfold.streams.tools import broker
from sessionfold.streams.tools.synthetic import generate_session, write_fleet, write_session
from sessionfold.streams.worker.app import Stopwatch

#: Seconds a worker may take to join its group and get its partitions.
READY_TIMEOUT_S = 90.0
#: Scrape interval while waiting for a fleet to be folded: each scrape recomputes the gauges of
#: the sessions that changed, so scraping much faster would slow the workers being measured.
PROGRESS_POLL_S = 0.5
#: State API poll interval in the latency phase (the resolution of the latency figures).
LATENCY_POLL_S = 0.002
#: Longest wait for one event to show in the state API before the latency phase gives up.
LATENCY_EVENT_TIMEOUT_S = 15.0
#: Pruning off: no flush requests, so no flush barrier; what is left is the fold and its state.
PRUNING_OFF = ("enabled=false",)
#: Issue #13's targets: a Kafka fold worker against the embedded fold, two workers against one,
#: a restarted fold worker serving again, and state per message as sessions grow 4x longer.
PER_WORKER_TARGET = 0.8
SCALING_TARGET = 1.8
RECOVERY_TARGET_S = 10.0
#: What issue #13 measured when it was filed, printed next to each target's figure: one fold
#: worker against the embedded fold, two against one, a 200-session fleet's restart to serving.
FILED_PER_WORKER = 0.21
FILED_SCALING = 1.3
FILED_RECOVERY_S = 116.0
GROWTH_TARGET = 1.25
#: State API poll interval while a restarted worker recovers.
RECOVERY_POLL_S = 0.05


def log(message: str) -> None:
    """Progress on stderr; the results table goes to stdout."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the broker ---------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def local_broker_pid(bootstrap: str) -> int | None:
    """The pid listening on the first bootstrap address if that is this machine, else None."""
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    if host not in {"127.0.0.1", "localhost", "::1", "[::1]"} or not port.isdigit():
        return None
    return listening_pid(int(port))


@contextlib.contextmanager
def kafka_broker(work: Path) -> Iterator[tuple[str, str, KafkaSecurity, int | None]]:
    """(bootstrap, where it came from, security, the broker's pid if it can be measured):
    SESSIONFOLD_BOOTSTRAP's broker with the security the environment sets, else a PLAINTEXT
    one started here."""
    bootstrap = os.environ.get("SESSIONFOLD_BOOTSTRAP", "").strip()
    security = security_from_env()
    if bootstrap and broker.probe(bootstrap, timeout_s=10.0, security=security):
        yield bootstrap, "SESSIONFOLD_BOOTSTRAP", security, local_broker_pid(bootstrap)
        return
    config = broker.BrokerConfig(port=broker.free_port_pair(), data_dir=work / "kafka")
    log(f"starting Kafka {config.version} on {config.bootstrap}")
    started = broker.up(config)
    # The workers must not take the environment's security settings to this PLAINTEXT broker.
    for name in ENV_NAMES:
        os.environ.pop(name, None)
    try:
        origin = f"started here, Kafka {config.version}"
        yield config.bootstrap, origin, PLAINTEXT, started.pid
    finally:
        log("stopping the broker")
        broker.stop(config)


# --- workers ------------------------------------------------------------------------------------


@dataclass
class Worker:
    """A `sessionfold worker` subprocess."""

    role: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        """Base URL of its web server (state API, /metrics, Faust's /router/)."""
        return f"http://127.0.0.1:{self.port}"

    def check_alive(self) -> None:
        """Raise with the end of its log if the process has exited."""
        if self.process.poll() is not None:
            tail = self.log_path.read_text(errors="replace").splitlines()[-20:]
            joined = "\n".join(tail)
            msg = f"{self.role} worker exited ({self.process.returncode}):\n{joined}"
            raise RuntimeError(msg)


def start_worker(
    bootstrap: str,
    topics: Topics,
    app_id: str,
    role: str,
    partitions: int,
    work: Path,
    settings: Sequence[str] = (),
) -> Worker:
    """Start one worker of `app_id` on a free web port; it logs to a file under `work`.

    `settings` are pruning settings passed as `--set NAME=VALUE`.
    """
    port = free_port()
    log_path = work / f"{app_id}-{role}-{port}.log"
    argv = [sys.executable, "-m", "sessionfold.streams.cli", "worker", "--role", role]
    argv += ["--bootstrap", bootstrap, "--topic-prefix", topics.prefix]
    argv += ["--partitions", str(partitions), "--app-id", app_id]
    argv += ["--web-port", str(port), "--web-bind", "127.0.0.1"]
    argv += ["--data-dir", str(work / "faust" / f"{role}-{port}")]
    for setting in settings:
        argv += ["--set", setting]
    with log_path.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    return Worker(role, port, process, log_path)


def stop_workers(workers: Sequence[Worker]) -> None:
    """SIGTERM every worker (a clean group leave), then SIGKILL what is left after 30 s."""
    for worker in workers:
        if worker.process.poll() is None:
            worker.process.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.process.wait(30)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait(10)


def get_json(client: httpx.Client, url: str) -> Any:
    """The JSON body of a 200 answer, else None (not up yet, rebalancing, unknown)."""
    try:
        response = client.get(url, timeout=5.0)
    except httpx.HTTPError:
        return None
    return orjson.loads(response.content) if response.status_code == 200 else None


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str, poll_s: float) -> None:
    """Poll `condition` until it holds; raise TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(poll_s)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f}s")


def wait_assigned(
    client: httpx.Client, folds: Sequence[Worker], summarizer: Worker, partitions: int
) -> None:
    """Wait until every fold worker sees the same assignment, in which each of them owns some
    of the state table's partitions and together all; and the summarizer is ready.

    Measuring from then on keeps group joins and rebalances out of the figures.
    """
    urls = {w.url for w in folds}

    def settled() -> bool:
        for worker in [*folds, summarizer]:
            worker.check_alive()
        views = []
        for worker in folds:
            tables = get_json(client, f"{worker.url}/router/")
            if not tables:
                return False
            owned = {url: {p for ps in m.values() for p in ps} for url, m in tables.items()}
            if set(owned) != urls or not all(owned.values()):
                return False
            views.append(owned)
        if any(view != views[0] for view in views):
            return False
        if set().union(*views[0].values()) != set(range(partitions)):
            return False
        # A worker without a table publishes no routes: the summarizer says so in its log.
        return "Worker ready" in summarizer.log_path.read_text(errors="replace")

    wait_until(settled, READY_TIMEOUT_S, "workers assigned", 0.25)


# --- metrics ------------------------------------------------------------------------------------


def samples(client: httpx.Client, worker: Worker) -> list[Any]:
    """Every sample of a worker's /metrics (none if it does not answer)."""
    try:
        text = client.get(f"{worker.url}/metrics", timeout=5.0).text
    except httpx.HTTPError:
        return []
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def scrape(client: httpx.Client, worker: Worker) -> dict[str, float]:
    """A worker's /metrics, each sample name summed over its label sets."""
    totals: dict[str, float] = {}
    for sample in samples(client, worker):
        totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def agent_seconds(client: httpx.Client, worker: Worker) -> dict[str, float]:
    """A fold worker's `sessionfold_fold_agent_seconds_total`, by kind (zeros if unscraped)."""
    seconds = dict.fromkeys(Stopwatch.KINDS, 0.0)
    for sample in samples(client, worker):
        if sample.name == "sessionfold_fold_agent_seconds_total":
            seconds[sample.labels["kind"]] = sample.value
    return seconds


@dataclass
class Progress:
    """What the fold workers add up to at one scrape."""

    folded: float = 0.0
    held: float = 0.0
    outstanding: float = 0.0
    lag: float = 0.0
    per_worker: list[float] = field(default_factory=list)

    def done(self, events: int) -> bool:
        """Every event folded, no barrier up, nothing unread."""
        return self.folded >= events and self.held == self.outstanding == self.lag == 0


def progress(client: httpx.Client, folds: Sequence[Worker]) -> Progress:
    """Sum the fold workers' counters and gauges."""
    result = Progress()
    for worker in folds:
        values = scrape(client, worker)
        folded = values.get("sessionfold_events_folded_total", 0.0)
        result.folded += folded
        result.per_worker.append(folded)
        result.held += values.get("sessionfold_held_events", 0.0)
        result.outstanding += values.get("sessionfold_outstanding_flushes", 0.0)
        # Lag is labelled by role; a fold worker's only role is fold.
        result.lag += values.get("sessionfold_consumer_lag_records", 0.0)
    return result


# --- the fleet ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fleet:
    """A generated fleet: its files, its records in publish order, the embedded fold's result."""

    paths: list[Path]
    records: list[tuple[bytes, bytes]]  # (key, value) as `sessionfold publish` sends them
    sessions: list[str]
    megabytes: float
    embedded_seconds: float
    embedded_off_seconds: float  # the same with pruning off: no flushes
    embedded_cpu_seconds: float  # process time of the embedded fold (pruning on)
    runtime_cpu_seconds: float  # process time of FoldRuntime over an in-memory table (no Kafka)
    expected: dict[str, Any]  # session id -> state, as the state API reports it


def make_fleet(work: Path, sessions: int, turns: int, seed: int) -> Fleet:
    """Generate the fleet, encode its envelopes, and fold it embedded (timed) for reference."""
    out = work / "fleet"
    written = write_fleet(out, sessions=sessions, turns=turns, seed=seed)
    paths = [w.path for w in written]
    records = []
    for path in paths:
        for record in read_session_file(path):
            if not isinstance(record, DeadLetter):
                records.append((record.session_id.encode(), encode(record)))
    started, started_cpu = time.perf_counter(), time.process_time()
    folded = fold_files(paths)
    embedded_seconds = time.perf_counter() - started
    embedded_cpu_seconds = time.process_time() - started_cpu
    started = time.perf_counter()
    fold_files(paths, load_config(None, list(PRUNING_OFF)))
    embedded_off_seconds = time.perf_counter() - started
    runtime_seconds = runtime_cpu_seconds(records)
    # Through JSON, as the state API sends it (tuples become lists, and so on).
    expected = orjson.loads(orjson.dumps(folded["sessions"]))
    return Fleet(
        paths=paths,
        records=records,
        sessions=list(expected),
        megabytes=sum(len(v) for _k, v in records) / 1e6,
        embedded_seconds=embedded_seconds,
        embedded_off_seconds=embedded_off_seconds,
        embedded_cpu_seconds=embedded_cpu_seconds,
        runtime_cpu_seconds=runtime_seconds,
        expected=expected,
    )


def publish(producer: KafkaProducer, topic: str, records: Sequence[tuple[bytes, bytes]]) -> None:
    """Send every record and wait until the broker acknowledged them all."""
    for key, value in records:
        producer.send(topic, key=key, value=value)
    producer.flush()


# --- phases -------------------------------------------------------------------------------------


@dataclass
class FoldRun:
    """One fleet folded through Faust."""

    fold_workers: int
    seconds: float
    publish_seconds: float
    events: int
    complete: bool
    per_worker: list[float]
    topics: Topics
    folds: list[Worker]
    summarizer: Worker
    app_id: str
    settings: tuple[str, ...]
    rss_ready: list[int]  # bytes per fold worker, assigned and idle
    rss_done: list[int]  # bytes per fold worker, the fleet folded
    cpu: CpuUse  # publish to complete (from a backlog: assigned and folding to complete)
    backlog: bool = False  # published before the fold workers started
    #: Each fold worker's agent seconds by kind over the same window as `cpu`.
    agent: list[dict[str, float]] = field(default_factory=list)
    #: With `profile`, the first fold worker's main thread by layer (bench/worker_layers.py),
    #: or why there is none.
    layers: Layers | str | None = None

    @property
    def rate(self) -> float:
        """Events per second, publish to complete (from a backlog: assigned and folding to
        complete, the events folded before that left out)."""
        return self.events / self.seconds if self.seconds > 0 else 0.0


def fold_run(
    bootstrap: str,
    fleet: Fleet,
    fold_workers: int,
    partitions: int,
    work: Path,
    timeout_s: float,
    started: list[Worker],
    settings: Sequence[str] = (),
    security: KafkaSecurity = PLAINTEXT,
    broker_pid: int | None = None,
    backlog: bool = False,
    profile: bool = False,
) -> FoldRun:
    """Start `fold_workers` fold workers and a summarizer on fresh topics, publish the fleet,
    and time it until every event is folded. The workers are left running (and in `started`).

    `settings` are pruning settings for the fold workers (`--set`). The CPU seconds of every
    worker, of the broker (`broker_pid`, if known) and of this process are read at the first
    publish and once complete. With `backlog` the fleet is published before the fold workers
    start, and the clock (and the CPU count) starts once all of them are assigned and they have
    folded an event (the events folded before are left out): the fold draining a backlog, as
    after an outage, with no publisher sharing the CPUs. With `profile` too, py-spy samples the
    first fold worker over the same window.
    """
    topics = Topics(f"bench{uuid4().hex[:8]}.")
    ensure_topics(bootstrap, topics, partitions=partitions, security=security)
    app_id = f"bench-{uuid4().hex[:8]}"
    summarizer = start_worker(bootstrap, topics, app_id, "summarize", partitions, work)
    started.append(summarizer)
    if backlog:
        log(f"publishing {len(fleet.records)} events (a backlog: no fold worker yet)")
        published = publish_all(bootstrap, topics, fleet, security)
    folds = []
    for _ in range(fold_workers):
        folds.append(start_worker(bootstrap, topics, app_id, "fold", partitions, work, settings))
        started.append(folds[-1])
    with httpx.Client() as client:
        note = f" ({', '.join(settings)})" if settings else ""
        note += ", from a backlog" if backlog else ""
        log(f"{fold_workers} fold worker(s){note} + 1 summarizer, {partitions} partitions")
        pids = [w.process.pid for w in [*folds, summarizer]]
        pids += [os.getpid()] + ([] if broker_pid is None else [broker_pid])
        state = Progress()
        recording: Recording | None = None
        if backlog:
            rss_ready = [0 for _ in folds]
            # Every fold worker in the group first (the first to join starts alone, and the
            # others' joining moves partitions), then the clock starts at the next scrape.
            wait_assigned(client, folds, summarizer, partitions)
            wait_until(lambda: progress(client, folds).folded > 0, timeout_s, "first event", 0.01)
            agent_before = [agent_seconds(client, w) for w in folds]
            cpu_before = snapshot(pids)
            if profile:
                recording = Recording(folds[0].process.pid, work / f"{app_id}-layers.txt")
            began = time.perf_counter()
            state = first = progress(client, folds)
        else:
            wait_assigned(client, folds, summarizer, partitions)
            time.sleep(1.0)  # let the last "Worker ready" (table recovery) finish after assignment
            rss_ready = [rss_bytes(w.process.pid) for w in folds]
            log(f"publishing {len(fleet.records)} events")
            agent_before = [agent_seconds(client, w) for w in folds]
            cpu_before = snapshot(pids)
            began = time.perf_counter()
            published = publish_all(bootstrap, topics, fleet, security)
            first = Progress()
        deadline = began + timeout_s
        while time.perf_counter() < deadline:
            for worker in [*folds, summarizer]:
                worker.check_alive()
            state = progress(client, folds)
            if state.done(len(fleet.records)):
                break
            time.sleep(PROGRESS_POLL_S)
        seconds = time.perf_counter() - began
        cpu_after = snapshot(pids)
        agent_after = [agent_seconds(client, w) for w in folds]
        layers = None if recording is None else (recording.stop() or recording.error)
    spent = [used(b, a) for b, a in zip(cpu_before, cpu_after, strict=True)]
    cpu = CpuUse(
        wall=seconds,
        folds=[s or 0.0 for s in spent[:fold_workers]],
        summarizer=spent[fold_workers] or 0.0,
        bench=spent[fold_workers + 1] or 0.0,
        broker=spent[fold_workers + 2] if broker_pid is not None else None,
    )
    rss_done = [rss_bytes(w.process.pid) for w in folds]
    complete = state.done(len(fleet.records))
    events = len(fleet.records) if complete else int(state.folded - state.held)
    events -= int(first.folded)  # from a backlog: those folded before the clock started
    log(
        f"{fold_workers} fold worker(s): {'complete' if complete else 'INCOMPLETE'} "
        f"in {seconds:.1f}s"
    )
    return FoldRun(
        fold_workers,
        seconds,
        published,
        events,
        complete,
        state.per_worker,
        topics,
        folds,
        summarizer,
        app_id,
        tuple(settings),
        rss_ready,
        rss_done,
        cpu,
        backlog,
        [
            {kind: after[kind] - before[kind] for kind in Stopwatch.KINDS}
            for before, after in zip(agent_before, agent_after, strict=True)
        ],
        layers,
    )


def publish_all(bootstrap: str, topics: Topics, fleet: Fleet, security: KafkaSecurity) -> float:
    """Publish the fleet to session-events; the seconds it took."""
    producer = make_producer(bootstrap, security=security)
    try:
        began = time.perf_counter()
        publish(producer, topics.session_events, fleet.records)
        return time.perf_counter() - began
    finally:
        producer.close()


def changelog_topic(app_id: str) -> str:
    """The fold's state table changelog: Faust names it `<app id>-<table>-changelog`."""
    return f"{app_id}-state-changelog"


def raw_consume(
    bootstrap: str,
    topic: str,
    partitions: int,
    decode_values: bool,
    repeat: int = 3,
    security: KafkaSecurity = PLAINTEXT,
) -> float:
    """Events/s of the fastest of `repeat` plain aiokafka reads of the whole topic (no group)."""
    return max(
        asyncio.run(_raw_consume_once(bootstrap, topic, partitions, decode_values, security))
        for _ in range(repeat)
    )


async def _raw_consume_once(
    bootstrap: str, topic: str, partitions: int, decode_values: bool, security: KafkaSecurity
) -> float:
    consumer = clients.async_reader(
        bootstrap, "sessionfold-bench", security, max_partition_fetch_bytes=8 * 1024 * 1024
    )
    await consumer.start()
    try:
        # Assigned, not subscribed: aiokafka knows no topic metadata before it is told a topic.
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        ends = await consumer.end_offsets(assigned)
        remaining = {tp for tp in assigned if ends[tp] > 0}
        count = 0
        began = time.perf_counter()
        while remaining:
            batches = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            for tp, records in batches.items():
                for record in records:
                    if decode_values:
                        decode(record.value)
                count += len(records)
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        return count / (time.perf_counter() - began)
    finally:
        await consumer.stop()


def compare_state(run: FoldRun, fleet: Fleet) -> int:
    """How many sessions the state API reports exactly as the embedded fold does."""
    same = 0
    with httpx.Client() as client:
        for session_id in fleet.sessions:
            document = get_json(client, f"{run.folds[0].url}/sessions/{session_id}")
            if document == fleet.expected[session_id]:
                same += 1
            else:
                log(f"session {session_id} differs from the embedded fold")
    return same


@dataclass
class Recovery:
    """A fold worker SIGKILLed after folding the fleet, and the one started in its place.

    Seconds are counted from the new process's start; None where it never got there.
    """

    sessions: int
    partitions: int
    changelog_records: int  # what a memory:// worker replays: the whole changelog
    ready_s: float | None  # "Worker ready" in its log: the state table recovered
    first_s: float | None  # the first session served as the embedded fold has it
    partitions_s: float | None  # one session of every partition served so
    served_s: float | None  # every session served so
    pass_s: float  # one more pass over every session once served: what the check costs
    served: int
    rss: int  # bytes, once every session was served (or at the deadline)


class LogWatch(threading.Thread):
    """The seconds from `began` until `text` shows in a log file, polled on a thread of its
    own so that a long state check does not delay the reading."""

    def __init__(self, path: Path, text: str, began: float) -> None:
        super().__init__(daemon=True)
        self.path, self.text, self.began = path, text, began
        self.seconds: float | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            if self.text in self.path.read_text(errors="replace"):
                self.seconds = time.perf_counter() - self.began
                return
            self.halt.wait(RECOVERY_POLL_S)


def unserved(
    client: httpx.Client, worker: Worker, pending: Sequence[str], expected: dict[str, Any]
) -> list[str]:
    """The sessions of `pending` not yet served as expected, in order.

    A session not yet served means its partition is still recovering: the round stops there
    rather than asking about every later session, so the poll costs the worker little.
    """
    for i, session_id in enumerate(pending):
        if get_json(client, f"{worker.url}/sessions/{session_id}") != expected[session_id]:
            return list(pending[i:])
    return []


def one_per_partition(sessions: Sequence[str], partitions: int) -> list[str]:
    """The first session of each partition that has any, by Kafka's key partitioner."""
    first: dict[int, str] = {}
    for session_id in sessions:
        first.setdefault(partition_of(session_id, partitions), session_id)
    return list(first.values())


def recover(
    bootstrap: str,
    run: FoldRun,
    fleet: Fleet,
    partitions: int,
    work: Path,
    timeout_s: float,
    started: list[Worker],
    security: KafkaSecurity = PLAINTEXT,
) -> Recovery:
    """SIGKILL the run's only fold worker, start another with the same app id, and time it
    until the state API answers for one session of every partition, then for every session,
    as the embedded fold does.

    The killed worker does not leave its group, so the time includes the group noticing it
    gone (the session timeout) before the partitions move to the new worker. Sessions are
    asked about one at a time, so the last figure includes serving every state document once.
    """
    records = topic_records(bootstrap, changelog_topic(run.app_id), security)
    victim = run.folds[0]
    victim.process.kill()
    victim.process.wait(10)
    fresh = start_worker(bootstrap, run.topics, run.app_id, "fold", partitions, work, run.settings)
    began = time.perf_counter()
    started.append(fresh)
    run.folds[0] = fresh  # so that the caller stops the new one
    watch = LogWatch(fresh.log_path, "Worker ready", began)
    watch.start()
    log(f"recovery: fold worker killed, another started; {records:,} changelog records")
    deadline = began + timeout_s
    sentinels = one_per_partition(fleet.sessions, partitions)
    asked_first = set(sentinels)
    first_s = partitions_s = served_s = None
    pending = list(sentinels)
    with httpx.Client() as client:

        def drain(pending: list[str]) -> tuple[list[str], float | None]:
            nonlocal first_s
            while pending and time.perf_counter() < deadline:
                fresh.check_alive()
                before = len(pending)
                pending = unserved(client, fresh, pending, fleet.expected)
                if first_s is None and len(pending) < before:
                    first_s = time.perf_counter() - began
                if pending:
                    time.sleep(RECOVERY_POLL_S)
            return pending, None if pending else time.perf_counter() - began

        pending, partitions_s = drain(pending)
        rest = [s for s in fleet.sessions if s not in asked_first]
        pending, served_s = drain(pending + rest)
        checked = time.perf_counter()
        unserved(client, fresh, fleet.sessions, fleet.expected)
        pass_s = time.perf_counter() - checked
    watch.halt.set()
    watch.join(5)
    log(f"recovery: {'served' if served_s is not None else 'NOT served'} after restart")
    return Recovery(
        sessions=len(fleet.sessions),
        partitions=len(sentinels),
        changelog_records=records,
        ready_s=watch.seconds,
        first_s=first_s,
        partitions_s=partitions_s,
        served_s=served_s,
        pass_s=pass_s,
        served=len(fleet.sessions) - len(pending),
        rss=rss_bytes(fresh.process.pid),
    )


@dataclass
class FleetCase:
    """One fleet folded by one fold worker and by two, with what the state costs."""

    fleet: Fleet
    turns: int
    one: FoldRun
    two: FoldRun
    same_one: int
    same_two: int
    changelog: ChangelogSizes
    recovery: Recovery | None
    backlog_one: FoldRun | None = None  # the fleet published first, then folded by one worker
    backlog_two: FoldRun | None = None  # ... and by two
    floor: Floor | None = None  # a no-op Faust agent's read of the backlog (bench/faust_floor.py)
    profiled: FoldRun | None = None  # --profile: one more backlog run, py-spy on its worker


def fleet_changelog(
    bootstrap: str, run: FoldRun, fleet: Fleet, security: KafkaSecurity = PLAINTEXT
) -> ChangelogSizes:
    """The sizes of the run's changelog, per session of the fleet."""
    messages = {
        sid: sum(state["counts"]["messages"].values()) for sid, state in fleet.expected.items()
    }
    return changelog_sizes(bootstrap, changelog_topic(run.app_id), messages, security)


@dataclass
class Latency:
    """Publish-to-projection latencies, seconds."""

    samples: list[float]
    events: int
    timed_out: bool

    def quantile(self, q: float) -> float:
        """The q-quantile of the samples, by nearest rank."""
        ordered = sorted(self.samples)
        return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def latency(
    bootstrap: str,
    run: FoldRun,
    work: Path,
    turns: int,
    max_samples: int,
    budget_s: float,
    security: KafkaSecurity = PLAINTEXT,
) -> Latency:
    """Publish a new session one event at a time; for each event that adds a message to the
    branch, poll the state API until the session's message count reflects it.

    The expected count after every event comes from the embedded runtime, so events held by a
    flush barrier are timed until the barrier releases them, as a client would see them.
    """
    entries = generate_session(seed=987_654, turns=turns)
    path = write_session(work, entries).path
    envelopes = [r for r in read_session_file(path) if not isinstance(r, DeadLetter)]
    session_id = envelopes[0].session_id
    runtime = EmbeddedRuntime()
    expected = []
    for envelope in envelopes:
        runtime.publish(envelope)
        expected.append(sum(runtime.session_state(session_id)["counts"]["messages"].values()))
    # No batching delay: each event is sent as soon as it is handed over.
    producer = clients.producer(bootstrap, "sessionfold-bench", security, acks="all", linger_ms=0)
    samples: list[float] = []
    timed_out = False
    url = f"{run.folds[0].url}/sessions/{session_id}"
    deadline = time.monotonic() + budget_s
    sent = 0
    try:
        with httpx.Client() as client:
            previous = 0
            for envelope, count in zip(envelopes, expected, strict=True):
                if len(samples) >= max_samples or time.monotonic() > deadline:
                    break
                began = time.perf_counter()
                producer.send(
                    run.topics.session_events,
                    key=session_id.encode(),
                    value=encode(envelope),
                    timestamp_ms=int(time.time() * 1000),
                )
                producer.flush()
                sent += 1
                if count == previous:
                    continue  # no visible change to wait for (header, model change, ...)
                previous = count
                give_up = time.monotonic() + LATENCY_EVENT_TIMEOUT_S
                while True:
                    document = get_json(client, url)
                    if document and sum(document["counts"]["messages"].values()) >= count:
                        samples.append(time.perf_counter() - began)
                        break
                    if time.monotonic() > give_up:
                        timed_out = True
                        break
                    time.sleep(LATENCY_POLL_S)
                if timed_out:
                    break
    finally:
        producer.close()
    return Latency(samples, sent, timed_out)


# --- the report ---------------------------------------------------------------------------------


def table(rows: Sequence[tuple[str, str, str]]) -> str:
    """Three columns: what (left-aligned), figure (right-aligned), note."""
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for i, row in enumerate(rows):
        lines.append(f"  {row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]}".rstrip())
        if i == 0:
            lines.append("  " + "-" * (sum(widths) + 4))
    return "\n".join(lines)


@dataclass
class Results:
    """Everything one run measured."""

    bootstrap: str
    origin: str
    partitions: int
    main: FleetCase
    off: FoldRun
    raw: float
    raw_decoded: float
    latency: Latency
    case: FleetCase | None  # --fleet-sessions
    sizes: SessionSizes  # embedded state of the main fleet's sessions
    sizes_longer: SessionSizes  # the same sessions at 4x the turns

    @property
    def cases(self) -> list[FleetCase]:
        """The main fleet, and the --fleet-sessions one if run."""
        return [self.main] if self.case is None else [self.main, self.case]

    @property
    def recovery(self) -> Recovery | None:
        """The recovery phase, whichever fleet it ran on."""
        return next((c.recovery for c in self.cases if c.recovery is not None), None)

    @property
    def ok(self) -> bool:
        """Every run complete, every session identical, some latency measured, and a recovery
        that served every session if one was asked for."""
        folded = all(
            c.one.complete
            and c.two.complete
            and c.same_one == c.same_two == len(c.fleet.sessions)
            and (c.recovery is None or c.recovery.served_s is not None)
            for c in self.cases
        )
        return folded and self.off.complete and bool(self.latency.samples)


def run(args: argparse.Namespace, work: Path) -> Results:
    """Every phase, in order; the workers of each phase are stopped before the next starts."""
    workers: list[Worker] = []
    extras: dict[str, Any] = {}
    try:
        with kafka_broker(work) as (bootstrap, origin, security, broker_pid):
            log(f"generating {args.sessions} sessions x {args.turns} turns")
            fleet = make_fleet(work / "main", args.sessions, args.turns, args.seed)
            log(f"state sizes, embedded: {args.turns} and {4 * args.turns} turns")
            sizes = embedded_sizes(fleet.paths)
            longer = write_fleet(work / "longer", args.sessions, 4 * args.turns, args.seed)
            sizes_longer = embedded_sizes(w.path for w in longer)

            def fold(
                target: Fleet,
                count: int,
                settings: Sequence[str] = (),
                backlog: bool = False,
                profile: bool = False,
            ) -> FoldRun:
                return fold_run(
                    bootstrap,
                    target,
                    count,
                    args.partitions,
                    work,
                    args.timeout,
                    workers,
                    settings,
                    security,
                    broker_pid,
                    backlog,
                    profile,
                )

            def stopped(run: FoldRun) -> FoldRun:
                """`run`, its workers stopped: each phase's are gone before the next starts."""
                stop_workers(workers)
                workers.clear()
                return run

            def case(
                target: Fleet,
                turns: int,
                with_recovery: bool,
                on_one: Callable[[FoldRun], None] = lambda _run: None,
                with_backlog: bool = False,
            ) -> FleetCase:
                one = fold(target, 1)
                on_one(one)
                same_one = compare_state(one, target)
                changelog = fleet_changelog(bootstrap, one, target, security)
                recovery = None
                if with_recovery:
                    recovery = recover(
                        bootstrap,
                        one,
                        target,
                        args.partitions,
                        work,
                        args.timeout,
                        workers,
                        security,
                    )
                stop_workers(workers)
                workers.clear()
                two = fold(target, 2)
                same_two = compare_state(two, target)  # any worker answers: routed by key
                stop_workers(workers)
                workers.clear()
                case = FleetCase(target, turns, one, two, same_one, same_two, changelog, recovery)
                if with_backlog:
                    case.backlog_one = stopped(fold(target, 1, backlog=True))
                    case.backlog_two = stopped(fold(target, 2, backlog=True))
                    log("Faust's floor: a no-op agent reading the same backlog")
                    source = case.backlog_one.topics.session_events
                    case.floor = floor(bootstrap, source, len(target.records), args.partitions)
                    if args.profile:
                        log("1 fold worker from a backlog again, sampled by py-spy")
                        case.profiled = stopped(fold(target, 1, backlog=True, profile=True))
                return case

            def raw_and_latency(one: FoldRun) -> None:
                log("raw aiokafka consume of the same topic")
                source = one.topics.session_events
                for decoded in (False, True):
                    extras[f"raw{decoded}"] = raw_consume(
                        bootstrap, source, args.partitions, decoded, security=security
                    )
                log("latency: single events, state API polled")
                extras["latency"] = latency(
                    bootstrap,
                    one,
                    work,
                    args.turns,
                    args.latency_samples,
                    args.latency_seconds,
                    security,
                )

            main = case(
                fleet, args.turns, args.recovery and not args.fleet_sessions, raw_and_latency
            )
            off = stopped(fold(fleet, 1, PRUNING_OFF))

            extra = None
            if args.fleet_sessions:
                log(f"fleet case: {args.fleet_sessions} sessions x {args.fleet_turns} turns")
                target = make_fleet(
                    work / "case", args.fleet_sessions, args.fleet_turns, args.seed + 1
                )
                extra = case(target, args.fleet_turns, args.recovery, with_backlog=True)
    finally:
        stop_workers(workers)
    return Results(
        bootstrap,
        origin,
        args.partitions,
        main,
        off,
        extras["rawFalse"],
        extras["rawTrue"],
        extras["latency"],
        extra,
        sizes,
        sizes_longer,
    )


def _fold_note(run: FoldRun, events: int) -> str:
    if run.backlog:
        note = f"assigned and folding to complete, {run.seconds:.1f}s; published before"
    else:
        note = f"publish to complete, {run.seconds:.1f}s"
    return note if run.complete else f"{note} (INCOMPLETE: {run.events}/{events} events)"


def backlog_rows(case: FleetCase) -> list[tuple[str, str, str]]:
    """The fold draining the fleet published beforehand: one worker and two, no publisher
    sharing the CPUs (the same targets: one worker against the embedded fold, two against one)."""
    fleet = case.fleet
    events = len(fleet.records)
    embedded = events / fleet.embedded_seconds
    one, two = case.backlog_one, case.backlog_two
    if one is None or two is None:
        return []
    return [
        ("Faust fold from a backlog, 1 worker", f"{one.rate:,.0f} ev/s", _fold_note(one, events)),
        per_worker_row(one, embedded),
        *cpu_rows(one, fleet),
        *floor_rows(case.floor, fleet),
        *layer_rows(case.profiled, fleet),
        ("Faust fold from a backlog, 2 workers", f"{two.rate:,.0f} ev/s", _fold_note(two, events)),
        per_worker_row(two, embedded),
        *cpu_rows(two, fleet),
        scaling_row(one, two),
    ]


def verdict(met: bool) -> str:
    """How a figure stands against its target."""
    return "met" if met else "NOT met"


def megabytes(count: float) -> str:
    """Bytes as MB, one decimal."""
    return f"{count / 1e6:,.1f} MB"


def per_worker_row(run: FoldRun, embedded: float) -> tuple[str, str, str]:
    """Issue #13 item 1: what one fold worker of `run` folds against the embedded fold."""
    ratio = run.rate / run.fold_workers / embedded if embedded else 0.0
    what = "  / embedded fold" if run.fold_workers == 1 else "  per worker / embedded fold"
    target = f"target >= {PER_WORKER_TARGET}: {verdict(ratio >= PER_WORKER_TARGET)}"
    return (what, f"{ratio:.3f}", f"{target}; {FILED_PER_WORKER} when issue #13 was filed")


def scaling_row(one: FoldRun, two: FoldRun) -> tuple[str, str, str]:
    """Issue #13 item 1: two fold workers against one, on the same fleet."""
    scaling = two.rate / one.rate if one.rate else 0.0
    per_worker = " / ".join(f"{n:,.0f}" for n in two.per_worker)
    return (
        "  2 workers / 1 worker",
        f"{scaling:.2f}x",
        f"target >= {SCALING_TARGET}x: {verdict(scaling >= SCALING_TARGET)}; "
        f"{FILED_SCALING}x when issue #13 was filed; events per worker: {per_worker}",
    )


def embedded_us(fleet: Fleet) -> float:
    """The embedded fold's CPU microseconds per event (process time, pruning on)."""
    return fleet.embedded_cpu_seconds * 1e6 / len(fleet.records) if fleet.records else 0.0


def budget_us(fleet: Fleet) -> float:
    """The CPU microseconds per event a worker may spend at the per-worker target: at 100% CPU
    it reaches 0.8 of the embedded fold only if an event costs it at most 1/0.8 of the fold's."""
    return embedded_us(fleet) / PER_WORKER_TARGET


def runtime_us(fleet: Fleet) -> float:
    """FoldRuntime's CPU microseconds per event over an in-memory table (no Kafka)."""
    return fleet.runtime_cpu_seconds * 1e6 / len(fleet.records) if fleet.records else 0.0


def cpu_rows(run: FoldRun, fleet: Fleet) -> list[tuple[str, str, str]]:
    """Where one Faust fold run's CPU went: each fold worker's utilisation, its CPU cost per
    event next to the embedded fold's, and the CPUs the whole pipeline kept busy."""
    cpu = run.cpu
    shares = " / ".join(f"{u:.0%}" for u in cpu.utilisation())
    cost, embedded = cpu.fold_us_per_event(run.events), embedded_us(fleet)
    broker_s = "not measured" if cpu.broker is None else f"{cpu.broker:.1f}"
    return [
        (
            "  fold worker CPU / wall",
            f"{max(cpu.utilisation(), default=0.0):.0%}",
            f"busiest; per worker {shares}; {sum(cpu.folds):.1f} CPU s in {cpu.wall:.1f} s",
        ),
        (
            "  fold worker CPU per event",
            f"{cost:,.0f} us",
            f"embedded fold (process time, pruning on): {embedded:,.0f} us/event; "
            f"{cost / embedded if embedded else 0.0:.1f}x",
        ),
        (
            "    of which the fold runtime",
            f"{runtime_us(fleet):,.0f} us",
            "FoldRuntime over an in-memory table, no Kafka (bench/runtime_layer.py): the fold, "
            "its batches, journals and encoded rows; the rest is Faust's and aiokafka's path",
        ),
        (
            "  fold agent's time",
            agent_split(run),
            "sessionfold_fold_agent_seconds_total over the run, busiest worker: what a worker "
            "below 100% CPU waits for (records: the fetch and the loop's other tasks)",
        ),
        (
            "  pipeline CPU used",
            f"{cpu.cpus_used:.2f} of {os.cpu_count()} CPUs",
            f"CPU s: fold {sum(cpu.folds):.1f}, summarizer {cpu.summarizer:.1f}, "
            f"broker {broker_s}, bench {cpu.bench:.1f} (a shared broker counts others' load too)",
        ),
    ]


def floor_rows(least: Floor | None, fleet: Fleet) -> list[tuple[str, str, str]]:
    """Faust's floor per event, and with the fold runtime, next to the per-worker budget."""
    if least is None:
        return [("    of which Faust's floor", "not measured", "bench/faust_floor.py failed")]
    embedded, runtime, budget = embedded_us(fleet), runtime_us(fleet), budget_us(fleet)
    both = least.us_per_record + runtime
    return [
        (
            "    of which Faust's floor",
            f"{least.us_per_record:,.0f} us",
            f"a no-op agent reading the same topic (bench/faust_floor.py), "
            f"{least.rate:,.0f} records/s: no fold, store or producer",
        ),
        (
            f"  CPU budget per event at {PER_WORKER_TARGET}",
            f"{budget:,.0f} us",
            f"1/{PER_WORKER_TARGET} of the embedded fold's {embedded:,.0f} us; Faust's floor + "
            f"the fold runtime = {both:,.0f} us ({both / budget:.0%} of it) before the producer",
        ),
    ]


def layer_rows(run: FoldRun | None, fleet: Fleet) -> list[tuple[str, str, str]]:
    """The --profile run: its worker's main thread by layer, its other busy time against the
    pure fold's (which the embedded fold spends too), and what the per-worker target allows."""
    if run is None:
        return []
    layers = run.layers
    if not isinstance(layers, Layers):
        return [("    main thread by layer", "not measured", str(layers))]
    fold_us, budget = layers.fold_us(run.cpu.fold_us_per_event(run.events)), budget_us(fleet)
    allowed = budget / fold_us - 1.0 if fold_us else 0.0
    return [
        (
            "    main thread by layer (py-spy)",
            f"{layers.samples:,} samples",
            f"another backlog run, {run.rate:,.0f} ev/s sampled: {layers.line()}",
        ),
        (
            "    beside the pure fold",
            f"{layers.rest_per_fold:.1f}x",
            f"the main thread's other busy time per unit of pure fold (bench/worker_layers.py); "
            f"{PER_WORKER_TARGET} allows {allowed:.1f}x: {budget:,.0f} us per event, of which "
            f"the pure fold takes about {fold_us:,.0f}",
        ),
    ]


def agent_split(run: FoldRun) -> str:
    """The busiest fold worker's agent time as shares: folding / awaiting commit / records."""
    if not run.agent:
        return "not measured"
    busiest = max(run.agent, key=lambda kinds: kinds["folding"])
    total = sum(busiest.values())
    if total <= 0:
        return "not measured"
    share = {kind: seconds / total for kind, seconds in busiest.items()}
    return (
        f"{share['folding']:.0%} fold / {share['awaiting_commit']:.0%} commit / "
        f"{share['awaiting_records']:.0%} await"
    )


def bind(run: FoldRun, fleet: Fleet) -> str:
    """What limits `run`, derived from its CPU figures; with how long the events took to arrive,
    and one worker's ceiling if its CPU per event alone keeps it under the per-worker target."""
    cpu, embedded = run.cpu, embedded_us(fleet)
    clause = binding_limit(cpu, run.events, embedded, os.cpu_count() or 1)
    if not run.backlog:
        clause += f"; the publish took {run.publish_seconds:.1f} of its {run.seconds:.1f} s"
    if run.agent:
        clause += f"; its agent's time: {agent_split(run)}"
    cost = cpu.fold_us_per_event(run.events)
    ceiling = embedded / cost if cost else 0.0
    if ceiling < PER_WORKER_TARGET:
        clause += f"; at 100% CPU a worker would reach {ceiling:.2f} of the embedded fold"
    return clause


def bind_rows(case: FleetCase, label: str, raw: float | None) -> list[tuple[str, str, str]]:
    """One row per NOT met fold target of `case` (and of the raw-consume ratio if `raw`),
    saying which limit binds."""
    fleet = case.fleet
    embedded = len(fleet.records) / fleet.embedded_seconds
    rows = []
    if raw and case.one.rate / raw < 0.5:
        rows.append((f"{label}: 1 worker / raw consume", "NOT met", bind(case.one, fleet)))
    for one, two in ((case.one, case.two), (case.backlog_one, case.backlog_two)):
        if one is None or two is None:
            continue
        source = ", from a backlog" if one.backlog else ""
        for run in (one, two):
            if run.rate / run.fold_workers / embedded < PER_WORKER_TARGET:
                workers = "1 worker" if run.fold_workers == 1 else f"{run.fold_workers} workers"
                what = f"{label}{source}: {workers} / embedded fold"
                rows.append((what, "NOT met", bind(run, fleet)))
        if one.rate and two.rate / one.rate < SCALING_TARGET:
            rows.append((f"{label}{source}: 2 workers / 1", "NOT met", bind(two, fleet)))
    return rows


def fleet_rows(case: FleetCase) -> list[tuple[str, str, str]]:
    """The --fleet-sessions case: its fold rates, scaling and state check."""
    fleet = case.fleet
    events = len(fleet.records)
    sessions = len(fleet.sessions)
    embedded = events / fleet.embedded_seconds
    one, two = case.one, case.two
    title = f"fleet case: {sessions:,} sessions x {case.turns} turns, {events:,} events"
    return [
        (title, "", f"{fleet.megabytes:.1f} MB"),
        ("embedded fold of the same files", f"{embedded:,.0f} ev/s", "no Kafka"),
        ("Faust fold, 1 fold worker", f"{one.rate:,.0f} ev/s", _fold_note(one, events)),
        per_worker_row(one, embedded),
        *cpu_rows(one, fleet),
        ("Faust fold, 2 fold workers", f"{two.rate:,.0f} ev/s", _fold_note(two, events)),
        per_worker_row(two, embedded),
        *cpu_rows(two, fleet),
        scaling_row(one, two),
        *backlog_rows(case),
        (
            "state API = embedded fold, 1 / 2 workers",
            f"{case.same_one}/{case.same_two}",
            f"of {sessions:,} sessions identical",
        ),
    ]


def length_rows(
    short: SessionSizes, longer: SessionSizes, turns: int
) -> list[tuple[str, str, str]]:
    """Embedded state per session at two session lengths, and per message at each."""
    growth = longer.per_message / short.per_message if short.per_message else 0.0
    return [
        (
            f"state per session, embedded, {turns} turns",
            f"{short.mean:,.0f} B",
            f"mean; max {short.max:,} B; canonical JSON of the DictStore rows",
        ),
        (
            f"state per session, embedded, {4 * turns} turns",
            f"{longer.mean:,.0f} B",
            f"mean; max {longer.max:,} B",
        ),
        (
            "  per branch message, 4x turns / 1x",
            f"{growth:.2f}x",
            f"{short.per_message:,.0f} B -> {longer.per_message:,.0f} B; target <= "
            f"{GROWTH_TARGET}x (no more than linear in messages): "
            f"{verdict(growth <= GROWTH_TARGET)}",
        ),
    ]


def memory_rows(case: FleetCase) -> list[tuple[str, str, str]]:
    """Issue #13 item 4 on one fleet: its changelog per session and a fold worker's RSS."""
    sessions = len(case.fleet.sessions)
    sizes = case.changelog
    ready, done = case.one.rss_ready[0], case.one.rss_done[0]
    return [
        (
            f"changelog, {sessions:,} sessions: every write",
            megabytes(sizes.total_bytes),
            f"{sizes.records:,} records; per session mean {sizes.written.mean:,.0f} B, "
            f"max {sizes.written.max:,} B",
        ),
        (
            "  last value per key (live state)",
            f"{sizes.live.mean:,.0f} B",
            f"per session mean; max {sizes.live.max:,} B",
        ),
        (
            f"fold worker RSS, {sessions:,} sessions folded",
            megabytes(done),
            f"VmRSS, 1 worker; {megabytes(ready)} assigned and idle, before the publish",
        ),
        (
            "  RSS added per 1,000 sessions",
            megabytes((done - ready) * 1000 / sessions),
            f"(folded - idle) x 1,000 / {sessions:,}; no target set",
        ),
    ]


def recovery_rows(recovery: Recovery) -> list[tuple[str, str, str]]:
    """Issue #13 item 2: a SIGKILLed fold worker's replacement serving again."""

    def seconds(value: float | None) -> str:
        return "never" if value is None else f"{value:.1f} s"

    def against_target(value: float | None) -> str:
        met = value is not None and value <= RECOVERY_TARGET_S
        return (
            f"target <= {RECOVERY_TARGET_S:.0f} s: {verdict(met)}; "
            f"{FILED_RECOVERY_S:.0f} s for 200 sessions when issue #13 was filed"
        )

    sessions = recovery.sessions
    return [
        (f"recovery, {sessions:,} sessions, 1 fold worker", "", "SIGKILL, then a new one"),
        (
            "  restart to the first session served",
            seconds(recovery.first_s),
            "as the embedded fold has it; includes the group dropping the killed member "
            "(session timeout 6 s)",
        ),
        (
            f"  restart to one session of each of {recovery.partitions} partitions",
            seconds(recovery.partitions_s),
            against_target(recovery.partitions_s),
        ),
        (
            '  restart to "Worker ready" in its log',
            seconds(recovery.ready_s),
            "Faust: every table recovered from its changelog",
        ),
        (
            "  restart to every session served",
            seconds(recovery.served_s),
            f"{against_target(recovery.served_s)}; {recovery.served:,}/{sessions:,} equal to the "
            "embedded fold, asked one by one",
        ),
        (
            "  one more pass over every session",
            seconds(recovery.pass_s),
            "what asking for every state document costs, part of the figure above",
        ),
        (
            "  changelog records replayed",
            f"{recovery.changelog_records:,}",
            "memory:// store: the whole changelog, as it stood at the kill",
        ),
        ("  RSS of the recovered worker", megabytes(recovery.rss), "VmRSS once serving"),
    ]


def report(results: Results) -> str:
    """The results table, with a two-line header."""
    main = results.main
    fleet = main.fleet
    events = len(fleet.records)
    sessions = len(fleet.sessions)
    embedded = events / fleet.embedded_seconds
    embedded_off = events / fleet.embedded_off_seconds
    one, two, off, lat = main.one, main.two, results.off, results.latency
    ratio = one.rate / results.raw if results.raw else 0.0
    rows = [
        ("measure", "figure", "note"),
        (
            "raw aiokafka consume of session-events",
            f"{results.raw:,.0f} ev/s",
            "best of 3 whole-topic reads, assigned partitions, no group",
        ),
        (
            "raw aiokafka consume + envelope decode",
            f"{results.raw_decoded:,.0f} ev/s",
            "pydantic validation of every envelope",
        ),
        (
            "embedded fold of the same files",
            f"{embedded:,.0f} ev/s",
            "no Kafka: the fold's own ceiling here",
        ),
        ("Faust fold, 1 fold worker", f"{one.rate:,.0f} ev/s", _fold_note(one, events)),
        (
            "  / raw aiokafka consume",
            f"{ratio:.3f}",
            "target >= 0.5: " + verdict(ratio >= 0.5),
        ),
        per_worker_row(one, embedded),
        *cpu_rows(one, fleet),
        ("Faust fold, 2 fold workers", f"{two.rate:,.0f} ev/s", _fold_note(two, events)),
        per_worker_row(two, embedded),
        *cpu_rows(two, fleet),
        scaling_row(one, two),
        (
            "Faust fold, 1 worker, pruning off",
            f"{off.rate:,.0f} ev/s",
            _fold_note(off, events) + "; no flush barrier",
        ),
        *cpu_rows(off, fleet),
        (
            "  / embedded fold, pruning off",
            f"{off.rate / embedded_off:.3f}",
            f"embedded, pruning off: {embedded_off:,.0f} ev/s",
        ),
        (
            "publish (kafka-python, acks=all)",
            f"{events / one.publish_seconds:,.0f} ev/s",
            "sessionfold publish's producer settings",
        ),
    ]
    if lat.samples:
        timed_out = " (an event TIMED OUT)" if lat.timed_out else ""
        rows += [
            (
                "publish-to-projection latency p50",
                f"{lat.quantile(0.5) * 1000:,.1f} ms",
                f"{len(lat.samples)} timed events of {lat.events} sent{timed_out}",
            ),
            (
                "publish-to-projection latency p99",
                f"{lat.quantile(0.99) * 1000:,.1f} ms",
                f"max {max(lat.samples) * 1000:,.1f} ms; poll every {LATENCY_POLL_S * 1000:.0f} ms",
            ),
        ]
    else:
        rows.append(("publish-to-projection latency", "n/a", "no event reached the state API"))
    rows += [
        (
            "state API = embedded fold, 1 worker",
            f"{main.same_one}/{sessions}",
            "sessions identical",
        ),
        (
            "state API = embedded fold, 2 workers",
            f"{main.same_two}/{sessions}",
            "sessions identical",
        ),
    ]
    if results.case is not None:
        rows += fleet_rows(results.case)
    rows.append(("state and memory", "", ""))
    rows += length_rows(results.sizes, results.sizes_longer, main.turns)
    # The largest fleet only: RSS extrapolated to 1,000 sessions from a few is noise.
    rows += memory_rows(results.cases[-1])
    if results.recovery is not None:
        rows += recovery_rows(results.recovery)
    binds = bind_rows(main, "main fleet", results.raw)
    if results.case is not None:
        binds += bind_rows(results.case, f"fleet case ({len(results.case.fleet.sessions):,})", None)
    if binds:
        rows.append(("what binds, per target NOT met", "", "derived from the CPU figures above"))
        rows += binds
    header = (
        f"sessionfold Kafka pipeline: broker {results.bootstrap} ({results.origin}), "
        f"{results.partitions} partitions, {os.cpu_count()} CPUs\n"
        f"fleet: {sessions} sessions x {main.turns} turns, {events:,} events, "
        f"{fleet.megabytes:.1f} MB; summarizer: the offline port, in its own worker"
    )
    return f"{header}\n{table(rows)}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run every phase and print the table; 0 if every phase completed and matched, else 1."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=16, help="sessions in the fleet")
    parser.add_argument("--turns", type=int, default=80, help="assistant messages per session")
    parser.add_argument("--seed", type=int, default=42, help="fleet seed")
    parser.add_argument("--partitions", type=int, default=4, help="partitions (>= 2)")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per fold run")
    parser.add_argument("--latency-samples", type=int, default=150, help="timed events, at most")
    parser.add_argument("--latency-seconds", type=float, default=45.0, help="latency budget")
    parser.add_argument(
        "--fleet-sessions",
        type=int,
        default=0,
        help="also fold a fleet of this many sessions with 1 and 2 fold workers (e.g. 1000)",
    )
    parser.add_argument(
        "--fleet-turns", type=int, default=8, help="assistant messages per --fleet-sessions session"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="with --fleet-sessions, one more backlog run with py-spy sampling its fold worker: "
        "the worker's main thread by layer",
    )
    parser.add_argument(
        "--recovery",
        action="store_true",
        help="SIGKILL the fold worker once the fleet (--fleet-sessions if given) is folded, "
        "restart it, and time it until it serves every session",
    )
    args = parser.parse_args(argv)
    if args.partitions < 2:
        parser.error("--partitions must be at least 2 (one worker against two)")
    if args.profile and not args.fleet_sessions:
        parser.error("--profile samples a --fleet-sessions backlog run: give --fleet-sessions N")
    work = Path(tempfile.mkdtemp(prefix="sessionfold-bench-"))
    try:
        results = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(report(results))
    return 0 if results.ok else 1


if __name__ == "__main__":
    sys.exit(main())
