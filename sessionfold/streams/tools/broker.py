"""A real single-node Apache Kafka KRaft broker, built from Maven Central jars.

The broker is plain Apache Kafka (``kafka.Kafka`` from ``org.apache.kafka:kafka_2.13``): Maven
copies its runtime classpath into a per-version jar cache, ``kafka.tools.StorageTool`` formats the
data dir once, and ``java`` runs the broker in the background in its own session so that it
outlives the process that started it. Everything that belongs to one broker lives in its data dir::

    <data dir>/
        cluster.id          the cluster id the storage was formatted with
        server.properties   rendered from deploy/kafka/server.properties on every start
        broker.pid          pid of the running java process (absent when stopped)
        broker.owner        held open under a flock by the broker process for its whole life: the
                            proof of which process is this data dir's broker (see _is_our_broker)
        broker.json         version and ports of the running broker, for `status`
        broker.log          the broker's stdout/stderr (the previous run's is broker.log.1)
        tls/keystore.pem    the SASL_SSL listener's key and certificate chain (when enabled)
        kraft/              log.dirs: topic data and the KRaft metadata log

Stopping never touches ``kraft/``, so topics and records survive stop/start.

Besides the PLAINTEXT listener (which the controller, inter-broker traffic and the readiness probe
use), `up` can open a SASL_SSL listener for clients: PEM certificate and key, and users from a
file (PLAIN users go into the listener's JAAS config, SCRAM-SHA-256/512 users are created through
the admin API once the broker answers).
See reference/kafka-broker.md sections 1 and 2 for why the jars, flags and settings are as they are.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import ssl
import string
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sessionfold.streams.kafka.security import PLAINTEXT as PLAINTEXT_SECURITY
from sessionfold.streams.kafka.security import KafkaSecurity, kafka_python_options
from sessionfold.streams.private_dirs import make_private_dirs

# 3.9.2 resolved from Maven Central (3.9.1 is the fallback); see deploy/kafka/pom-3.9.xml.
DEFAULT_KAFKA_VERSION = "3.9.2"
DEFAULT_PORT = 9092
DEFAULT_START_TIMEOUT_S = 90.0
DEFAULT_STOP_TIMEOUT_S = 20.0

ENV_VERSION = "SESSIONFOLD_KAFKA_VERSION"
ENV_PORT = "SESSIONFOLD_BROKER_PORT"
ENV_CONTROLLER_PORT = "SESSIONFOLD_BROKER_CONTROLLER_PORT"
ENV_DATA_DIR = "SESSIONFOLD_BROKER_DATA_DIR"
ENV_CACHE_DIR = "SESSIONFOLD_KAFKA_CACHE_DIR"
ENV_SASL_SSL_PORT = "SESSIONFOLD_BROKER_SASL_SSL_PORT"

# The broker binds loopback only: it is a development and test broker, never a network service.
HOST = "127.0.0.1"

_VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_KAFKA_MAIN = "kafka.Kafka"
_STORAGE_TOOL = "kafka.tools.StorageTool"
# -Xmx512m is plenty for a single test broker and keeps two of them (CI plus a test's own) cheap on
# a 2-core machine. G1 and the pause target are what bin/kafka-run-class.sh uses.
_JVM_OPTS = (
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
_LOG_TAIL_LINES = 40
_MVN_TIMEOUT_S = 900.0
_FORMAT_TIMEOUT_S = 120.0

ProgressFn = Callable[[str], None]

log = logging.getLogger(__name__)

# Broker processes started by this Python process, kept so that stop() can reap them: a child
# that has exited stays a zombie (and still answers kill(pid, 0)) until its parent waits for it.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class BrokerError(RuntimeError):
    """The broker could not be fetched, formatted, started, reached or stopped."""


class BrokerConfigError(BrokerError, ValueError):
    """A version, port or path given for the broker is not valid (a usage error)."""


def _noop(_message: str) -> None:
    """Default progress callback: say nothing."""


def _xdg_dir(env: str, fallback: str) -> Path:
    """Return an XDG base directory, honouring the variable only when it is an absolute path."""
    value = os.environ.get(env, "")
    return Path(value) if value and Path(value).is_absolute() else Path.home() / fallback


def default_data_dir(port: int) -> Path:
    """Return the default data dir of the broker on `port` (one per port: brokers never share)."""
    return _xdg_dir("XDG_DATA_HOME", ".local/share") / "sessionfold" / f"kafka-{port}"


def default_cache_root() -> Path:
    """Return the directory that holds one jar cache per Kafka version."""
    return _xdg_dir("XDG_CACHE_HOME", ".cache") / "sessionfold" / "kafka"


class BrokerConfig(BaseModel):
    """Where and how one local broker runs; `BrokerConfig.resolve()` also applies env vars."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Only the version follows the environment by default, so a CI leg can switch every broker a
    # test starts to 4.x. Port and data dir env vars are applied by resolve() alone: a test that
    # builds its own config must never land on the CI broker's port or data dir.
    version: str = Field(
        default_factory=lambda: os.environ.get(ENV_VERSION) or DEFAULT_KAFKA_VERSION
    )
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)
    controller_port: int = Field(default=0, ge=0, le=65535, description="0 means port + 1")
    data_dir: Path | None = None
    cache_root: Path | None = None
    #: A SASL_SSL listener for clients on this port (None: PLAINTEXT only). It needs the three
    #: files below: PEM certificate chain, PEM (PKCS#8, unencrypted) key, and the users file.
    sasl_ssl_port: int | None = Field(default=None, ge=1, le=65535)
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    sasl_users_file: Path | None = None

    @field_validator("version")
    @classmethod
    def _check_version(cls, value: str) -> str:
        match = _VERSION_RE.match(value)
        # KRaft-only brokers: 3.x (3.9 is what is tested) and 4.x; older lines need ZooKeeper.
        if match is None or int(match.group(1)) < 3:
            msg = f"Kafka version must look like 3.9.2 or 4.1.1 (3.x or newer), got {value!r}"
            raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _fill_defaults(self) -> BrokerConfig:
        # Frozen model: derived defaults are set once here, through object.__setattr__.
        if self.controller_port == 0:
            if self.port == 65535:
                msg = "port 65535 leaves no room for the controller port (port + 1)"
                raise ValueError(msg)
            object.__setattr__(self, "controller_port", self.port + 1)
        if self.controller_port == self.port:
            msg = "controller port must differ from the broker port"
            raise ValueError(msg)
        self._check_sasl_ssl()
        if self.data_dir is None:
            object.__setattr__(self, "data_dir", default_data_dir(self.port))
        object.__setattr__(self, "data_dir", Path(self.data_dir).expanduser().absolute())
        if self.cache_root is None:
            object.__setattr__(self, "cache_root", default_cache_root())
        object.__setattr__(self, "cache_root", Path(self.cache_root).expanduser().absolute())
        return self

    def _check_sasl_ssl(self) -> None:
        files = {
            "--tls-certfile": self.tls_certfile,
            "--tls-keyfile": self.tls_keyfile,
            "--sasl-users-file": self.sasl_users_file,
        }
        if self.sasl_ssl_port is None:
            given = [name for name, path in files.items() if path is not None]
            if given:
                msg = f"{given[0]} needs --sasl-ssl-port"
                raise ValueError(msg)
            return
        missing = [name for name, path in files.items() if path is None]
        if missing:
            msg = f"--sasl-ssl-port needs {', '.join(missing)}"
            raise ValueError(msg)
        if self.sasl_ssl_port in (self.port, self.controller_port):
            msg = "the SASL_SSL port must differ from the broker and controller ports"
            raise ValueError(msg)
        for name in ("tls_certfile", "tls_keyfile", "sasl_users_file"):
            object.__setattr__(self, name, Path(getattr(self, name)).expanduser().absolute())

    @classmethod
    def resolve(
        cls,
        *,
        version: str | None = None,
        port: int | None = None,
        controller_port: int | None = None,
        data_dir: Path | str | None = None,
        cache_root: Path | str | None = None,
        sasl_ssl_port: int | None = None,
        tls_certfile: Path | None = None,
        tls_keyfile: Path | None = None,
        sasl_users_file: Path | None = None,
    ) -> BrokerConfig:
        """Build a config from explicit values, then SESSIONFOLD_* env vars, then defaults."""
        env = os.environ
        values: dict[str, Any] = {
            "sasl_ssl_port": sasl_ssl_port,
            "tls_certfile": tls_certfile,
            "tls_keyfile": tls_keyfile,
            "sasl_users_file": sasl_users_file,
        }
        version = version or env.get(ENV_VERSION) or None
        if version:
            values["version"] = version
        if port is None and env.get(ENV_PORT):
            port = _env_int(ENV_PORT)
        if port is not None:
            values["port"] = port
        if controller_port is None and env.get(ENV_CONTROLLER_PORT):
            controller_port = _env_int(ENV_CONTROLLER_PORT)
        if controller_port is not None:
            values["controller_port"] = controller_port
        data_dir = data_dir or env.get(ENV_DATA_DIR) or None
        if data_dir is not None:
            values["data_dir"] = Path(data_dir)
        cache_root = cache_root or env.get(ENV_CACHE_DIR) or None
        if cache_root is not None:
            values["cache_root"] = Path(cache_root)
        try:
            return cls(**values)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in err['loc']) or 'config'}: "
                + err["msg"].removeprefix("Value error, ")
                for err in exc.errors()
            )
            raise BrokerConfigError(problems) from None

    # Paths and derived values. The validator has filled data_dir and cache_root, hence the asserts.

    @property
    def home(self) -> Path:
        """The broker's data dir."""
        assert self.data_dir is not None
        return self.data_dir

    @property
    def bootstrap(self) -> str:
        """The bootstrap address clients use, HOST:PORT."""
        return f"{HOST}:{self.port}"

    @property
    def sasl_ssl_bootstrap(self) -> str | None:
        """The SASL_SSL listener's address HOST:PORT, or None when it is off."""
        return None if self.sasl_ssl_port is None else f"{HOST}:{self.sasl_ssl_port}"

    @property
    def keystore_file(self) -> Path:
        """The SASL_SSL listener's PEM keystore (key and certificate chain), in the data dir."""
        return self.home / "tls" / "keystore.pem"

    @property
    def major(self) -> int:
        """The Kafka major version (3 or 4+): it decides the POM and the logging backend."""
        return int(self.version.split(".", 1)[0])

    @property
    def lib_dir(self) -> Path:
        """The jar cache of this version: the broker's whole classpath."""
        assert self.cache_root is not None
        return self.cache_root / self.version / "lib"

    @property
    def log_dirs(self) -> Path:
        """Kafka's log.dirs: topic data and the metadata log. Never deleted by this module."""
        return self.home / "kraft"

    @property
    def pid_file(self) -> Path:
        """File holding the pid of the running broker."""
        return self.home / "broker.pid"

    @property
    def owner_file(self) -> Path:
        """File the broker process holds open, under an exclusive flock, while it lives."""
        return self.home / "broker.owner"

    @property
    def state_file(self) -> Path:
        """File describing the running broker (version, ports)."""
        return self.home / "broker.json"

    @property
    def log_file(self) -> Path:
        """The broker's stdout and stderr."""
        return self.home / "broker.log"

    @property
    def properties_file(self) -> Path:
        """The rendered server.properties."""
        return self.home / "server.properties"

    @property
    def cluster_id_file(self) -> Path:
        """File holding the cluster id the storage was formatted with."""
        return self.home / "cluster.id"

    @property
    def formatted_version_file(self) -> Path:
        """File holding the Kafka version that formatted the storage."""
        return self.home / "formatted.version"


