"""Kafka security settings: what they accept, how they map to each client, what they never show."""

from __future__ import annotations

import ssl
from pathlib import Path

import faust
import pytest
from aiokafka.errors import KafkaConnectionError
from kafka.errors import KafkaTimeoutError, SaslAuthenticationFailedError
from tls_certs import TlsFiles, make_tls_files
from typer.testing import CliRunner

from sessionfold.streams.cli import app
from sessionfold.streams.kafka import security as ks
from sessionfold.streams.worker.app import WorkerSettings, faust_options

SECRET = "pa ss:w0rd"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A CA and a client certificate, in PEM."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def _sasl_ssl(tls: TlsFiles, mechanism: str = "SCRAM-SHA-512") -> ks.KafkaSecurity:
    return ks.load_security(
        protocol="sasl_ssl",
        ssl_cafile=tls.ca_cert,
        ssl_certfile=tls.client_cert,
        ssl_keyfile=tls.client_key,
        sasl_mechanism=mechanism,
        sasl_username="agent",
        environ={ks.ENV_PASSWORD: SECRET},
    )


def test_plaintext_is_the_default_and_maps_to_nothing_else() -> None:
    """No option, no env: PLAINTEXT, and the clients get only the protocol (or no credentials)."""
    security = ks.load_security(environ={})
    assert security == ks.PLAINTEXT
    assert ks.kafka_python_options(security) == {"security_protocol": "PLAINTEXT"}
    assert ks.aiokafka_options(security) == {"security_protocol": "PLAINTEXT"}
    assert ks.faust_credentials(security) is None


def test_sasl_ssl_maps_to_each_client(tls: TlsFiles) -> None:
    """The same settings reach kafka-python, aiokafka and Faust with the same meaning."""
    security = _sasl_ssl(tls)
    assert ks.kafka_python_options(security) == {
        "security_protocol": "SASL_SSL",
        "ssl_check_hostname": True,
        "ssl_cafile": str(tls.ca_cert),
        "ssl_certfile": str(tls.client_cert),
        "ssl_keyfile": str(tls.client_key),
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "agent",
        "sasl_plain_password": SECRET,
    }
    options = ks.aiokafka_options(security)
    context = options.pop("ssl_context")
    assert options == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "agent",
        "sasl_plain_password": SECRET,
    }
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [
        ((("commonName", "sessionfold test CA"),),)
    ]
    credentials = ks.faust_credentials(security)
    assert isinstance(credentials, faust.SASLCredentials)
    assert credentials.protocol.value == "SASL_SSL"
    assert credentials.mechanism.value == "SCRAM-SHA-512"
    assert (credentials.username, credentials.password) == ("agent", SECRET)
    assert credentials.ssl_context is not None


def test_ssl_and_sasl_plaintext_map_to_faust_credentials(tls: TlsFiles) -> None:
    """SSL alone gives SSLCredentials; SASL_PLAINTEXT gives SASL credentials without TLS."""
    ssl_only = ks.load_security(protocol="SSL", ssl_cafile=tls.ca_cert, environ={})
    credentials = ks.faust_credentials(ssl_only)
    assert isinstance(credentials, faust.SSLCredentials)
    assert "sasl_mechanism" not in ks.kafka_python_options(ssl_only)
    plain = ks.load_security(
        protocol="SASL_PLAINTEXT", sasl_username="agent", environ={ks.ENV_PASSWORD: SECRET}
    )
    sasl = ks.faust_credentials(plain)
    assert isinstance(sasl, faust.SASLCredentials)
    assert sasl.protocol.value == "SASL_PLAINTEXT" and sasl.mechanism.value == "PLAIN"
    assert "ssl_context" not in ks.aiokafka_options(plain)


def test_the_worker_hands_its_security_to_faust(tls: TlsFiles) -> None:
    """WorkerSettings.security becomes Faust's broker_credentials."""
    options = faust_options(WorkerSettings(security=_sasl_ssl(tls, "PLAIN")))
    assert isinstance(options["broker_credentials"], faust.SASLCredentials)
    assert options["broker_credentials"].mechanism.value == "PLAIN"
    assert faust_options(WorkerSettings())["broker_credentials"] is None


def test_the_password_file_wins_and_only_its_first_line_counts(tmp_path: Path) -> None:
    """A password file beats the env var; its line break is not part of the password."""
    password_file = tmp_path / "password"
    password_file.write_text(f"{SECRET}\nsecond line\n")
    security = ks.load_security(
        protocol="SASL_PLAINTEXT",
        sasl_username="agent",
        sasl_password_file=password_file,
        environ={ks.ENV_PASSWORD: "from-env"},
    )
    assert ks.kafka_python_options(security)["sasl_plain_password"] == SECRET


