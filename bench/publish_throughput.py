"""`sessionfold publish` against the embedded fold of the same files, side by side in one run.

    .venv/bin/python bench/publish_throughput.py [--sessions 1000] [--turns 8] [--seed 1]
        [--partitions 4] [--repeat 3] [--no-cli]

A generated fleet (`sessionfold generate`'s sessions) is published to fresh topics and folded by
the embedded runtime, `--repeat` times, each publish next to a fold:

- The commands as a user runs them: `sessionfold publish DIR` (a fresh topic prefix and state
  file each time) and `sessionfold fold DIR`, each a subprocess timed wall clock to its exit.
- The same in this process, without the command's start-up: `publish_paths` through the CLI's
  producer, read-back and world settings, and `fold_files`. Its run also gives where the
  publisher's time went per file (`PublishStats`): checkpoint writes, drains (waits until
  everything sent is acknowledged), slices blocked on an acknowledgement, world probes and
  read-backs; and from the producer's own metrics, produce requests and records per request,
  next to how many requests it may keep in flight per connection.

Each line is records/s (the records the files hold: envelopes, placeholders, dead letters, the
same count for both) and publish / fold; the target is publish >= the fold (ratio >= 1.0). The
summary is the median of the repeats. Uses the broker at SESSIONFOLD_BOOTSTRAP when it answers,
else starts one like bench/kafka_pipeline.py does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

from kafka_pipeline import kafka_broker, log

from sessionfold.streams.kafka import clients
from sessionfold.streams.kafka.security import KafkaSecurity
from sessionfold.streams.kafka.topics import Topics, ensure_topics
from sessionfold.streams.publishing.publisher import (
    Checkpoints,
    Publisher,
    PublishStats,
    TopicLog,
    make_producer,
    publish_paths,
)
from sessionfold.streams.publishing.session_file import read_session_file
from sessionfold.streams.runtime.embedded import fold_files
from sessionfold.streams.tools.synthetic import write_fleet

#: Publish / embedded fold of the same files (issue #26: publishing must keep up with the fold).
TARGET = 1.0
#: What issue #26 measured: 1,000 sessions published in 24.4 s, folded embedded in 6.4 s.
FILED_RATIO = 6.4 / 24.4


@dataclass
class Pair:
    """One publish and one embedded fold of the same files, in seconds."""

    publish_s: float
    fold_s: float

    def ratio(self) -> float:
        """Publish's rate over the fold's (the fold's seconds over publish's)."""
        return self.fold_s / self.publish_s


@dataclass
class Breakdown:
    """Where one in-process publish run's time went."""

    stats: PublishStats
    records_per_request: float  # the producer's average over its last samples (30 s each)
    request_ms: float  # a produce request's round trip, averaged the same way
    in_flight: int  # requests the producer may keep in flight per connection


def cli(*args: str) -> float:
    """Run `sessionfold ARGS`, output discarded; its wall-clock seconds (raises on failure)."""
    argv = [sys.executable, "-m", "sessionfold.streams.cli", *args]
    started = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace")[-500:]
        raise RuntimeError(f"sessionfold {args[0]} exited {done.returncode}: {tail}")
    return seconds


def cli_pair(bootstrap: str, fleet: Path, work: Path, partitions: int, made: list[Topics]) -> Pair:
    """`sessionfold publish DIR` to fresh topics (added to `made`), then `sessionfold fold DIR`."""
    prefix = f"benchpub{uuid4().hex[:8]}."
    made.append(Topics(prefix))
    state = work / f"state-{prefix}json"
    publish_s = cli(
        "publish", str(fleet), "--bootstrap", bootstrap, "--topic-prefix", prefix,
        "--partitions", str(partitions), "--state-file", str(state),
    )  # fmt: skip
    return Pair(publish_s, cli("fold", str(fleet)))


def metric(metrics: dict[str, dict[str, Any]], group: str, name: str) -> float:
    """One of the producer's metrics (0 when it has none by that name)."""
    value = metrics.get(group, {}).get(name, 0.0)
    return float(value) if isinstance(value, int | float) else 0.0


def in_process_pair(
    bootstrap: str,
    security: KafkaSecurity,
    fleet: Path,
    work: Path,
    partitions: int,
    made: list[Topics],
) -> tuple[Pair, Breakdown]:
    """`publish_paths` as the command runs it (world and read-back on), then `fold_files`."""
    topics = Topics(f"benchpub{uuid4().hex[:8]}.")
    made.append(topics)
    ensure_topics(bootstrap, topics, partitions, security=security)
    producer = make_producer(bootstrap, security=security)
    topic_log = TopicLog(bootstrap, security)
    checkpoints = Checkpoints(work / f"state-{topics.prefix}json")
    publisher = Publisher(producer, topics, checkpoints, topic_log=topic_log)
    started = time.perf_counter()
    publish_paths(publisher, [fleet])
    publish_s = time.perf_counter() - started
    metrics = producer.metrics() or {}
    breakdown = Breakdown(
        stats=publisher.stats,
        records_per_request=metric(metrics, "producer-metrics", "records-per-request-avg"),
        request_ms=metric(metrics, "producer-metrics", "request-latency-avg"),
        in_flight=int(producer.config["max_in_flight_requests_per_connection"]),
    )
    topic_log.close()
    producer.close()
    started = time.perf_counter()
    fold_files(sorted(fleet.glob("*.jsonl")))
    return Pair(publish_s, time.perf_counter() - started), breakdown


