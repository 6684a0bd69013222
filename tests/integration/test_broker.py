"""The local Kafka broker: it answers, `broker status` sees it, and its data survives a restart."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from typer.testing import CliRunner

from sessionfold.streams.cli import app
from sessionfold.streams.tools import broker

pytestmark = pytest.mark.kafka

CONSOLE_SCRIPT = Path(sys.executable).with_name("sessionfold")


def _cli(*args: str) -> tuple[int, str, str]:
    """Run `sessionfold ARGS` as a real process when the console script exists, else in-process.

    The SESSIONFOLD_BROKER_* variables are dropped so that every call names its broker explicitly
    and never lands on the CI broker by accident.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONFOLD_BROKER_")}
    if CONSOLE_SCRIPT.is_file():
        proc = subprocess.run(
            [str(CONSOLE_SCRIPT), *args],
            capture_output=True,
            text=True,
            env=env,
            stdin=subprocess.DEVNULL,
            timeout=180,
            check=False,
        )
        return proc.returncode, proc.stdout, proc.stderr
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def _create_topic(bootstrap: str, topic: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        admin.close()


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        for index, value in enumerate(values):
            producer.send(topic, key=str(index).encode(), value=value)
        producer.flush(timeout=30)
    finally:
        producer.close()


def _consume(bootstrap: str, topic: str, expected: int, timeout_s: float = 30.0) -> list[bytes]:
    """Read a one-partition topic from the start (no consumer group) until `expected` records."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(values) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(record.value for record in records)
    finally:
        consumer.close()
    return values


def test_broker_round_trips_a_record(kafka_bootstrap: str, topic_prefix: str) -> None:
    """A record produced to a new topic is read back unchanged."""
    topic = f"{topic_prefix}round-trip"
    _create_topic(kafka_bootstrap, topic)
    _produce(kafka_bootstrap, topic, [b"hello"])
    assert _consume(kafka_bootstrap, topic, expected=1) == [b"hello"]


def test_status_json_reports_the_running_broker(
    kafka_broker_config: broker.BrokerConfig | None,
) -> None:
    """`broker status --json` reports the session's broker as running, with its address."""
    config = kafka_broker_config
    if config is None:
        pytest.skip("the broker at SESSIONFOLD_BOOTSTRAP has no known data dir")
    code, out, err = _cli(
        "broker", "status", "--json", "--port", str(config.port), "--data-dir", str(config.home)
    )
    assert code == 0, err
    state = json.loads(out)
    assert state["running"] is True
    assert state["bootstrap"] == config.bootstrap
    assert isinstance(state["pid"], int)
    assert state["data_dir"] == str(config.home)


@pytest.mark.slow
def test_records_survive_stop_and_start(port_pair: int, tmp_path: Path, topic_prefix: str) -> None:
    """A second broker keeps its topics and records across `down` and `up`."""
    data_dir = tmp_path / "kafka"
    where = ["--port", str(port_pair), "--data-dir", str(data_dir)]
    config = broker.BrokerConfig(port=port_pair, data_dir=data_dir)
    topic = f"{topic_prefix}durable"
    values = [f"record-{i}".encode() for i in range(20)]
    try:
        old_umask = os.umask(0o022)  # the broker process inherits it
        try:
            code, out, err = _cli("broker", "up", *where)
        finally:
            os.umask(old_umask)
        assert code == 0, err
        assert out.strip() == f"127.0.0.1:{port_pair}"
        # The data dir holds every topic's records: only its owner may enter it.
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
        _create_topic(config.bootstrap, topic)
        _produce(config.bootstrap, topic, values)

        code, out, _ = _cli("broker", "up", *where)  # already running: a no-op
        assert code == 0
        first_pid = broker.status(config).pid
        assert first_pid is not None

        code, _, err = _cli("broker", "down", *where)
        assert code == 0, err
        code, out, _ = _cli("broker", "status", *where)
        assert code == 1
        assert out.startswith("stopped")
        assert not config.pid_file.exists()

        code, out, err = _cli("broker", "up", *where)
        assert code == 0, err
        assert broker.status(config).pid != first_pid
        assert _consume(config.bootstrap, topic, expected=len(values)) == values
    finally:
        _cli("broker", "down", *where)
        broker.stop(config)  # belt and braces if the CLI could not stop it
    assert not broker.status(config).running


def test_cluster_id_never_starts_with_a_dash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster id that would start with "-" (a flag to StorageTool) is drawn again."""
    dash_first = uuid.UUID(bytes=b"\xf8" + bytes(15))  # URL-safe base64 of 0xf8... starts with "-"
    draws: Iterator[uuid.UUID] = iter([dash_first, uuid.UUID(int=1)])
    monkeypatch.setattr(broker.uuid, "uuid4", lambda: next(draws))
    config = broker.BrokerConfig(port=40000, data_dir=tmp_path)
    cluster_id = broker._cluster_id(config)
    assert not cluster_id.startswith("-")
    assert len(cluster_id) == 22
    assert config.cluster_id_file.read_text().strip() == cluster_id


# A stand-in for the moment between fork and exec: the process exists, its command line is not the
# broker's yet. It execs the real broker command only once the file named by argv[2] exists.
_LATE_EXEC = (
    "import json, os, sys, time\n"
    "cmd = json.load(open(sys.argv[1]))\n"
    "while not os.path.exists(sys.argv[2]):\n"
    "    time.sleep(0.05)\n"
    "os.execv(cmd[0], cmd)\n"
)


def _processes_naming(path: Path) -> list[int]:
    """Pids of live processes whose command line names `path` (read from /proc by the test)."""
    needle = str(path).encode()
    pids: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except (OSError, IndexError):
            continue
        if needle in cmdline and state not in {"Z", "X"}:
            pids.append(int(entry.name))
    return sorted(pids)


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_broker_caught_before_its_exec_is_owned_found_and_stopped(
    port_pair: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up` waits for a broker whose command line is not the JVM's yet; `status`/`down` find it.

    The broker is spawned through a shim that holds off its exec until the first readiness probe,
    so the first liveness check always sees a process whose /proc/PID/cmdline is not kafka.Kafka.
    Then the pid file is deleted: `broker status` and `broker down`, run as other processes, still
    find the JVM, and no process of that data dir is left.
    """
    data_dir = tmp_path / "kafka"
    config = broker.BrokerConfig(port=port_pair, data_dir=data_dir)
    go = tmp_path / "exec-now"
    real_command = broker._broker_command
    real_probe = broker.probe

    def late_command(config: broker.BrokerConfig, java: str) -> list[str]:
        command_file = tmp_path / "broker-command.json"
        command_file.write_text(json.dumps(real_command(config, java)))
        return [sys.executable, "-c", _LATE_EXEC, str(command_file), str(go)]

    def probe_then_release(bootstrap: str, timeout_s: float = 5.0) -> bool:
        go.touch()
        return real_probe(bootstrap, timeout_s)

    monkeypatch.setattr(broker, "_broker_command", late_command)
    monkeypatch.setattr(broker, "probe", probe_then_release)
    where = ["--port", str(port_pair), "--data-dir", str(data_dir)]
    try:
        result = broker.up(config, timeout_s=120)
        assert _processes_naming(config.properties_file) == [result.pid]

        config.pid_file.unlink()
        config.state_file.unlink()
        code, out, err = _cli("broker", "status", "--json", *where)
        assert code == 0, err
        assert json.loads(out)["pid"] == result.pid

        code, _, err = _cli("broker", "down", *where)
        assert code == 0, err
        assert _processes_naming(data_dir) == []
        code, out, _ = _cli("broker", "status", *where)
        assert code == 1
        assert out.startswith("stopped")
    finally:
        _kill_all(_processes_naming(tmp_path))  # never leave an orphan JVM or shim behind


def test_a_stale_pid_file_never_names_an_unrelated_process(tmp_path: Path) -> None:
    """A pid file naming a live process that is not the broker: not running, never signalled."""
    config = broker.BrokerConfig(port=40000, data_dir=tmp_path)
    bystander = subprocess.Popen(["sleep", "120"])
    try:
        config.pid_file.write_text(f"{bystander.pid}\n")
        config.owner_file.touch()
        assert broker.status(config).running is False
        assert broker.stop(config, timeout_s=1.0) is False
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_broker_that_dies_before_answering_is_reported_at_once(
    port_pair: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker process that exits before it answers fails `up` as "exited", not as a timeout."""
    config = broker.BrokerConfig(port=port_pair, data_dir=tmp_path / "kafka")
    monkeypatch.setattr(
        broker, "_broker_command", lambda config, java: [sys.executable, "-c", "exit(3)"]
    )
    with pytest.raises(broker.BrokerError, match="exited before answering"):
        broker.up(config, timeout_s=300)
    assert not config.pid_file.exists()
    assert broker.status(config).running is False
