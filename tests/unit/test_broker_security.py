"""The broker's SASL_SSL listener settings: validation, the users file, the rendered files."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from tls_certs import TlsFiles, make_tls_files

from sessionfold.streams.tools import broker

PASSWORD = "pass word:1"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A CA and a server certificate for 127.0.0.1."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def _config(tmp_path: Path, tls: TlsFiles, users: str) -> broker.BrokerConfig:
    users_file = tmp_path / "users"
    users_file.write_text(users)
    return broker.BrokerConfig(
        port=40000,
        data_dir=tmp_path / "kafka",
        sasl_ssl_port=40010,
        tls_certfile=tls.server_cert,
        tls_keyfile=tls.server_key,
        sasl_users_file=users_file,
    )


def test_the_sasl_ssl_listener_is_rendered_beside_plaintext(tmp_path: Path, tls: TlsFiles) -> None:
    """PLAINTEXT stays (controller, inter-broker, probe); SASL_SSL is added with a PEM keystore;
    the files holding the key and the PLAIN passwords are readable by their owner only."""
    config = _config(tmp_path, tls, f"# users\n\nagent:{PASSWORD}\nother:x\n")
    config.home.mkdir(parents=True)
    properties = broker._render_properties(config).read_text()
    lines = dict(line.split("=", 1) for line in properties.splitlines() if "=" in line)
    assert lines["listeners"] == (
        "PLAINTEXT://127.0.0.1:40000,CONTROLLER://127.0.0.1:40001,SASL_SSL://127.0.0.1:40010"
    )
    assert lines["inter.broker.listener.name"] == "PLAINTEXT"
    assert lines["listener.security.protocol.map"].endswith("SASL_SSL:SASL_SSL")
    assert lines["listener.name.sasl_ssl.ssl.keystore.type"] == "PEM"
    jaas = lines["listener.name.sasl_ssl.plain.sasl.jaas.config"]
    assert f'user_agent="{PASSWORD}"' in jaas and 'user_other="x"' in jaas
    keystore = Path(lines["listener.name.sasl_ssl.ssl.keystore.location"])
    assert "PRIVATE KEY" in keystore.read_text() and "CERTIFICATE" in keystore.read_text()
    for private in (config.properties_file, keystore):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600


def test_without_sasl_ssl_only_plaintext_is_rendered(tmp_path: Path) -> None:
    """The default broker is unchanged: PLAINTEXT and CONTROLLER only, no SASL settings."""
    config = broker.BrokerConfig(port=40000, data_dir=tmp_path)
    properties = broker._render_properties(config).read_text()
    assert "listeners=PLAINTEXT://127.0.0.1:40000,CONTROLLER://127.0.0.1:40001\n" in properties
    keys = [line.split("=", 1)[0] for line in properties.splitlines() if "=" in line]
    assert keys and not any("sasl" in key.lower() or "ssl" in key.lower() for key in keys)


@pytest.mark.parametrize(
    "line", ["agent", "agent:", "bad name:pw", 'agent:say "hi"', "agent:back\\slash"]
)
def test_a_bad_users_line_is_refused_without_showing_it(
    tmp_path: Path, tls: TlsFiles, line: str
) -> None:
    """The error names the file and the line number, never the password."""
    config = _config(tmp_path, tls, f"ok:fine\n{line}\n")
    with pytest.raises(broker.BrokerConfigError, match="line 2") as caught:
        broker.read_sasl_users(config.sasl_users_file)  # type: ignore[arg-type]
    assert "hi" not in str(caught.value) and "slash" not in str(caught.value)


def test_the_users_password_is_not_in_their_repr(tmp_path: Path, tls: TlsFiles) -> None:
    """A SaslUser shows its name only."""
    config = _config(tmp_path, tls, f"agent:{PASSWORD}\n")
    users = broker.read_sasl_users(config.sasl_users_file)  # type: ignore[arg-type]
    assert [u.name for u in users] == ["agent"]
    assert PASSWORD not in repr(users)


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"sasl_ssl_port": 40010}, "needs --tls-certfile, --tls-keyfile, --sasl-users-file"),
        ({"tls_certfile": Path("c.pem")}, "--tls-certfile needs --sasl-ssl-port"),
        (
            {
                "sasl_ssl_port": 40001,
                "tls_certfile": Path("c"),
                "tls_keyfile": Path("k"),
                "sasl_users_file": Path("u"),
            },
            "must differ",
        ),
    ],
)
def test_sasl_ssl_options_that_do_not_go_together(values: dict[str, object], problem: str) -> None:
    """A usage error that names the missing or clashing option."""
    with pytest.raises(broker.BrokerConfigError, match=problem):
        broker.BrokerConfig.resolve(port=40000, **values)  # type: ignore[arg-type]