def _env_int(name: str) -> int:
    """Read an integer env var, with an error that names the variable."""
    raw = os.environ[name]
    try:
        return int(raw)
    except ValueError:
        msg = f"{name} must be an integer port number"
        raise BrokerConfigError(msg) from None


@dataclass(frozen=True)
class BrokerStatus:
    """What `status()` found; `version` is the running broker's, else the configured one."""

    running: bool
    pid: int | None
    bootstrap: str
    controller: str
    version: str
    data_dir: str
    #: The SASL_SSL listener's address when the running broker has one.
    sasl_ssl: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the stable `broker status --json` shape)."""
        return asdict(self)


@dataclass(frozen=True)
class StartResult:
    """What `start()` did: started a broker, or found one already running."""

    pid: int
    already_running: bool


# --------------------------------------------------------------------------------------- templates


def templates_dir() -> Path:
    """Locate deploy/kafka: beside the source tree, else installed under sys.prefix/share."""
    candidates = (
        Path(__file__).resolve().parents[3] / "deploy" / "kafka",
        Path(sys.prefix) / "share" / "sessionfold" / "kafka",
    )
    for candidate in candidates:
        if (candidate / "server.properties").is_file():
            return candidate
    msg = "Kafka templates not found; looked in: " + ", ".join(str(c) for c in candidates)
    raise BrokerError(msg)


def _pom_template(config: BrokerConfig) -> Path:
    # 3.x uses log4j 1 (reload4j), 4.x uses log4j2: the two POMs differ only in that backend.
    name = "pom-3.9.xml" if config.major == 3 else "pom-4.x.xml"
    return templates_dir() / name


def _log_option(config: BrokerConfig) -> str:
    """The JVM flag that points the logging backend of this Kafka line at its config file."""
    if config.major == 3:
        # A file: URI (not a bare path) because log4j 1 reads the option as a URL.
        return f"-Dlog4j.configuration={(templates_dir() / 'log4j.properties').as_uri()}"
    return f"-Dlog4j2.configurationFile={templates_dir() / 'log4j2.properties'}"


# -------------------------------------------------------------------------------------------- jars


def _require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        hint = "install OpenJDK 17" if name == "java" else "install Apache Maven 3.8+"
        msg = f"`{name}` not found on PATH; {hint} to run the local Kafka broker"
        raise BrokerError(msg)
    return path


def _jars_present(config: BrokerConfig) -> bool:
    # lib/ only ever appears by renaming a complete scratch dir (fetch_jars), so one known jar is
    # a sufficient marker of a complete cache.
    return (config.lib_dir / f"kafka_2.13-{config.version}.jar").is_file()


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive flock: CI and a test session never fetch or start the same thing twice."""
    make_private_dirs(lock_path.parent)
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetch_jars(config: BrokerConfig, progress: ProgressFn = _noop) -> Path:
    """Copy the broker's runtime classpath from Maven Central into the jar cache; skip if cached.

    Returns the lib directory. Raises BrokerError when java or mvn is missing or Maven fails.
    """
    _require_tool("java")
    if _jars_present(config):
        return config.lib_dir
    mvn = _require_tool("mvn")
    version_dir = config.lib_dir.parent
    with _locked(version_dir / ".fetch.lock"):
        if _jars_present(config):  # another process fetched while we waited for the lock
            return config.lib_dir
        progress(f"fetching Kafka {config.version} jars from Maven Central into {config.lib_dir}")
        pom = version_dir / "pom.xml"
        shutil.copyfile(_pom_template(config), pom)
        # Copy into a scratch dir and rename: an interrupted fetch never leaves a half-filled lib/.
        scratch = version_dir / f"lib.partial-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        cmd = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={scratch}",
            f"-Dkafka.version={config.version}",
        ]
        started = time.monotonic()
        try:
            proc = subprocess.run(
                cmd,
                cwd=version_dir,
                capture_output=True,
                text=True,
                check=False,
                stdin=subprocess.DEVNULL,
                # A cold fetch takes under a minute; a stalled download must not eat a CI run.
                timeout=_MVN_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            shutil.rmtree(scratch, ignore_errors=True)
            msg = f"Maven did not finish fetching Kafka {config.version} in {_MVN_TIMEOUT_S:.0f}s"
            raise BrokerError(msg) from None
        if proc.returncode != 0 or not (scratch / f"kafka_2.13-{config.version}.jar").is_file():
            shutil.rmtree(scratch, ignore_errors=True)
            output = _ANSI_RE.sub("", proc.stdout + proc.stderr)
            errors: list[str] = []
            for line in output.splitlines():
                if line.startswith("[ERROR]"):
                    if not line[len("[ERROR]") :].strip():
                        break  # Maven's generic "re-run with -e / -X" advice follows
                    errors.append(line)
            detail = "\n".join(errors[:8] or output.splitlines()[-12:])
            msg = (
                f"Maven could not fetch Kafka {config.version} (exit {proc.returncode}); "
                f"POM: {pom}\n{detail}"
            )
            raise BrokerError(msg)
        shutil.rmtree(config.lib_dir, ignore_errors=True)
        scratch.rename(config.lib_dir)
        count = sum(1 for _ in config.lib_dir.glob("*.jar"))
        progress(f"fetched {count} jars in {time.monotonic() - started:.1f}s")
    return config.lib_dir


# ------------------------------------------------------------------------------------------ format


@dataclass(frozen=True)
class SaslUser:
    """One user of the SASL_SSL listener; the password never shows in a repr."""

    name: str
    password: str = field(repr=False)


_USER_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def read_sasl_users(path: Path) -> list[SaslUser]:
    """The users file: one `name:password` a line; blank lines and `#` comments are skipped.

    Names are [A-Za-z0-9._-]; a password may hold any printable character but `"` and `\\`
    (they would need escaping in the JAAS config). Errors name the line, never the password.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"cannot read the users file {path}: {type(exc).__name__}"
        raise BrokerConfigError(msg) from None
    users: list[SaslUser] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, password = line.partition(":")
        bad_password = any(c in '"\\' or not c.isprintable() for c in password)
        if not sep or not _USER_NAME_RE.match(name) or not password or bad_password:
            msg = (
                f"{path} line {number}: expected name:password (name of A-Z a-z 0-9 . _ -; "
                'a password without " or \\)'
            )
            raise BrokerConfigError(msg)
        users.append(SaslUser(name, password))
    if not users:
        msg = f"{path} names no user"
        raise BrokerConfigError(msg)
    return users


def _listeners(config: BrokerConfig) -> dict[str, str]:
    listeners = [
        f"PLAINTEXT://{HOST}:{config.port}",
        f"CONTROLLER://{HOST}:{config.controller_port}",
    ]
    advertised = [f"PLAINTEXT://{HOST}:{config.port}"]
    protocols = ["CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT"]
    if config.sasl_ssl_port is not None:
        listeners.append(f"SASL_SSL://{HOST}:{config.sasl_ssl_port}")
        advertised.append(f"SASL_SSL://{HOST}:{config.sasl_ssl_port}")
        protocols.append("SASL_SSL:SASL_SSL")
    return {
        "listeners": ",".join(listeners),
        "advertised_listeners": ",".join(advertised),
        "protocol_map": ",".join(protocols),
    }


def _write_keystore(config: BrokerConfig) -> Path:
    """Join the PEM key and certificate chain into the one file Kafka's PEM keystore reads."""
    assert config.tls_certfile is not None and config.tls_keyfile is not None
    try:
        key = config.tls_keyfile.read_text(encoding="ascii")
        chain = config.tls_certfile.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"cannot read --tls-certfile/--tls-keyfile: {type(exc).__name__}"
        raise BrokerConfigError(msg) from None
    if "PRIVATE KEY-----" not in key or "BEGIN CERTIFICATE-----" not in chain:
        msg = "--tls-keyfile must be a PEM private key and --tls-certfile a PEM certificate chain"
        raise BrokerConfigError(msg)
    config.keystore_file.parent.mkdir(mode=0o700, exist_ok=True)
    _write_private(config.keystore_file, key.rstrip("\n") + "\n" + chain)
    return config.keystore_file


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (it holds a key or passwords)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older file may have been created with looser bits
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def _security_block(config: BrokerConfig) -> str:
    """server.properties lines of the SASL_SSL listener (empty when it is off)."""
    if config.sasl_ssl_port is None:
        return ""
    assert config.sasl_users_file is not None
    users = read_sasl_users(config.sasl_users_file)
    keystore = _write_keystore(config)
    plain_users = " ".join(f'user_{u.name}="{u.password}"' for u in users)
    prefix = "listener.name.sasl_ssl"
    mechanisms = ",".join(_SASL_MECHANISMS)
    return "\n".join(
        [
            "# SASL_SSL listener for clients (broker up --sasl-ssl-port). PLAIN users are listed",
            "# here; SCRAM users are created through the admin API once the broker answers.",
            f"sasl.enabled.mechanisms={mechanisms}",
            f"{prefix}.sasl.enabled.mechanisms={mechanisms}",
            f"{prefix}.plain.sasl.jaas.config="
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};",
            f"{prefix}.scram-sha-256.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            f"{prefix}.scram-sha-512.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            f"{prefix}.ssl.keystore.type=PEM",
            f"{prefix}.ssl.keystore.location={keystore}",
            "",
        ]
    )


