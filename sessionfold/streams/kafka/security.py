"""How every Kafka client of sessionfold authenticates: one settings object, three mappings.

`KafkaSecurity` holds the security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), the TLS
files (CA, client certificate and key, all PEM) and the SASL mechanism and credentials (PLAIN,
SCRAM-SHA-256, SCRAM-SHA-512). The same object is mapped to

* kafka-python's keyword arguments (`kafka_python_options`: publish, topics, replay, the state
  API's ref reader, the worker's setup, the broker probe),
* aiokafka's (`aiokafka_options`: the benchmark's raw consumer),
* Faust's `broker_credentials` (`faust_credentials`: the workers),

so a setting means the same in every client. The password is a `SecretStr`: it never shows in a
repr, a log line or an error message, and the CLI reads it from the environment or a file only,
never from its command line (where `ps` would show it).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError, model_validator

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Mechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
PROTOCOLS: tuple[Protocol, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS: tuple[Mechanism, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

ENV_PROTOCOL = "SESSIONFOLD_SECURITY_PROTOCOL"
ENV_CAFILE = "SESSIONFOLD_SSL_CAFILE"
ENV_CERTFILE = "SESSIONFOLD_SSL_CERTFILE"
ENV_KEYFILE = "SESSIONFOLD_SSL_KEYFILE"
ENV_MECHANISM = "SESSIONFOLD_SASL_MECHANISM"
ENV_USERNAME = "SESSIONFOLD_SASL_USERNAME"
ENV_PASSWORD = "SESSIONFOLD_SASL_PASSWORD"
ENV_PASSWORD_FILE = "SESSIONFOLD_SASL_PASSWORD_FILE"
#: Every variable the security settings are read from (e.g. to keep them from a subprocess).
ENV_NAMES = (
    ENV_PROTOCOL,
    ENV_CAFILE,
    ENV_CERTFILE,
    ENV_KEYFILE,
    ENV_MECHANISM,
    ENV_USERNAME,
    ENV_PASSWORD,
    ENV_PASSWORD_FILE,
)


class KafkaSecurityError(ValueError):
    """Security settings that cannot work together (a usage error); the message names options."""


class KafkaSecurity(BaseModel):
    """How to connect to the brokers: protocol, TLS files, SASL mechanism and credentials."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    protocol: Protocol = "PLAINTEXT"
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    sasl_mechanism: Mechanism = "PLAIN"
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None

    @property
    def uses_tls(self) -> bool:
        """Whether connections are encrypted (SSL or SASL_SSL)."""
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        """Whether connections authenticate with SASL (SASL_PLAINTEXT or SASL_SSL)."""
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecurity:
        # A TLS file or a user name given with a protocol that would ignore it is almost always
        # a forgotten --security-protocol: say so rather than connect without it.
        tls_files = (self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile)
        if not self.uses_tls and any(f is not None for f in tls_files):
            msg = (
                "--ssl-cafile/--ssl-certfile/--ssl-keyfile need --security-protocol SSL or SASL_SSL"
            )
            raise ValueError(msg)
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError("--ssl-keyfile needs --ssl-certfile")
        if self.uses_sasl:
            if not self.sasl_username:
                msg = f"--security-protocol {self.protocol} needs --sasl-username"
                raise ValueError(msg)
            if self.sasl_password is None:
                msg = (
                    f"--security-protocol {self.protocol} needs a password: set {ENV_PASSWORD} "
                    "or --sasl-password-file"
                )
                raise ValueError(msg)
        elif self.sasl_username:
            raise ValueError("--sasl-username needs --security-protocol SASL_PLAINTEXT or SASL_SSL")
        return self


PLAINTEXT = KafkaSecurity()


def read_password(password_file: Path | None, environ: Mapping[str, str]) -> SecretStr | None:
    """The SASL password: the file's first line if a file is given, else SESSIONFOLD_SASL_PASSWORD.

    Only the line break that ends the line is dropped: spaces may be part of a password.
    """
    if password_file is not None:
        try:
            text = password_file.read_text(encoding="utf-8")
        except OSError as exc:
            msg = f"cannot read --sasl-password-file {password_file}: {type(exc).__name__}"
            raise KafkaSecurityError(msg) from None
        lines = text.splitlines()
        return SecretStr(lines[0] if lines else "")
    value = environ.get(ENV_PASSWORD)
    return None if value is None else SecretStr(value)


