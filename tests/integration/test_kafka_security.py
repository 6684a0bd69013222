"""Every Kafka client over SASL_SSL, against a real broker with a SASL_SSL listener.

The module starts its own broker (`sessionfold broker up --sasl-ssl-port ...`) with certificates
made here (tests/tls_certs.py) and one user. A real session is published, folded by a
`--role all` worker and replayed, all over SASL_SSL, with SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN,
the password from a file or from the environment; the state the worker serves (refs read back
from the log included) and the replay equal the embedded fold. A wrong password or an unknown CA
fails each command with exit 1 and one line, no traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest
from kafka_workers import WorkerProcess, auth, canonical, wait_converged
from tls_certs import TlsFiles, make_tls_files

from sessionfold.streams.kafka.security import ENV_NAMES
from sessionfold.streams.runtime.embedded import fold_files
from sessionfold.streams.tools import broker

pytestmark = pytest.mark.kafka

SESSION_FILE = "before-compaction.jsonl"
SESSION_ID = "ffae836b-9420-4060-ac13-7745215f90ff"
USER = "fleet-agent"
PASSWORD = "s3cret pass-phrase"
WRONG_PASSWORD = "not-the-password"
#: Guards against a hang only: each command answers in seconds.
COMMAND_TIMEOUT_S = 120


@dataclass(frozen=True)
class SecureBroker:
    """The module's broker: its SASL_SSL address, the CA file and the password file."""

    config: broker.BrokerConfig
    tls: TlsFiles
    password_file: Path

    @property
    def bootstrap(self) -> str:
        """The SASL_SSL listener's address."""
        assert self.config.sasl_ssl_bootstrap is not None
        return self.config.sasl_ssl_bootstrap