def _render_properties(config: BrokerConfig) -> Path:
    template = string.Template((templates_dir() / "server.properties").read_text(encoding="utf-8"))
    text = template.substitute(
        controller_port=config.controller_port,
        log_dirs=config.log_dirs,
        security=_security_block(config),
        **_listeners(config),
    )
    # Private: with a SASL_SSL listener it holds the PLAIN users' passwords.
    _write_private(config.properties_file, text)
    return config.properties_file


def _cluster_id(config: BrokerConfig) -> str:
    """Return the data dir's cluster id, creating it on first use."""
    if config.cluster_id_file.is_file():
        return config.cluster_id_file.read_text(encoding="utf-8").strip()
    # Same 22-character URL-safe form as `StorageTool random-uuid` (Kafka's Uuid.toString). Like
    # Kafka's Uuid.randomUuid, skip ids starting with "-": command-line parsers take them for flags.
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not cluster_id.startswith("-"):
            break
    config.cluster_id_file.write_text(cluster_id + "\n", encoding="utf-8")
    return cluster_id


def format_storage(config: BrokerConfig, progress: ProgressFn = _noop) -> bool:
    """Format log.dirs for KRaft once. Returns True if it formatted, False if already formatted."""
    java = _require_tool("java")
    make_private_dirs(config.home)  # the topics' records: what sessions say
    properties = _render_properties(config)
    if (config.log_dirs / "meta.properties").is_file():
        _check_downgrade(config)
        return False
    cluster_id = _cluster_id(config)
    progress(f"formatting {config.log_dirs} (cluster id {cluster_id})")
    # Static voters in server.properties: no --standalone (it is an error together with voters).
    # --ignore-formatted makes a retry after a half-done first attempt harmless.
    cmd = [
        java,
        _log_option(config),
        "-cp",
        str(config.lib_dir / "*"),
        _STORAGE_TOOL,
        "format",
        # One token with "=": an id from an older cluster.id file may still start with "-".
        f"--cluster-id={cluster_id}",
        "-c",
        str(properties),
        "--ignore-formatted",
    ]
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            check=False,
            stdin=subprocess.DEVNULL,
            timeout=_FORMAT_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        msg = f"StorageTool format did not finish in {_FORMAT_TIMEOUT_S:.0f}s for {config.log_dirs}"
        raise BrokerError(msg) from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-_LOG_TAIL_LINES:])
        msg = f"StorageTool format failed (exit {proc.returncode}) for {config.log_dirs}\n{tail}"
        raise BrokerError(msg)
    config.formatted_version_file.write_text(config.version + "\n", encoding="ascii")
    return True


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _check_downgrade(config: BrokerConfig) -> None:
    """Refuse a broker older than the one that formatted the data dir, with a clear message.

    A 4.x metadata log has feature levels 3.9 does not know; the broker would die at startup with
    "No MetadataVersion with feature level N". Upgrades (3.9 -> 4.x) are fine.
    """
    try:
        formatted = config.formatted_version_file.read_text(encoding="ascii").strip()
        older = _version_key(config.version)[:2] < _version_key(formatted)[:2]
    except (OSError, ValueError):
        return
    if older:
        msg = (
            f"data dir {config.home} was formatted by Kafka {formatted}; Kafka {config.version} "
            f"cannot read it: use --kafka-version {formatted} or another --data-dir"
        )
        raise BrokerError(msg)