def _check_readable(option: str, path: Path | None) -> None:
    if path is not None and not (path.is_file() and os.access(path, os.R_OK)):
        msg = f"{option} {path}: not a readable file"
        raise KafkaSecurityError(msg)


def load_security(
    *,
    protocol: str = "PLAINTEXT",
    ssl_cafile: Path | None = None,
    ssl_certfile: Path | None = None,
    ssl_keyfile: Path | None = None,
    sasl_mechanism: str = "PLAIN",
    sasl_username: str | None = None,
    sasl_password_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> KafkaSecurity:
    """Build the settings from option values and the password's env var or file.

    Raises KafkaSecurityError, naming the option, for an unknown protocol or mechanism, a missing
    credential, an unreadable file or options that do not go together.
    """
    environ = os.environ if environ is None else environ
    protocol = protocol.strip().upper()
    if protocol not in PROTOCOLS:
        msg = f"--security-protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}"
        raise KafkaSecurityError(msg)
    mechanism = sasl_mechanism.strip().upper()
    if mechanism not in MECHANISMS:
        msg = f"--sasl-mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}"
        raise KafkaSecurityError(msg)
    for option, path in (
        ("--ssl-cafile", ssl_cafile),
        ("--ssl-certfile", ssl_certfile),
        ("--ssl-keyfile", ssl_keyfile),
        ("--sasl-password-file", sasl_password_file),
    ):
        _check_readable(option, path)
    uses_sasl = protocol in ("SASL_PLAINTEXT", "SASL_SSL")
    # The password env var may be set for the whole shell: it only counts where SASL is used.
    password = read_password(sasl_password_file, environ) if uses_sasl else None
    try:
        return KafkaSecurity(
            protocol=protocol,  # type: ignore[arg-type]
            ssl_cafile=ssl_cafile,
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
            sasl_mechanism=mechanism,  # type: ignore[arg-type]
            sasl_username=sasl_username or None,
            sasl_password=password,
        )
    except ValidationError as exc:
        problems = "; ".join(err["msg"].removeprefix("Value error, ") for err in exc.errors())
        raise KafkaSecurityError(problems) from None


def security_from_env(environ: Mapping[str, str] | None = None) -> KafkaSecurity:
    """The settings the SESSIONFOLD_* variables give (what the CLI options default to)."""
    env = os.environ if environ is None else environ

    def path(name: str) -> Path | None:
        return Path(env[name]) if env.get(name) else None

    return load_security(
        protocol=env.get(ENV_PROTOCOL) or "PLAINTEXT",
        ssl_cafile=path(ENV_CAFILE),
        ssl_certfile=path(ENV_CERTFILE),
        ssl_keyfile=path(ENV_KEYFILE),
        sasl_mechanism=env.get(ENV_MECHANISM) or "PLAIN",
        sasl_username=env.get(ENV_USERNAME) or None,
        sasl_password_file=path(ENV_PASSWORD_FILE),
        environ=env,
    )


# ------------------------------------------------------------------------------------ mappings


def _password(security: KafkaSecurity) -> str:
    assert security.sasl_password is not None  # the validator requires it for SASL
    return security.sasl_password.get_secret_value()


def kafka_python_options(security: KafkaSecurity) -> dict[str, Any]:
    """Keyword arguments for kafka-python's KafkaProducer, KafkaConsumer and KafkaAdminClient."""
    options: dict[str, Any] = {"security_protocol": security.protocol}
    if security.uses_tls:
        options["ssl_check_hostname"] = True
        if security.ssl_cafile is not None:
            options["ssl_cafile"] = str(security.ssl_cafile)
        if security.ssl_certfile is not None:
            options["ssl_certfile"] = str(security.ssl_certfile)
        if security.ssl_keyfile is not None:
            options["ssl_keyfile"] = str(security.ssl_keyfile)
    if security.uses_sasl:
        options["sasl_mechanism"] = security.sasl_mechanism
        options["sasl_plain_username"] = security.sasl_username
        options["sasl_plain_password"] = _password(security)
    return options


def ssl_context(security: KafkaSecurity) -> ssl.SSLContext | None:
    """The client TLS context (server verified against the CA file, or the system's CAs; the
    client certificate loaded when given); None for a protocol without TLS."""
    if not security.uses_tls:
        return None
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH,
        cafile=None if security.ssl_cafile is None else str(security.ssl_cafile),
    )
    if security.ssl_certfile is not None:
        context.load_cert_chain(
            str(security.ssl_certfile),
            None if security.ssl_keyfile is None else str(security.ssl_keyfile),
        )
    return context


