"""Faust's floor: the CPU a Faust agent that does nothing spends per record (a bench helper).

    .venv/bin/python bench/faust_floor.py --bootstrap HOST:PORT --topic NAME --records N
        [--partitions 4] [--out FILE]

Runs one Faust app with a fold worker's consumer settings (`faust_options`, the shortened fetch
wait) and one agent that reads `topic` from its start and drops every record unacknowledged, as
the fold agent reads its input (`noack`). From the first record to the `records`-th it times the
wall clock and the process's CPU (every thread: the consumer thread's fetches too), then writes
one JSON line, {"records", "seconds", "cpu_seconds"}, to `--out` (else to stdout) and exits.

What it costs per record is the least any fold over Faust's per-record stream can cost, with no
fold, no store and no producer: bench/kafka_pipeline.py sets it against the budget of the
per-worker target. `floor(...)` runs it as a subprocess (a Faust worker owns its process).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

import faust
import orjson

from sessionfold.streams.kafka.security import security_from_env
from sessionfold.streams.worker.app import WorkerSettings, faust_options, shorten_fetch_wait

#: Longest the subprocess may take: joining the group, then reading the topic.
TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Floor:
    """A no-op Faust agent's read of a topic."""

    records: int
    seconds: float
    cpu_seconds: float

    @property
    def us_per_record(self) -> float:
        """CPU microseconds per record."""
        return self.cpu_seconds * 1e6 / self.records if self.records else 0.0

    @property
    def rate(self) -> float:
        """Records per second of wall clock."""
        return self.records / self.seconds if self.seconds else 0.0


def floor(bootstrap: str, topic: str, records: int, partitions: int) -> Floor | None:
    """Run this script on `topic` (which holds at least `records` records); None if it fails.

    The subprocess inherits the environment, so the SESSIONFOLD_SECURITY_PROTOCOL and
    SESSIONFOLD_SSL_* / SASL_* settings reach its consumer as they reach the workers'.
    """
    with tempfile.TemporaryDirectory(prefix="faust-floor-") as work:
        out = Path(work) / "floor.json"
        argv = [sys.executable, __file__, "--bootstrap", bootstrap, "--topic", topic]
        argv += ["--records", str(records), "--partitions", str(partitions), "--out", str(out)]
        try:
            # Faust's worker draws a spinner on stdout: the figures come through the file.
            subprocess.run(argv, capture_output=True, timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return None
        return Floor(**orjson.loads(out.read_bytes())) if out.exists() else None


def _app(bootstrap: str, partitions: int, data_dir: Path) -> faust.App:
    settings = WorkerSettings(
        bootstrap=bootstrap,
        security=security_from_env(),
        partitions=partitions,
        app_id=f"faust-floor-{uuid4().hex[:8]}",
        role="fold",
        data_dir=data_dir,
    )
    options: dict[str, Any] = faust_options(settings)
    options["web_enabled"] = False
    app = faust.App(settings.faust_id, **options)

    async def tune_consumer() -> None:
        await shorten_fetch_wait(app, settings.fetch_wait_s)

    app.task(tune_consumer)
    return app


def main() -> None:
    """Read the topic with a no-op agent, write the JSON line, exit."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--out", type=Path, help="where to write the JSON line")
    args = parser.parse_args()
    # Beside --out, the caller's temporary directory removes it (this process ends in _exit).
    data_dir = args.out.parent / "faust" if args.out else Path(tempfile.mkdtemp(prefix="floor-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    app = _app(args.bootstrap, args.partitions, data_dir)
    topic = app.topic(args.topic, key_type=bytes, value_type=bytes)
    seen = 0
    began = began_cpu = 0.0

    async def read(stream: Any) -> None:
        nonlocal seen, began, began_cpu
        async for _event in stream.noack().events():
            if seen == 0:
                began, began_cpu = time.perf_counter(), time.process_time()
            seen += 1
            if seen == args.records:
                seconds = time.perf_counter() - began
                cpu = time.process_time() - began_cpu
                line = orjson.dumps({"records": seen - 1, "seconds": seconds, "cpu_seconds": cpu})
                if args.out is None:
                    sys.stdout.buffer.write(line + b"\n")
                    sys.stdout.flush()
                else:
                    args.out.write_bytes(line + b"\n")
                os._exit(0)  # a clean Faust shutdown takes seconds and measures nothing

    app.agent(topic, name="read")(read)
    worker = faust.Worker(app, loglevel="WARNING", quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