def test_the_password_never_shows(tls: TlsFiles) -> None:
    """Not in the settings' repr or str, nor in a worker's settings, nor in Faust's credentials."""
    security = _sasl_ssl(tls)
    shown = [repr(security), str(security), repr(WorkerSettings(security=security))]
    shown.append(repr(ks.faust_credentials(security)))
    assert all(SECRET not in text for text in shown)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"protocol": "TLS"}, "--security-protocol must be one of"),
        ({"protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}, "--sasl-mechanism must be one of"),
        ({"protocol": "SASL_SSL"}, "needs --sasl-username"),
        ({"protocol": "SASL_PLAINTEXT", "sasl_username": "agent"}, "needs a password"),
        ({"protocol": "PLAINTEXT", "sasl_username": "agent"}, "--sasl-username needs"),
        ({"protocol": "PLAINTEXT", "ssl_cafile": "CA"}, "need --security-protocol SSL"),
        ({"protocol": "SSL", "ssl_keyfile": "KEY"}, "--ssl-keyfile needs --ssl-certfile"),
        ({"protocol": "SSL", "ssl_cafile": "missing.pem"}, "--ssl-cafile missing.pem: not a"),
    ],
)
def test_settings_that_cannot_work_are_refused_by_name(
    tls: TlsFiles, options: dict[str, str], problem: str
) -> None:
    """Each misfit raises KafkaSecurityError naming the option to fix."""
    files = {"CA": tls.ca_cert, "KEY": tls.client_key, "missing.pem": Path("missing.pem")}
    values: dict[str, object] = {
        k: files.get(v, v) if k.startswith("ssl_") else v for k, v in options.items()
    }
    with pytest.raises(ks.KafkaSecurityError, match=problem):
        ks.load_security(**values, environ={})  # type: ignore[arg-type]


def test_the_password_env_var_alone_does_not_turn_sasl_on() -> None:
    """A password exported for the whole shell is ignored where the protocol has no SASL."""
    security = ks.load_security(protocol="SSL", environ={ks.ENV_PASSWORD: SECRET})
    assert security.sasl_password is None


def test_security_from_env_reads_every_variable(tls: TlsFiles) -> None:
    """What the bench and the CLI defaults read: the SESSIONFOLD_* variables."""
    env = {
        ks.ENV_PROTOCOL: "SASL_SSL",
        ks.ENV_CAFILE: str(tls.ca_cert),
        ks.ENV_CERTFILE: str(tls.client_cert),
        ks.ENV_KEYFILE: str(tls.client_key),
        ks.ENV_MECHANISM: "SCRAM-SHA-512",
        ks.ENV_USERNAME: "agent",
        ks.ENV_PASSWORD: SECRET,
    }
    assert ks.security_from_env(env) == _sasl_ssl(tls)


def test_access_problems_are_named_without_their_text() -> None:
    """A refused login and a TLS failure each get one line; other failures are not theirs."""
    refused = SaslAuthenticationFailedError("server said: bad password for agent")
    assert "refused the credentials" in (ks.access_problem(refused, "h:1") or "")
    assert "bad password" not in (ks.access_problem(refused, "h:1") or "")
    wrapped = KafkaConnectionError("connect failed")
    wrapped.__cause__ = ssl.SSLCertVerificationError("certificate verify failed")
    assert "TLS with Kafka at h:1 failed" in (ks.access_problem(wrapped, "h:1") or "")
    assert ks.access_problem(KafkaTimeoutError("Unable to bootstrap"), "h:1") is None


@pytest.mark.parametrize("command", ["publish", "worker", "replay", "context"])
def test_every_kafka_command_has_the_security_block_and_no_password_option(command: str) -> None:
    """The same options on every command that talks to Kafka; a password has no option."""
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for option in (
        "--security-protocol",
        "--ssl-cafile",
        "--ssl-certfile",
        "--ssl-keyfile",
        "--sasl-mechanism",
        "--sasl-username",
        "--sasl-password-file",
    ):
        assert option in result.stdout
    assert "--sasl-password " not in result.stdout


def test_a_misfit_is_a_usage_error_before_any_connection() -> None:
    """SASL without a user name: exit 2 and the reason, without reaching for a broker."""
    args = ["replay", "--bootstrap", "127.0.0.1:1", "--security-protocol", "SASL_SSL"]
    result = CliRunner().invoke(app, args, env={ks.ENV_PASSWORD: SECRET})
    assert result.exit_code == 2
    assert "needs --sasl-username" in result.stderr
    assert SECRET not in result.output