def aiokafka_options(security: KafkaSecurity) -> dict[str, Any]:
    """Keyword arguments for aiokafka's AIOKafkaProducer, AIOKafkaConsumer and client."""
    options: dict[str, Any] = {"security_protocol": security.protocol}
    context = ssl_context(security)
    if context is not None:
        options["ssl_context"] = context
    if security.uses_sasl:
        options["sasl_mechanism"] = security.sasl_mechanism
        options["sasl_plain_username"] = security.sasl_username
        options["sasl_plain_password"] = _password(security)
    return options


def faust_credentials(security: KafkaSecurity) -> Any:
    """Faust's `broker_credentials` (SASLCredentials or SSLCredentials); None for PLAINTEXT."""
    # Imported here: only the worker pays for Faust's import.
    import faust

    if security.uses_sasl:
        return faust.SASLCredentials(
            username=security.sasl_username,
            password=_password(security),
            mechanism=security.sasl_mechanism,
            ssl_context=ssl_context(security),  # None keeps SASL_PLAINTEXT
        )
    if security.uses_tls:
        return faust.SSLCredentials(ssl_context(security))
    return None


# --------------------------------------------------------------------------------------- errors

_AUTH_ERRORS = (
    "SaslAuthenticationFailed",
    "SaslAuthenticationFailedError",
    "AuthenticationFailedError",
)
ACCESS_CHECK_TIMEOUT_S = 15.0


class KafkaAccessError(RuntimeError):
    """The brokers refused these credentials, or TLS with them failed; the message is one line."""


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def access_problem(exc: BaseException, bootstrap: str) -> str | None:
    """One line naming refused credentials or a failed TLS handshake behind `exc`; None if it is
    neither. Names error classes only, never their text (which may quote a server message)."""
    chain = _causes(exc)
    if any(type(e).__name__ in _AUTH_ERRORS for e in chain):
        return (
            f"Kafka at {bootstrap} refused the credentials (SASL authentication failed): check "
            "--sasl-username, the password and --sasl-mechanism"
        )
    tls = [e for e in chain if isinstance(e, ssl.SSLError)]
    if tls:
        return (
            f"TLS with Kafka at {bootstrap} failed ({type(tls[0]).__name__}): check "
            "--security-protocol, --ssl-cafile and the client certificate"
        )
    return None


def check_access(
    bootstrap: str, security: KafkaSecurity, timeout_s: float = ACCESS_CHECK_TIMEOUT_S
) -> None:
    """Log in to the first bootstrap broker once; raise KafkaAccessError if it refuses us.

    kafka-python treats a refused SASL login during bootstrap like a broker that is not up yet and
    retries until its bootstrap timeout ends with "Unable to bootstrap". One aiokafka connection
    says at once whether the credentials and TLS files work. Any other failure (a broker that is
    down) is left to the clients, which wait for it as they always do. No-op for PLAINTEXT.
    """
    if security.protocol == "PLAINTEXT":
        return
    import asyncio

    from aiokafka.conn import create_conn

    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")

    async def log_in() -> None:
        conn = await create_conn(
            host or "127.0.0.1",
            int(port),
            client_id="sessionfold-access-check",
            request_timeout_ms=int(timeout_s * 1000),
            **aiokafka_options(security),
        )
        conn.close()

    try:
        asyncio.run(asyncio.wait_for(log_in(), timeout_s))
    except Exception as exc:
        problem = access_problem(exc, bootstrap)
        if problem is not None:
            raise KafkaAccessError(problem) from None
