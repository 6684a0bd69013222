"""Where a fold worker's main thread spends its time, by layer, sampled with py-spy.

    .venv/bin/python bench/worker_layers.py --pid PID [--seconds 15]

Samples the worker (`py-spy record --format raw --threads --idle`), then sorts each sample of its
main thread, where the event loop runs the fold agent, into one layer by the frames on its stack:

- waiting: the event loop in `select`, nothing to run;
- pure fold: `apply_folds`, the projections the embedded runtime runs too;
- envelope decode: `read_envelope`, the record's JSON read and validated (the embedded runtime
  folds envelopes it already holds);
- Faust delivery: Faust's consumer drain, conductor, stream and acks, which hand records over one
  at a time;
- producer: aiokafka's producer and connections, through Faust's producer;
- web: aiohttp, the state API and /metrics;
- fold runtime: the rest of sessionfold (batches, journals, table rows, metrics);
- other: the event loop's own work, Faust's other services, and stacks py-spy read in part.

py-spy pauses the worker for each sample (100 a second), which slows it and shortens its waits:
read the busy layers against each other, not the sampled run's events/s or its waiting.

bench/kafka_pipeline.py --profile prints the split of a fold worker draining a backlog: the pure
fold's share against the rest says how far a worker is from the embedded fold's cost per event.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

Stack = Sequence[str]


def _any(*parts: str) -> Callable[[Stack], bool]:
    return lambda stack: any(part in frame for frame in stack for part in parts)


#: Where a thread's innermost frame stands when it has nothing to do: an event loop's select, an
#: executor thread's wait for work.
IDLE = ("selectors.py", "concurrent/futures/thread.py", "threading.py")


def idle(stack: Stack) -> bool:
    """Whether a sample is of a thread waiting for something to do."""
    return bool(stack) and any(place in stack[-1] for place in IDLE)


#: The folds' own packages (the CLI's frames are at the root of every main-thread stack).
RUNTIME = (
    "sessionfold/events/",
    "sessionfold/projections/",
    "sessionfold/ports/",
    "sessionfold/streams/runtime/",
    "sessionfold/streams/worker/",
    "sessionfold/streams/kafka/",
)


#: (layer, test of a main-thread stack), the first that holds wins; frames read like py-spy's,
#: "function (package/module.py:line)", outermost first.
LAYERS: tuple[tuple[str, Callable[[Stack], bool]], ...] = (
    ("waiting", idle),
    ("pure fold", _any("apply_folds (sessionfold/projections/folds.py")),
    ("envelope decode", _any("read_envelope (sessionfold/")),
    (
        "Faust delivery",
        _any(
            "faust/transport/consumer.py",
            "faust/transport/conductor.py",
            "faust/streams.py",
            "faust/events.py",
            "faust/types/tuples.py",
            "mode/utils/queues.py",
        ),
    ),
    ("producer", _any("aiokafka/", "faust/transport/producer.py", "faust/transport/drivers/")),
    ("web", _any("aiohttp/")),
    ("fold runtime", _any(*RUNTIME)),
    ("other", lambda stack: True),
)
NAMES = tuple(name for name, _test in LAYERS)


@dataclass(frozen=True)
class Layers:
    """A worker's main-thread samples by layer, and its other threads' busy shares."""

    samples: int
    shares: dict[str, float]  # layer -> share of the main thread's samples
    threads: dict[str, float]  # other thread -> share of its samples not idle

    def line(self) -> str:
        """The split in one line, largest layer first."""
        ranked = sorted(self.shares.items(), key=lambda item: -item[1])
        return " / ".join(f"{share:.0%} {name}" for name, share in ranked if share >= 0.005)

    @property
    def busy(self) -> float:
        """The share of the main thread's samples not waiting."""
        return 1.0 - self.shares.get("waiting", 0.0)

    @property
    def rest_per_fold(self) -> float:
        """The main thread's busy time other than the pure fold, per unit of pure fold."""
        fold = self.shares.get("pure fold", 0.0)
        return (self.busy - fold) / fold if fold else float("inf")

    def fold_us(self, cpu_us_per_event: float) -> float:
        """The pure fold's CPU per event, given the worker's, if the worker's CPU went as its
        main thread's busy time (the other threads' share is small: its consumer's fetches)."""
        fold = self.shares.get("pure fold", 0.0)
        return cpu_us_per_event * fold / self.busy if self.busy else 0.0


