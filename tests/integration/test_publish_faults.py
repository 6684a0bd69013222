"""Publishing through broker outages, signals and kills, and entries up to 16 MiB and beyond.

Each run is a real `sessionfold publish` process. The outage tests use a broker of their own,
which they freeze (SIGSTOP: requests go unanswered at once) and then kill, and start again on
the same data dir: a broker crash with everything acknowledged kept, as on a real node.
"""

from __future__ import annotations

import base64
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from uuid import uuid4

import orjson
import pytest
from kafka_workers import generate_fleet
from typer.testing import CliRunner

from sessionfold.events.envelope import EntryEnvelope, PlaceholderEnvelope, decode
from sessionfold.streams.cli import app
from sessionfold.streams.kafka.topic_reader import read_topic
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.publisher import Checkpoints
from sessionfold.streams.publishing.session_file import (
    DEAD_LETTER_RAW_BYTES,
    ENTRY_TOO_LARGE,
    DeadLetter,
    read_session_file,
    session_files,
)
from sessionfold.streams.tools import broker
from sessionfold.streams.tools.replay import replay_files, replay_topic

pytestmark = pytest.mark.kafka

RUN_GUARD_S = 90.0  # no run may take this long: a hang fails the test instead of blocking it


@dataclass
class Node:
    """A broker these tests may freeze and kill, and start again on the same data dir.

    It comes back on a fresh port pair: while it is down, its ports are free for anyone (other
    brokers on this machine pick free ports too). Its topics and records are the same.
    """

    config: broker.BrokerConfig

    @property
    def bootstrap(self) -> str:
        return self.config.bootstrap

    def freeze(self) -> None:
        """Stop answering at once: connections stay open, nothing comes back."""
        pid = broker.status(self.config).pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)

    def kill(self) -> None:
        """Kill the frozen broker: SIGTERM cannot run while it is stopped, so SIGKILL follows."""
        broker.stop(self.config, timeout_s=0.5)

    def start(self) -> None:
        """Start it again (a no-op while it runs)."""
        if broker.status(self.config).pid is None:
            port = broker.free_port_pair()
            self.config = broker.BrokerConfig(port=port, data_dir=self.config.data_dir)
        broker.up(self.config)


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A broker of these tests' own."""
    node = Node(
        broker.BrokerConfig(
            port=broker.free_port_pair(), data_dir=tmp_path_factory.mktemp("kafka-faults")
        )
    )
    broker.up(node.config)
    try:
        yield node
    finally:
        broker.stop(node.config)


@pytest.fixture
def live_broker(own_broker: Node) -> Node:
    """The own broker, running (an earlier test may have left it down)."""
    own_broker.start()
    return own_broker


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 generated sessions, about 5,000 entries."""
    return generate_fleet(tmp_path_factory.mktemp("fault-fleet"), 60, 40, seed=11)


@pytest.fixture(scope="module")
def short_fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,600 short generated sessions, about 14,000 entries: many files in flight at once, and
    a run long enough to be killed on an idle machine (publish sends 400 of them in under the
    0.6 s a kill may wait)."""
    return generate_fleet(tmp_path_factory.mktemp("short-fleet"), 1600, 3, seed=12)


def _expected(root: Path) -> dict[str, list[int]]:
    seqs: dict[str, list[int]] = defaultdict(list)
    for path in session_files([root]):
        for record in read_session_file(path):
            if not isinstance(record, DeadLetter):
                seqs[record.session_id].append(record.seq)
    return dict(seqs)


def _published(bootstrap: str, topics: Topics) -> dict[str, list[int]]:
    """Sequence numbers per session in topic order, entries and placeholders."""
    seqs: dict[str, list[int]] = defaultdict(list)
    for record in read_topic(bootstrap, topics.session_events):
        envelope = decode(record.value)
        if isinstance(envelope, EntryEnvelope | PlaceholderEnvelope):
            seqs[envelope.session_id].append(envelope.seq)
    return dict(seqs)