def rates(pair: Pair, records: int) -> str:
    """One pair as records/s of each and their ratio."""
    publish_rate, fold_rate = records / pair.publish_s, records / pair.fold_s
    return (
        f"publish {publish_rate:8,.0f} records/s ({pair.publish_s:5.1f} s)   "
        f"fold {fold_rate:8,.0f} records/s ({pair.fold_s:5.1f} s)   "
        f"publish/fold {pair.ratio():.2f}"
    )


def median_line(pairs: list[Pair], records: int) -> tuple[str, float]:
    """The median seconds of each side, and the median of the pairs' ratios (each pair ran
    side by side, so its ratio is steadier than the ratio of the medians on a busy machine)."""
    middle = Pair(
        statistics.median(p.publish_s for p in pairs), statistics.median(p.fold_s for p in pairs)
    )
    ratio = statistics.median(p.ratio() for p in pairs)
    text = rates(middle, records).rsplit("publish/fold", 1)[0]
    return f"median: {text}publish/fold {ratio:.2f} (median of the pairs)", ratio


def verdict(ratio: float) -> str:
    """The target's line: met or NOT met, next to what the issue measured."""
    met = "met" if ratio >= TARGET else "NOT met"
    return f"target publish/fold >= {TARGET:.1f}: {met} (issue #26 measured {FILED_RATIO:.2f})"


def print_breakdown(runs: list[tuple[Pair, Breakdown]], files: int, records: int) -> None:
    """Per file, the median over the runs of each cost the publisher pays besides sending."""

    def per_file(get: Any) -> float:
        return statistics.median(get(b) for _p, b in runs) / files

    def share(get: Any) -> float:
        return statistics.median(get(b) / p.publish_s for p, b in runs)

    ms = 1000.0
    print(f"per file ({files} files, {records / files:.1f} records each; medians of the runs):")
    rows = [
        ("checkpoint writes", "checkpoint_writes", "checkpoint_seconds"),
        ("drains (all sent acknowledged)", "drains", None),
        ("blocked on an acknowledgement", "ack_waits", "ack_wait_seconds"),
        ("world probes", "world_probes", "world_seconds"),
        ("read-backs", "read_backs", "read_back_seconds"),
    ]
    for label, count, seconds in rows:
        line = f"  {label:32} {per_file(lambda b, c=count: getattr(b.stats, c)):6.2f}"
        if seconds is not None:
            taken = per_file(lambda b, s=seconds: getattr(b.stats, s)) * ms
            part = share(lambda b, s=seconds: getattr(b.stats, s))
            line += f"   {taken:6.2f} ms   {part:5.1%} of publish"
        print(line)
    per_request = statistics.median(b.records_per_request for _p, b in runs)
    request_ms = statistics.median(b.request_ms for _p, b in runs)
    requests = records / files / per_request if per_request else 0.0
    in_flight = runs[0][1].in_flight
    print(
        f"  {'produce requests':32} {requests:6.2f}   {request_ms:6.2f} ms round trip, "
        f"{per_request:.1f} records each, at most {in_flight} in flight per connection"
    )


def drop_topics(bootstrap: str, security: KafkaSecurity, made: list[Topics]) -> None:
    """Delete the topics the runs created: the broker may be shared, and they are large."""
    admin = clients.admin(bootstrap, "sessionfold-bench-publish", security)
    try:
        existing = set(admin.list_topics())
        names = [name for topics in made for name in topics.all() if name in existing]
        if names:
            admin.delete_topics(names)
    finally:
        admin.close()


def main() -> None:
    """Generate the fleet, time the pairs, print the rates, the ratio and the breakdown."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-cli", action="store_true", help="Skip the subprocess pairs.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as tmp:
        work = Path(tmp)
        with kafka_broker(work) as (bootstrap, origin, security, _pid):
            os.environ["SESSIONFOLD_BOOTSTRAP"] = bootstrap  # the subprocesses' broker
            fleet = work / "fleet"
            log(f"generating {args.sessions} sessions x {args.turns} turns")
            write_fleet(fleet, sessions=args.sessions, turns=args.turns, seed=args.seed)
            paths = sorted(fleet.glob("*.jsonl"))
            records = sum(1 for path in paths for _ in read_session_file(path))
            cli_pairs: list[Pair] = []
            runs: list[tuple[Pair, Breakdown]] = []
            made: list[Topics] = []
            try:
                for n in range(args.repeat):
                    if not args.no_cli:
                        log(f"run {n + 1}/{args.repeat}: sessionfold publish, sessionfold fold")
                        cli_pairs.append(cli_pair(bootstrap, fleet, work, args.partitions, made))
                    log(f"run {n + 1}/{args.repeat}: publish_paths, fold_files")
                    pair = in_process_pair(bootstrap, security, fleet, work, args.partitions, made)
                    runs.append(pair)
            finally:
                drop_topics(bootstrap, security, made)
            print(f"broker {bootstrap} ({origin}), {args.partitions} partitions")
            print(f"fleet: {len(paths)} files, {records} records, seed {args.seed}")
            if cli_pairs:
                print("sessionfold publish DIR / sessionfold fold DIR (subprocesses, wall clock):")
                for pair in cli_pairs:
                    print(f"  {rates(pair, records)}")
                text, ratio = median_line(cli_pairs, records)
                print(f"  {text}\n  {verdict(ratio)}")
            print("publish_paths / fold_files (in this process, no start-up):")
            for pair, _breakdown in runs:
                print(f"  {rates(pair, records)}")
            text, ratio = median_line([pair for pair, _b in runs], records)
            print(f"  {text}\n  {verdict(ratio)}")
            print_breakdown(runs, len(paths), records)


if __name__ == "__main__":
    main()