def _clean_env() -> dict[str, str]:
    """This process's environment without any SESSIONFOLD security or broker variables."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ENV_NAMES and not k.startswith("SESSIONFOLD_BROKER_")
    }


def _sessionfold(
    *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `sessionfold ARGS` as a real process (errors must reach a real stderr)."""
    return subprocess.run(
        [sys.executable, "-m", "sessionfold.streams.cli", *args],
        capture_output=True,
        text=True,
        env={**_clean_env(), **(env or {})},
        stdin=subprocess.DEVNULL,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """A broker of its own with a SASL_SSL listener and one user, started through the CLI."""
    root = tmp_path_factory.mktemp("secure-kafka")
    tls = make_tls_files(root / "tls")
    users = root / "users.txt"
    users.write_text(f"# test users\n{USER}:{PASSWORD}\n")
    password_file = root / "password"
    password_file.write_text(PASSWORD + "\n")
    port = broker.free_port_pair()
    sasl_ssl_port = broker.free_port_pair()
    config = broker.BrokerConfig(
        port=port,
        data_dir=root / "kafka",
        sasl_ssl_port=sasl_ssl_port,
        tls_certfile=tls.server_cert,
        tls_keyfile=tls.server_key,
        sasl_users_file=users,
    )
    where = ["--port", str(port), "--data-dir", str(config.home)]
    try:
        up = _sessionfold(
            "broker",
            "up",
            *where,
            "--sasl-ssl-port",
            str(sasl_ssl_port),
            "--tls-certfile",
            str(tls.server_cert),
            "--tls-keyfile",
            str(tls.server_key),
            "--sasl-users-file",
            str(users),
        )
        assert up.returncode == 0, up.stderr
        assert up.stdout.strip() == config.bootstrap
        yield SecureBroker(config, tls, password_file)
    finally:
        _sessionfold("broker", "down", *where)
        broker.stop(config)


def _security_env(secure: SecureBroker, mechanism: str, **extra: str) -> dict[str, str]:
    return {
        "SESSIONFOLD_SECURITY_PROTOCOL": "SASL_SSL",
        "SESSIONFOLD_SSL_CAFILE": str(secure.tls.ca_cert),
        "SESSIONFOLD_SASL_MECHANISM": mechanism,
        "SESSIONFOLD_SASL_USERNAME": USER,
        **extra,
    }


@pytest.fixture(scope="module")
def expected(shared_sessions: Path) -> dict[str, object]:
    """The embedded fold of the real session: what every runtime must reach."""
    states = fold_files([shared_sessions / SESSION_FILE])["sessions"]
    assert list(states) == [SESSION_ID]
    return states


def test_status_shows_the_sasl_ssl_listener(secure_broker: SecureBroker) -> None:
    """`broker status --json` names the SASL_SSL address next to the PLAINTEXT one."""
    where = ["--port", str(secure_broker.config.port), "--data-dir", str(secure_broker.config.home)]
    result = _sessionfold("broker", "status", "--json", *where)
    assert result.returncode == 0, result.stderr
    state = orjson.loads(result.stdout)
    assert state["bootstrap"] == secure_broker.config.bootstrap
    assert state["sasl_ssl"] == secure_broker.bootstrap


def test_publish_fold_and_replay_over_sasl_ssl(
    secure_broker: SecureBroker,
    shared_sessions: Path,
    expected: dict[str, object],
    tmp_path: Path,
) -> None:
    """Publish (SCRAM-SHA-512, password file), a worker (same), refs read back by the state API,
    and replays with PLAIN (password from the environment) and SCRAM-SHA-256: all equal the
    embedded fold."""
    prefix = f"sec{os.urandom(4).hex()}."
    scram = _security_env(
        secure_broker,
        "SCRAM-SHA-512",
        SESSIONFOLD_SASL_PASSWORD_FILE=str(secure_broker.password_file),
    )
    where = ["--bootstrap", secure_broker.bootstrap, "--topic-prefix", prefix]
    published = _sessionfold(
        "publish",
        str(shared_sessions / SESSION_FILE),
        *where,
        "--partitions",
        "2",
        "--state-file",
        str(tmp_path / "publish.json"),
        "--no-world",
        env=scram,
    )
    assert published.returncode == 0, published.stderr

    worker = WorkerProcess(secure_broker.bootstrap, prefix, "all", 2, tmp_path, env=scram)
    worker.start()
    try:
        worker.wait_web(timeout=120)
        wait_converged([worker], worker.url, expected, timeout=150)
        # The state API reads the original behind a ref from session-events: a client of its own.
        state = expected[SESSION_ID]
        assert isinstance(state, dict) and state["stats"]["summaries"] > 0
        ref = httpx.get(f"{worker.url}/sessions/{SESSION_ID}/refs/t1", timeout=60, headers=auth())
        assert ref.status_code == 200, ref.text
        assert ref.json()["location"]["topic"] == f"{prefix}session-events"
    finally:
        worker.stop()

    # PLAIN with the password from the environment, given as options this time.
    plain = _sessionfold(
        "replay",
        *where,
        "--json",
        "--security-protocol",
        "SASL_SSL",
        "--ssl-cafile",
        str(secure_broker.tls.ca_cert),
        "--sasl-mechanism",
        "PLAIN",
        "--sasl-username",
        USER,
        env={"SESSIONFOLD_SASL_PASSWORD": PASSWORD},
    )
    assert plain.returncode == 0, plain.stderr
    assert canonical(orjson.loads(plain.stdout)["sessions"]) == canonical(expected)

    sha256 = _sessionfold(
        "replay",
        *where,
        "--json",
        env=_security_env(
            secure_broker,
            "SCRAM-SHA-256",
            SESSIONFOLD_SASL_PASSWORD_FILE=str(secure_broker.password_file),
        ),
    )
    assert sha256.returncode == 0, sha256.stderr
    assert canonical(orjson.loads(sha256.stdout)["sessions"]) == canonical(expected)


def _assert_one_line_failure(result: subprocess.CompletedProcess[str], words: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, result.stderr
    assert len(lines) == 1, result.stderr
    assert words in lines[0]
    assert "Traceback" not in result.stderr
    assert PASSWORD not in result.stderr + result.stdout
    assert WRONG_PASSWORD not in result.stderr + result.stdout


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_a_wrong_password_fails_every_command_with_one_line(
    secure_broker: SecureBroker, shared_sessions: Path, tmp_path: Path, mechanism: str
) -> None:
    """publish, worker and replay with a wrong password: exit 1, one line, no traceback, and no
    waiting out kafka-python's bootstrap retries (the subprocess timeout guards the hang)."""
    env = _security_env(secure_broker, mechanism, SESSIONFOLD_SASL_PASSWORD=WRONG_PASSWORD)
    where = ["--bootstrap", secure_broker.bootstrap, "--topic-prefix", "wrongpw."]
    commands = [
        ["publish", str(shared_sessions / SESSION_FILE), "--state-file", str(tmp_path / "s")],
        ["worker", "--role", "all", "--web-port", "1", "--data-dir", str(tmp_path / "w")],
        ["replay", "--json"],
    ]
    for command in commands:
        result = _sessionfold(*command, *where, env=env)
        _assert_one_line_failure(result, "refused the credentials")


def test_an_unknown_ca_fails_with_a_tls_line(secure_broker: SecureBroker, tmp_path: Path) -> None:
    """A CA file that did not sign the broker's certificate: exit 1 naming TLS, no traceback."""
    other = make_tls_files(tmp_path / "other-ca")
    env = _security_env(
        secure_broker,
        "SCRAM-SHA-512",
        SESSIONFOLD_SASL_PASSWORD=PASSWORD,
        SESSIONFOLD_SSL_CAFILE=str(other.ca_cert),
    )
    result = _sessionfold(
        "replay", "--bootstrap", secure_broker.bootstrap, "--topic-prefix", "badca.", env=env
    )
    _assert_one_line_failure(result, "TLS")


def test_the_plaintext_listener_stays_for_the_broker_itself(secure_broker: SecureBroker) -> None:
    """The PLAINTEXT listener still answers (controller, probe, `status`); the SASL_SSL one
    refuses a client that brings no credentials."""
    assert broker.probe(secure_broker.config.bootstrap, timeout_s=10.0)
    assert not broker.probe(secure_broker.bootstrap, timeout_s=3.0)