# ----------------------------------------------------------------------------------------- process


def _reap(pid: int) -> None:
    """Collect an exited child so it does not linger as a zombie that looks alive."""
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is not None:
            _CHILDREN.pop(pid, None)
        return
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _proc_state(pid: int) -> str | None:
    """The one-letter state of `pid` from /proc (R, S, Z, ...), or None if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"


def _holds_file(pid: int, target: str) -> bool:
    """True if one of `pid`'s open file descriptors points at the real path `target`."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return False
    for name in names:
        with contextlib.suppress(OSError):
            if os.readlink(f"{fd_dir}/{name}") == target:
                return True
    return False


def _cmdline_names_data_dir(pid: int, config: BrokerConfig) -> bool:
    """True if `pid` runs kafka.Kafka on this data dir's server.properties (once it has exec'd)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    args = [part.decode("utf-8", "replace") for part in cmdline]
    return _KAFKA_MAIN in args and str(config.properties_file) in args


def _is_our_broker(pid: int, config: BrokerConfig) -> bool:
    """True if `pid` is alive and is the broker process of this data dir.

    The process holds the data dir's owner file from the moment it is forked (the descriptor is
    inherited through exec), so this is true even before the JVM's command line exists: reading
    /proc/PID/cmdline alone races with the exec. The command line is the fallback for a broker
    started without an owner file. Both guard against a stale pid file whose pid now belongs to an
    unrelated process: we must never signal that one.
    """
    if pid == os.getpid():
        return False  # `start()` holds the owner file for a moment while it spawns the broker
    _reap(pid)
    if _proc_state(pid) in {None, "Z", "X"}:
        return False
    owner = os.path.realpath(config.owner_file)
    return _holds_file(pid, owner) or _cmdline_names_data_dir(pid, config)


def broker_pids(config: BrokerConfig) -> list[int]:
    """Every live process that is this data dir's broker, found in /proc (pid file or not).

    Normally one; more only if something went wrong (a broker started twice on one data dir).
    """
    pids: list[int] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _is_our_broker(int(entry), config):
            pids.append(int(entry))
    return sorted(pids)


def _owner_held(config: BrokerConfig) -> bool:
    """True while a broker process of this data dir lives (it holds the owner file's flock).

    Checked with a shared, non-blocking lock that is dropped at once, so two checks never make each
    other look like a broker, and the exclusive lock of a spawning `start()` waits them out.
    """
    try:
        handle = config.owner_file.open("rb")
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def _pid_file_pid(config: BrokerConfig) -> int | None:
    try:
        return int(config.pid_file.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


def read_pid(config: BrokerConfig) -> int | None:
    """Return the pid of this data dir's running broker, or None.

    The pid file is a hint: a stale one is ignored, and a broker whose pid file is gone is still
    found in /proc (by its owner file or its command line).
    """
    pid = _pid_file_pid(config)
    if pid is not None and _is_our_broker(pid, config):
        return pid
    pids = broker_pids(config)
    return pids[0] if pids else None


def _broker_alive(config: BrokerConfig) -> bool:
    """True while this data dir's broker lives, without racing its exec (see _is_our_broker)."""
    pid = _pid_file_pid(config)
    if pid is not None:
        _reap(pid)  # an exited child of ours must stop holding anything as a zombie
    return _owner_held(config) or read_pid(config) is not None


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0


def free_port_pair() -> int:
    """A free port P on 127.0.0.1 whose neighbour P + 1 (the controller port) is free too."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind((HOST, 0))
            port = int(first.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind((HOST, port + 1))
                except OSError:
                    continue
        return port
    raise BrokerError("no free port pair found")


def _rotate_log(config: BrokerConfig) -> None:
    # One previous run is kept: enough to see why the last broker died, bounded on disk.
    if config.log_file.exists():
        config.log_file.replace(config.log_file.with_name(config.log_file.name + ".1"))


def log_tail(config: BrokerConfig, lines: int = _LOG_TAIL_LINES) -> str:
    """The last lines of the broker log (empty if there is none)."""
    try:
        text = config.log_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _broker_command(config: BrokerConfig, java: str) -> list[str]:
    """The command line of the broker JVM of this data dir."""
    return [
        java,
        *_JVM_OPTS,
        _log_option(config),
        f"-Dkafka.logs.dir={config.home / 'logs'}",
        "-cp",
        str(config.lib_dir / "*"),
        _KAFKA_MAIN,
        str(config.properties_file),
    ]


_OWNER_LOCK_WAIT_S = 10.0


def _lock_owner_file(config: BrokerConfig) -> int:
    """Open the owner file and take its exclusive flock; return the descriptor.

    Waits out momentary shared locks of `_owner_held` checks; a lock held longer means a process
    this module cannot see (another user's?) owns the data dir.
    """
    fd = os.open(config.owner_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + _OWNER_LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                msg = f"{config.owner_file} is held by another process: is a broker running there?"
                raise BrokerError(msg) from None
            time.sleep(0.1)


def _spawn_owning(config: BrokerConfig, cmd: list[str]) -> subprocess.Popen[bytes]:
    """Spawn the broker holding the owner file's flock from fork onward, so it is never unowned.

    The child inherits the locked descriptor (pass_fds) and keeps it through exec; once this
    process closes its copy, the lock lives exactly as long as the broker does.
    """
    fd = _lock_owner_file(config)
    try:
        with config.log_file.open("ab") as log_handle:
            # start_new_session: the broker gets its own session and process group, so the CLI's
            # exit, a Ctrl-C in its terminal or a test runner's process group do not take it down.
            return subprocess.Popen(
                cmd,
                cwd=config.home,
                stdin=subprocess.DEVNULL,
                stdout=log_handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                pass_fds=(fd,),
            )
    finally:
        os.close(fd)


def start(config: BrokerConfig, progress: ProgressFn = _noop) -> StartResult:
    """Start the broker in the background, detached; a no-op if it is already running.

    Fetches jars and formats storage first when needed. Returns once the java process is spawned;
    call `wait_ready()` to wait until it answers.
    """
    make_private_dirs(config.home)  # the topics' records: what sessions say
    with _locked(config.home / ".broker.lock"):
        pid = read_pid(config)
        if pid is not None:
            running = status(config)
            progress(
                f"broker already running (pid {pid}, {running.bootstrap}, "
                f"Kafka {running.version}, data dir {config.home})"
            )
            return StartResult(pid=pid, already_running=True)
        for port in (config.port, config.controller_port, config.sasl_ssl_port):
            if port is not None and _port_in_use(port):
                msg = f"port {port} is already in use by another process; pick another --port"
                raise BrokerError(msg)
        fetch_jars(config, progress)
        format_storage(config, progress)
        _rotate_log(config)
        cmd = _broker_command(config, _require_tool("java"))
        progress(f"starting Kafka {config.version} on {config.bootstrap} (data dir {config.home})")
        child = _spawn_owning(config, cmd)
        _CHILDREN[child.pid] = child
        config.pid_file.write_text(f"{child.pid}\n", encoding="ascii")
        state = {
            "pid": child.pid,
            "version": config.version,
            "port": config.port,
            "controller_port": config.controller_port,
            "sasl_ssl_port": config.sasl_ssl_port,
        }
        config.state_file.write_text(json.dumps(state) + "\n", encoding="utf-8")
        log.info("kafka broker started pid=%d port=%d", child.pid, config.port)
        return StartResult(pid=child.pid, already_running=False)


@contextlib.contextmanager
def _quiet_kafka_client() -> Iterator[None]:
    # kafka-python logs every refused connection at WARNING/ERROR; while polling a broker that is
    # still starting those are expected, and without handlers they would spill onto stderr.
    client_logger = logging.getLogger("kafka")
    previous = client_logger.level
    client_logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        client_logger.setLevel(previous)


def probe(
    bootstrap: str, timeout_s: float = 5.0, security: KafkaSecurity = PLAINTEXT_SECURITY
) -> bool:
    """True if a Kafka broker at `bootstrap` (HOST:PORT) answers a metadata request."""
    return _probe_with(bootstrap, timeout_s, kafka_python_options(security))


def _probe_with(bootstrap: str, timeout_s: float, client_options: dict[str, Any]) -> bool:
    host, _, port_text = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host or HOST, int(port_text)), timeout=min(timeout_s, 2.0)):
            pass
    except (OSError, ValueError):
        return False
    # Imported here: the CLI's other commands should not pay for kafka-python's import.
    from sessionfold.streams.kafka import clients

    with _quiet_kafka_client():
        try:
            admin = clients.admin(
                bootstrap,
                "sessionfold-broker-probe",
                timeout_s=max(timeout_s, 1.0),
                **client_options,
            )
        except Exception:  # any failure to bootstrap means "not answering yet"
            return False
        try:
            admin.list_topics()
        except Exception:
            return False
        finally:
            with contextlib.suppress(Exception):
                admin.close()
    return True


def wait_ready(
    config: BrokerConfig,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
    progress: ProgressFn = _noop,
) -> None:
    """Block until the broker answers a metadata request; raise BrokerError on death or timeout.

    An open port is not enough (reference §2.2): the metadata request proves the broker has joined
    its own quorum and can serve clients.
    """
    deadline = time.monotonic() + timeout_s
    progress(f"waiting for {config.bootstrap} to answer (up to {timeout_s:.0f}s)")
    started = time.monotonic()
    while True:
        if not _broker_alive(config):
            config.pid_file.unlink(missing_ok=True)
            msg = (
                f"Kafka broker process exited before answering; log: {config.log_file}\n"
                f"{log_tail(config)}"
            )
            raise BrokerError(msg)
        remaining = deadline - time.monotonic()
        if probe(config.bootstrap, timeout_s=max(min(remaining, 5.0), 1.0)):
            progress(
                f"broker answers on {config.bootstrap} after {time.monotonic() - started:.1f}s"
            )
            return
        if time.monotonic() >= deadline:
            msg = (
                f"Kafka broker did not answer on {config.bootstrap} within {timeout_s:.0f}s; "
                f"log: {config.log_file}\n{log_tail(config)}"
            )
            raise BrokerError(msg)
        time.sleep(0.5)


def up(
    config: BrokerConfig,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
    progress: ProgressFn = _noop,
) -> StartResult:
    """Fetch, format, start and wait until the broker answers.

    If a broker this call started does not answer in time it is stopped again, so a failed `up`
    leaves nothing behind; a broker that was already running is left alone.
    """
    result = start(config, progress)
    try:
        wait_ready(config, timeout_s, progress)
        if config.sasl_ssl_port is not None:
            if result.already_running and status(config).sasl_ssl != config.sasl_ssl_bootstrap:
                msg = (
                    f"the broker of {config.home} already runs without a SASL_SSL listener on "
                    f"{config.sasl_ssl_bootstrap}; run `sessionfold broker down` first"
                )
                raise BrokerError(msg)
            open_sasl_ssl(config, timeout_s, progress)
    except BrokerError:
        if not result.already_running:
            stop(config)
        raise
    return result


def _create_scram_users(config: BrokerConfig, users: list[SaslUser]) -> None:
    """Create or update every user's SCRAM-SHA-256 and -512 credentials (over PLAINTEXT)."""
    from kafka.admin import UserScramCredentialUpsertion

    from sessionfold.streams.kafka import clients

    admin = clients.admin(config.bootstrap, "sessionfold-broker")
    errors: dict[str, str] = {}
    try:
        # One request per mechanism: the broker refuses a user altered twice in one request.
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            upserts = [UserScramCredentialUpsertion(u.name, mechanism, u.password) for u in users]
            answer = admin.alter_user_scram_credentials(upserts)
            errors.update({name: error for name, error in answer.items() if error})
    finally:
        admin.close()
    if errors:
        name = min(errors)
        msg = f"the broker refused the SCRAM credentials of user {name}: {errors[name]}"
        raise BrokerError(msg)


def _unverified_tls() -> ssl.SSLContext:
    # Only for the broker's own readiness check on loopback: it proves the listener authenticates
    # users; verifying the certificate is the clients' job, with their CA file.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def open_sasl_ssl(
    config: BrokerConfig,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
    progress: ProgressFn = _noop,
) -> None:
    """Create the SCRAM users, then wait until the SASL_SSL listener lets the first one in."""
    assert config.sasl_users_file is not None and config.sasl_ssl_bootstrap is not None
    users = read_sasl_users(config.sasl_users_file)
    _create_scram_users(config, users)
    # SCRAM credentials reach the listener through the metadata log: a client that connects at
    # once may still be refused, so `up` returns only when a SCRAM login works.
    options = {
        "security_protocol": "SASL_SSL",
        "ssl_context": _unverified_tls(),
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": users[0].name,
        "sasl_plain_password": users[0].password,
    }
    deadline = time.monotonic() + timeout_s
    while not _probe_with(config.sasl_ssl_bootstrap, 5.0, options):
        if time.monotonic() >= deadline:
            msg = (
                f"the SASL_SSL listener {config.sasl_ssl_bootstrap} did not let a SCRAM user in "
                f"within {timeout_s:.0f}s; log: {config.log_file}\n{log_tail(config)}"
            )
            raise BrokerError(msg)
        time.sleep(0.5)
    progress(
        f"SASL_SSL listener on {config.sasl_ssl_bootstrap} "
        f"({len(users)} user(s), PLAIN and SCRAM-SHA-256/512)"
    )


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _wait_gone(pid: int, config: BrokerConfig, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _is_our_broker(pid, config):
            return True
        time.sleep(0.2)
    return not _is_our_broker(pid, config)


def stop(
    config: BrokerConfig,
    timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
    progress: ProgressFn = _noop,
) -> bool:
    """Stop the broker: SIGTERM (a clean controlled shutdown), then SIGKILL after `timeout_s`.

    Returns True if a broker was running. The data dir, and so every topic, is kept.
    """
    if not config.home.is_dir():
        return False
    with _locked(config.home / ".broker.lock"):
        pids = broker_pids(config)
        if not pids:
            config.pid_file.unlink(missing_ok=True)
            return False
        shown = ", ".join(str(pid) for pid in pids)
        progress(f"stopping broker (pid {shown}, {config.bootstrap})")
        started = time.monotonic()
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        survivors = [pid for pid in pids if not _wait_gone(pid, config, timeout_s)]
        for pid in survivors:
            progress(f"broker pid {pid} ignored SIGTERM for {timeout_s:.0f}s; sending SIGKILL")
            _signal(pid, signal.SIGKILL)
        alive = [pid for pid in survivors if not _wait_gone(pid, config, 10.0)]
        if alive:
            msg = f"broker pid {alive[0]} is still alive after SIGKILL"
            raise BrokerError(msg)
        for pid in pids:
            _CHILDREN.pop(pid, None)
        config.pid_file.unlink(missing_ok=True)
        config.state_file.unlink(missing_ok=True)
        progress(f"broker stopped in {time.monotonic() - started:.1f}s")
        log.info("kafka broker stopped pids=%s port=%d", shown, config.port)
        return True


def status(config: BrokerConfig) -> BrokerStatus:
    """Report whether this data dir's broker runs, its pid, address, version and data dir."""
    pid = read_pid(config)
    version, port, controller_port = config.version, config.port, config.controller_port
    sasl_ssl_port = config.sasl_ssl_port
    if pid is not None:
        # The running broker's own record wins over the (possibly different) requested config.
        try:
            state = json.loads(config.state_file.read_text(encoding="utf-8"))
            version = str(state.get("version", version))
            port = int(state.get("port", port))
            controller_port = int(state.get("controller_port", controller_port))
            sasl_ssl_port = state.get("sasl_ssl_port")
        except (OSError, ValueError, TypeError):
            pass
    return BrokerStatus(
        running=pid is not None,
        pid=pid,
        bootstrap=f"{HOST}:{port}",
        controller=f"{HOST}:{controller_port}",
        version=version,
        data_dir=str(config.home),
        sasl_ssl=None if pid is None or sasl_ssl_port is None else f"{HOST}:{sasl_ssl_port}",
    )