class Run:
    """One `sessionfold publish` process, its output going to files (no pipe can fill up)."""

    def __init__(self, tmp: Path, bootstrap: str, prefix: str, root: Path, **env: str) -> None:
        self.state = tmp / "state.json"
        self.out = tmp / f"out-{uuid4().hex[:6]}"
        self.err = tmp / f"err-{uuid4().hex[:6]}"
        args = [sys.executable, "-m", "sessionfold.streams.cli", "publish", str(root)]
        args += ["--bootstrap", bootstrap, "--topic-prefix", prefix, "--partitions", "3"]
        args += ["--state-file", str(self.state), "--no-world", *env.pop("extra", "").split()]
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.process = subprocess.Popen(
                args, stdout=out, stderr=err, env={**os.environ, **env}, cwd=tmp
            )

    def wait(self, timeout: float = RUN_GUARD_S) -> int:
        """The exit code; fails the test if the run is still going after `timeout`."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"publish still running after {timeout:.0f} s: {self.stderr()[-500:]}")

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()


def _until(condition: Callable[[], bool], what: str, timeout: float = RUN_GUARD_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def _checkpoint_behind_topic(state: Path, bootstrap: str, topics: Topics) -> list[str]:
    """Files whose checkpoint claims envelopes the topic does not hold (should be none)."""
    on_topic = _published(bootstrap, topics)
    wrong = []
    for name, position in Checkpoints.load(state).positions.items():
        if position.session_id is None:
            continue
        have = set(on_topic.get(position.session_id, []))
        if not set(range(1, position.next_seq)) <= have:
            wrong.append(name)
    return wrong


def test_outage_past_the_timeout_exits_1_and_a_rerun_publishes_each_entry_once(
    live_broker: Node, fleet: Path, tmp_path: Path
) -> None:
    """The broker goes away mid-publish for longer than the timeout: exit 1 with one clear
    line, the checkpoint holds only acknowledged lines, and the re-run completes exactly once.
    """
    bootstrap = live_broker.bootstrap
    prefix = f"t{uuid4().hex[:8]}."
    run = Run(tmp_path, bootstrap, prefix, fleet, SESSIONFOLD_PUBLISH_TIMEOUT="4")
    _until(run.state.exists, "the first record to be sent")
    live_broker.freeze()
    try:
        code = run.wait()
    finally:
        live_broker.kill()
    assert code == 1, "publish finished before the outage: make the fleet bigger"
    err = run.stderr()
    assert "Traceback" not in err
    [message] = [line for line in err.splitlines() if line.strip()]
    assert message.startswith("publish failed: Kafka at ")
    assert "no acknowledgement within 4 s" in message and "a re-run resumes at" in message

    live_broker.start()
    bootstrap = live_broker.bootstrap  # it came back on other ports
    topics = Topics(prefix)
    assert _checkpoint_behind_topic(run.state, bootstrap, topics) == []
    again = Run(tmp_path, bootstrap, prefix, fleet)
    assert again.wait() == 0, again.stderr()
    assert _published(bootstrap, topics) == _expected(fleet)


def test_sigterm_during_an_outage_ends_publish_promptly(
    live_broker: Node, fleet: Path, tmp_path: Path
) -> None:
    """SIGTERM while every wait is for a broker that does not answer: exit 143 within the
    stop grace (not the 10-minute timeout), and the re-run still publishes each entry once.
    """
    bootstrap = live_broker.bootstrap
    prefix = f"t{uuid4().hex[:8]}."
    run = Run(tmp_path, bootstrap, prefix, fleet, SESSIONFOLD_PUBLISH_TIMEOUT="600")
    _until(run.state.exists, "the first record to be sent")
    live_broker.freeze()
    try:
        time.sleep(1.0)  # let publish block on the silent broker
        run.process.send_signal(signal.SIGTERM)
        code = run.wait(timeout=30)
    finally:
        live_broker.kill()
    assert code == 143
    err = run.stderr()
    assert "Traceback" not in err and "publish stopped by SIGTERM" in err

    live_broker.start()
    bootstrap = live_broker.bootstrap  # it came back on other ports
    again = Run(tmp_path, bootstrap, prefix, fleet)
    assert again.wait() == 0, again.stderr()
    assert _published(bootstrap, Topics(prefix)) == _expected(fleet)


def test_sigterm_ends_follow_cleanly(live_broker: Node, fleet: Path, tmp_path: Path) -> None:
    """With --follow a signal is the way to stop: exit 0 once everything is acknowledged."""
    bootstrap = live_broker.bootstrap
    prefix = f"t{uuid4().hex[:8]}."
    expected = _expected(fleet)
    total = sum(len(seqs) for seqs in expected.values())
    run = Run(tmp_path, bootstrap, prefix, fleet, extra="--follow")
    topics = Topics(prefix)
    _until(
        lambda: run.state.exists() and len(Checkpoints.load(run.state).positions) == len(expected),
        "every file to be checkpointed",
    )
    run.process.send_signal(signal.SIGTERM)
    assert run.wait(timeout=30) == 0, run.stderr()
    assert f"published {total}, skipped 0" in run.stdout()
    assert _published(bootstrap, topics) == expected


def test_sigkill_at_random_points_never_doubles_an_entry(
    live_broker: Node, fleet: Path, tmp_path: Path
) -> None:
    """Runs killed with SIGKILL (between acknowledgement and checkpoint, among others), then a
    run to the end: the topic holds every entry exactly once, in order.
    """
    bootstrap = live_broker.bootstrap
    prefix = f"t{uuid4().hex[:8]}."
    chance = random.Random(20260101)
    state = tmp_path / "state.json"
    killed = 0
    for _ in range(6):
        before = _mtime(state)
        run = Run(tmp_path, bootstrap, prefix, fleet)
        _until(partial(_sent_or_ended, state, before, run), "the run to send")
        time.sleep(chance.uniform(0.0, 1.2))
        if run.process.poll() is not None:
            assert run.process.returncode == 0, run.stderr()
            break
        run.process.kill()
        run.process.wait()
        killed += 1
    assert killed >= 2, "the runs ended before they could be killed: make the fleet bigger"
    last = Run(tmp_path, bootstrap, prefix, fleet)
    assert last.wait() == 0, last.stderr()
    assert _published(bootstrap, Topics(prefix)) == _expected(fleet)


def test_sigkill_with_several_files_in_flight_never_doubles_an_entry(
    live_broker: Node, short_fleet: Path, tmp_path: Path
) -> None:
    """Publish sends a file's records before the files before it are acknowledged: runs over
    many short files killed with SIGKILL at random points, some of them while several files
    are unacknowledged (each marked unsure in the state file), then a run to the end; the topic
    holds every entry exactly once, in order.
    """
    bootstrap = live_broker.bootstrap
    prefix = f"t{uuid4().hex[:8]}."
    chance = random.Random(20261226)
    state = tmp_path / "state.json"
    killed = most_unsure = 0
    for _ in range(8):
        before = _mtime(state)
        run = Run(tmp_path, bootstrap, prefix, short_fleet)
        _until(partial(_sent_or_ended, state, before, run), "the run to send")
        time.sleep(chance.uniform(0.0, 0.6))
        if run.process.poll() is not None:
            assert run.process.returncode == 0, run.stderr()
            break
        run.process.kill()
        run.process.wait()
        killed += 1
        most_unsure = max(most_unsure, len(Checkpoints.load(state).unsure))
    assert killed >= 2, "the runs ended before they could be killed: make the fleet bigger"
    assert most_unsure >= 2, "no kill found two files unacknowledged at once"
    last = Run(tmp_path, bootstrap, prefix, short_fleet)
    assert last.wait() == 0, last.stderr()
    assert Checkpoints.load(state).unsure == {}
    assert _published(bootstrap, Topics(prefix)) == _expected(short_fleet)


def _mtime(path: Path) -> int:
    return path.stat().st_mtime_ns if path.exists() else 0


def _sent_or_ended(state: Path, before: int, run: Run) -> bool:
    """Whether `run` has written the state file (it does so before its first send) or ended."""
    return _mtime(state) != before or run.process.poll() is not None


def _message(entry_id: str, parent: str | None, text: str) -> bytes:
    return orjson.dumps(
        {
            "type": "message",
            "id": entry_id,
            "parentId": parent,
            "timestamp": "2026-01-01T00:00:01Z",
            "message": {"role": "user", "content": [{"type": "text", "text": text}]},
        }
    )


def test_large_entry_is_published_and_one_past_the_limit_is_dead_lettered(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A 2 MB entry goes through and reads back through replay; a 20 MB one becomes a dead
    letter with its reason and size, the entries after it are published, a re-run sends 0.
    """
    header = b'{"type":"session","version":3,"id":"big-1","timestamp":"2026-01-01T00:00:00Z"}'
    lines = [
        header,
        _message("a", None, "first"),
        _message("b", "a", "m" * (2 * 1024 * 1024)),
        _message("c", "b", "after the large one"),
        _message("d", "c", "h" * (20 * 1024 * 1024)),
        _message("e", "c", "after the huge one"),
        _message("f", "e", "last"),
    ]
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    prefix = f"t{uuid4().hex[:8]}."
    topics = Topics(prefix)
    args = ["publish", str(path), "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]
    args += ["--state-file", str(tmp_path / "state.json"), "--no-world"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "published 7, skipped 0, dead-lettered 1" in first.stdout  # with its placeholder
    assert _published(kafka_bootstrap, topics) == {"big-1": [1, 2, 3, 4, 5, 6, 7]}

    [letter] = [orjson.loads(r.value) for r in read_topic(kafka_bootstrap, topics.dead_letters)]
    assert (letter["reason"], letter["line"], letter["session_id"]) == (ENTRY_TOO_LARGE, 5, "big-1")
    assert letter["size"] == len(lines[4]) and letter["raw_truncated"] is True
    assert base64.b64decode(letter["raw_b64"]) == lines[4][:DEAD_LETTER_RAW_BYTES]

    from_topic = replay_topic(kafka_bootstrap, topics).result()
    assert from_topic == replay_files([path]).result()
    assert from_topic["sessions"]["big-1"]["dead_letters"] == 1

    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "published 0, skipped 7, dead-lettered 0" in second.stdout