def layer_of(stack: Stack) -> str:
    """The layer one main-thread sample belongs to."""
    return next(name for name, test in LAYERS if test(stack))


def samples(raw: str) -> Iterator[tuple[str, list[str], int]]:
    """(thread name, frames outermost first, count) of each line of py-spy's raw output."""
    for line in raw.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        thread, *frames = stack.split(";")
        yield thread.rpartition(":")[2].strip(), frames, int(count)


def split(raw: str) -> Layers | None:
    """py-spy's raw output as layers of its MainThread; None if it holds no main-thread sample."""
    main: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    busy: Counter[str] = Counter()
    for thread, frames, count in samples(raw):
        if thread == "MainThread":
            main[layer_of(frames)] += count
        else:
            threads[thread] += count
            busy[thread] += 0 if idle(frames) else count
    total = sum(main.values())
    if not total:
        return None
    return Layers(
        samples=total,
        shares={name: main[name] / total for name in NAMES},
        threads={name: busy[name] / count for name, count in threads.items()},
    )


class Recording:
    """py-spy sampling a process until `stop()`; `error` says why there is nothing to read."""

    def __init__(self, pid: int, out: Path, seconds: float | None = None) -> None:
        self.out = out
        self.error: str | None = None
        self._process: subprocess.Popen[bytes] | None = None
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(spy).exists():
            self.error = "py-spy is not installed (pip install -e '.[test]')"
            return
        argv = [spy, "record", "--pid", str(pid), "--format", "raw", "--threads", "--idle"]
        # Blocking (py-spy pauses the process for each sample): read without pausing, a deep
        # stack such as the fold's tears as it changes, and its samples fall in no layer.
        argv += ["--output", str(out)]
        if seconds is not None:
            argv += ["--duration", str(max(1, round(seconds)))]
        self._log = out.with_suffix(".log")
        with self._log.open("wb") as log:
            self._process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def stop(self, timeout_s: float = 30.0, interrupt: bool = True) -> Layers | None:
        """Stop sampling (py-spy writes its output on SIGINT), or with `interrupt` false wait
        for its duration to end, and read the layers."""
        if self._process is None:
            return None
        if interrupt and self._process.poll() is None:
            self._process.send_signal(signal.SIGINT)
        try:
            self._process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        layers = split(self.out.read_text()) if self.out.exists() else None
        if layers is None:
            said = [line for line in self._log.read_text(errors="replace").splitlines() if line]
            # py-spy's own line of why (a backtrace may follow it), else its last line.
            last = said[-1] if said else "no output"
            why = next((line for line in said if line.startswith("Error")), last)
            self.error = f"py-spy recorded nothing ({why})"
        return layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True, help="the fold worker's process id")
    parser.add_argument("--seconds", type=float, default=15.0, help="how long to sample")
    parser.add_argument("--out", type=Path, default=Path("worker-layers.txt"), help="raw samples")
    args = parser.parse_args()
    recording = Recording(args.pid, args.out, args.seconds)
    layers = recording.stop(timeout_s=args.seconds + 30.0, interrupt=False)
    if layers is None:
        raise SystemExit(recording.error)
    print(f"main thread, {layers.samples} samples: {layers.line()}")
    if layers.shares["pure fold"]:
        print(f"everything but the pure fold costs {layers.rest_per_fold:.1f}x the pure fold")
    else:
        print("no sample was in the pure fold: is this a fold worker?")
    for thread, share in sorted(layers.threads.items()):
        print(f"thread {thread}: busy {share:.0%} of its samples")


if __name__ == "__main__":
    main()
