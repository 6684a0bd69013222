"""bench/worker_layers.py: a fold worker's main-thread samples sorted into layers, from py-spy's
raw output, and py-spy sampling a real process that folds."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

# bench/ holds scripts, not a package: its helpers are imported the way the scripts import them.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from worker_layers import NAMES, Recording, layer_of, split

#: The root of every main-thread stack of `sessionfold worker`: the CLI and the event loop.
ROOT = [
    "<module> (sessionfold/streams/cli/__main__.py:5)",
    "_run (sessionfold/streams/cli/worker.py:263)",
    "BaseEventLoop.run_forever (asyncio/base_events.py:607)",
    "BaseEventLoop._run_once (asyncio/base_events.py:1922)",
    "Handle._run (asyncio/events.py:80)",
]
AGENT = [*ROOT, "Agent._execute_actor (faust/agents/agent.py:674)", "fold (sessionfold/a.py:9)"]
STACKS = {
    "waiting": [*ROOT[:3], "BaseEventLoop._run_once (asyncio/base_events.py:1898)",
                "EpollSelector.select (selectors.py:468)"],
    "pure fold": [*AGENT, "FoldRuntime.fold (sessionfold/streams/worker/agents.py:700)",
                  "apply_folds (sessionfold/projections/folds.py:21)", "apply (x.py:1)"],
    "envelope decode": [*AGENT, "fold_record (sessionfold/streams/worker/agents.py:143)",
                        "read_envelope (sessionfold/streams/worker/agents.py:125)",
                        "TypeAdapter.validate_python (pydantic/type_adapter.py:410)"],
    "Faust delivery": [*AGENT, "Stream.events (faust/streams.py:900)"],
    "producer": [*AGENT, "FaustBackend._send (sessionfold/streams/worker/app.py:494)",
                 "AIOKafkaProducer.send (aiokafka/producer/producer.py:494)"],
    "web": [*ROOT, "RequestHandler._handle_request (aiohttp/web_protocol.py:480)",
            "state (sessionfold/streams/web/state_api.py:80)"],
    "fold runtime": [*AGENT, "Batch.journal (sessionfold/streams/worker/agents.py:530)"],
    "other": [*ROOT, "Service._execute_task (mode/services.py:843)"],
}  # fmt: skip


def raw(lines: list[tuple[str, list[str], int]]) -> str:
    """py-spy's raw format: `thread (tid): name;frame;...;frame count`."""
    return "\n".join(
        f"thread (1{i}): {thread};{';'.join(frames)} {count}"
        for i, (thread, frames, count) in enumerate(lines)
    )


def test_each_main_thread_stack_falls_in_its_layer() -> None:
    for layer, stack in STACKS.items():
        assert layer_of(stack) == layer, stack
    assert set(STACKS) == set(NAMES)


def test_the_split_is_of_the_main_thread_and_other_threads_are_busy_or_idle() -> None:
    counts = {"pure fold": 30, "Faust delivery": 20, "waiting": 10, "other": 40}
    lines = [("MainThread", STACKS[layer], n) for layer, n in counts.items()]
    lines += [
        ("Thread-1", ["_run (mode/threads.py:1)", "EpollSelector.select (selectors.py:468)"], 90),
        ("Thread-1", ["_run (mode/threads.py:1)", "Fetcher.get (aiokafka/f.py:1)"], 10),
        ("asyncio_0", ["_worker (concurrent/futures/thread.py:81)"], 5),
        ("MainThread", ["a line py-spy did not write"], 0),
    ]
    layers = split(raw(lines) + "\nnot a sample line\n")
    assert layers is not None
    assert layers.samples == 100
    assert layers.shares["pure fold"] == pytest.approx(0.3)
    assert layers.shares["producer"] == 0.0
    assert sum(layers.shares.values()) == pytest.approx(1.0)
    assert layers.threads == {"Thread-1": pytest.approx(0.1), "asyncio_0": 0.0}
    assert layers.line().startswith("40% other / 30% pure fold / 20% Faust delivery / 10% waiting")
    assert layers.rest_per_fold == pytest.approx((0.9 - 0.3) / 0.3)
    # 30% of samples folding, 90% busy: a third of a 300 us event is the pure fold.
    assert layers.fold_us(300.0) == pytest.approx(100.0)
    assert split(raw([("Thread-1", STACKS["pure fold"], 5)])) is None


#: A process whose main thread folds a generated session over and over, as a worker would.
FOLDING = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from sessionfold.streams.publishing.session_file import read_session_file
    from sessionfold.streams.runtime.embedded import EmbeddedRuntime
    from sessionfold.streams.tools.synthetic import generate_session, write_session
    path = write_session(Path(sys.argv[1]), generate_session(3, 20)).path
    records = list(read_session_file(path))
    print("ready", flush=True)
    while True:
        runtime = EmbeddedRuntime()
        for record in records:
            runtime.publish(record)
    """
)


def test_py_spy_samples_a_folding_process_into_the_pure_fold(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", FOLDING, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        recording = Recording(child.pid, tmp_path / "samples.txt")
        time.sleep(2.0)
        layers = recording.stop()
    finally:
        child.kill()
        child.wait()
    if layers is None and "ermission" in str(recording.error):
        pytest.skip(f"py-spy may not read other processes here: {recording.error}")
    assert layers is not None, recording.error
    assert layers.samples >= 30
    # The embedded runtime over envelopes it already holds: folds and their runtime, no Kafka.
    shares = layers.shares
    assert shares["pure fold"] > 0.15, layers.line()
    assert shares["pure fold"] + shares["fold runtime"] > 0.5, layers.line()
    kafka = ("waiting", "envelope decode", "Faust delivery", "producer", "web")
    assert all(shares[name] == 0.0 for name in kafka), layers.line()


def test_a_process_py_spy_cannot_read_gives_no_layers_and_says_why(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid now names no process
    recording = Recording(gone.pid, tmp_path / "samples.txt")
    assert recording.stop(interrupt=False) is None  # py-spy gives up by itself
    assert str(recording.error).startswith("py-spy recorded nothing (Error: "), recording.error
