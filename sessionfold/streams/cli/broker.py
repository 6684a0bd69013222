"""`sessionfold broker up|down|status`: the local single-node Kafka broker.

`up` prints only the bootstrap address on stdout (so `BOOTSTRAP=$(sessionfold broker up)` works);
progress and errors go to stderr. Exit codes: 0 ok, 1 failure (for `status`: not running),
2 usage error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text
from typer.models import OptionInfo

from sessionfold.streams.tools import broker as kafka_broker

_err = Console(stderr=True, highlight=False)


def _option(flag: str, text: str, **checks: str | int | bool) -> OptionInfo:
    """A broker option: its default is resolved by the broker config, so none is shown."""
    return typer.Option(flag, help=text, show_default=False, **checks)


def _port_option(flag: str, text: str, envvar: str, highest: int = 65535) -> OptionInfo:
    """A broker option naming a port, 1 to `highest`."""
    return _option(flag, text, envvar=envvar, min=1, max=highest)


PortOpt = Annotated[
    int | None,
    _port_option(
        "--port",
        "Broker port on 127.0.0.1 (default 9092); the controller listens on port + 1.",
        kafka_broker.ENV_PORT,
        highest=65534,
    ),
]
ControllerPortOpt = Annotated[
    int | None,
    _port_option(
        "--controller-port",
        "KRaft controller port (default: --port + 1).",
        kafka_broker.ENV_CONTROLLER_PORT,
    ),
]
DataDirOpt = Annotated[
    Path | None,
    _option(
        "--data-dir",
        "Broker data dir (default: $XDG_DATA_HOME/sessionfold/kafka-<port>).",
        envvar=kafka_broker.ENV_DATA_DIR,
        file_okay=False,
    ),
]
VersionOpt = Annotated[
    str | None,
    _option(
        "--kafka-version",
        f"Apache Kafka version from Maven Central (default {kafka_broker.DEFAULT_KAFKA_VERSION}).",
        envvar=kafka_broker.ENV_VERSION,
    ),
]
SaslSslPortOpt = Annotated[
    int | None,
    _port_option(
        "--sasl-ssl-port",
        "Also open a SASL_SSL listener for clients on this 127.0.0.1 port (needs "
        "--tls-certfile, --tls-keyfile and --sasl-users-file).",
        kafka_broker.ENV_SASL_SSL_PORT,
    ),
]
TlsCertfileOpt = Annotated[
    Path | None,
    _option(
        "--tls-certfile",
        "PEM certificate (chain) of the SASL_SSL listener; clients check it against "
        "their --ssl-cafile.",
        dir_okay=False,
    ),
]
TlsKeyfileOpt = Annotated[
    Path | None,
    _option(
        "--tls-keyfile", "PEM private key (PKCS#8, unencrypted) of --tls-certfile.", dir_okay=False
    ),
]
SaslUsersFileOpt = Annotated[
    Path | None,
    _option(
        "--sasl-users-file",
        "Users of the SASL_SSL listener, one name:password a line; each can log in with "
        "PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512.",
        dir_okay=False,
    ),
]


def _config(
    port: int | None,
    controller_port: int | None,
    data_dir: Path | None,
    version: str | None,
    **security: Any,  # noqa: ANN401 - the security options, passed on to BrokerConfig
) -> kafka_broker.BrokerConfig:
    """Build the broker config; an invalid value is a usage error (exit 2)."""
    try:
        return kafka_broker.BrokerConfig.resolve(
            version=version,
            port=port,
            controller_port=controller_port,
            data_dir=data_dir,
            **security,
        )
    except kafka_broker.BrokerConfigError as exc:
        raise typer.BadParameter(str(exc)) from None


# Messages are built as Text, never as markup: paths and broker log tails contain brackets that
# rich would otherwise swallow as style tags.


def _progress(message: str) -> None:
    _err.print(Text.assemble(("kafka: ", "dim"), message), soft_wrap=True)


def _fail(exc: Exception) -> typer.Exit:
    # The message holds paths, ports, pids and the broker log tail only: no event content.
    _err.print(Text.assemble(("error: ", "bold red"), str(exc)), soft_wrap=True)
    return typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Attach the `broker` command group to the root app."""
    broker_app = typer.Typer(
        name="broker",
        help="Run a local single-node Apache Kafka (KRaft) broker from Maven Central jars.",
        no_args_is_help=True,
    )

    @broker_app.command("up")
    def _up(
        port: PortOpt = None,
        data_dir: DataDirOpt = None,
        kafka_version: VersionOpt = None,
        controller_port: ControllerPortOpt = None,
        timeout: Annotated[
            float,
            typer.Option("--timeout", min=1.0, help="Seconds to wait for the broker to answer."),
        ] = kafka_broker.DEFAULT_START_TIMEOUT_S,
        sasl_ssl_port: SaslSslPortOpt = None,
        tls_certfile: TlsCertfileOpt = None,
        tls_keyfile: TlsKeyfileOpt = None,
        sasl_users_file: SaslUsersFileOpt = None,
    ) -> None:
        """Fetch jars if needed, format storage once, start the broker and wait until it answers.

        Prints the bootstrap address (HOST:PORT) of the PLAINTEXT listener on stdout. A no-op if
        it is already running. With --sasl-ssl-port it also opens a SASL_SSL listener.
        """
        config = _config(
            port,
            controller_port,
            data_dir,
            kafka_version,
            sasl_ssl_port=sasl_ssl_port,
            tls_certfile=tls_certfile,
            tls_keyfile=tls_keyfile,
            sasl_users_file=sasl_users_file,
        )
        try:
            kafka_broker.up(config, timeout_s=timeout, progress=_progress)
        except kafka_broker.BrokerError as exc:
            raise _fail(exc) from None
        typer.echo(config.bootstrap)

    @broker_app.command("down")
    def _down(
        port: PortOpt = None,
        data_dir: DataDirOpt = None,
        kafka_version: VersionOpt = None,
        controller_port: ControllerPortOpt = None,
        timeout: Annotated[
            float,
            typer.Option(
                "--timeout", min=1.0, help="Seconds to wait after SIGTERM before SIGKILL."
            ),
        ] = kafka_broker.DEFAULT_STOP_TIMEOUT_S,
    ) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after --timeout). Its data is kept."""
        config = _config(port, controller_port, data_dir, kafka_version)
        try:
            stopped = kafka_broker.stop(config, timeout_s=timeout, progress=_progress)
        except kafka_broker.BrokerError as exc:
            raise _fail(exc) from None
        if not stopped:
            _progress(f"no broker running for data dir {config.home}")

    @broker_app.command("status")
    def _status(
        port: PortOpt = None,
        data_dir: DataDirOpt = None,
        kafka_version: VersionOpt = None,
        controller_port: ControllerPortOpt = None,
        as_json: Annotated[
            bool,
            typer.Option("--json", help="Print one JSON object: running, pid, bootstrap, ..."),
        ] = False,
    ) -> None:
        """Say whether the broker of this data dir runs. Exit 0 if running, 1 if not."""
        config = _config(port, controller_port, data_dir, kafka_version)
        state = kafka_broker.status(config)
        if as_json:
            typer.echo(json.dumps(state.to_dict(), sort_keys=True))
        elif state.running:
            sasl_ssl = f" sasl_ssl={state.sasl_ssl}" if state.sasl_ssl else ""
            typer.echo(
                f"running pid={state.pid} bootstrap={state.bootstrap}{sasl_ssl} "
                f"version={state.version} data_dir={state.data_dir}"
            )
        else:
            typer.echo(
                f"stopped bootstrap={state.bootstrap} version={state.version} "
                f"data_dir={state.data_dir}"
            )
        raise typer.Exit(0 if state.running else 1)

    @broker_app.command("logs")
    def _logs(
        port: PortOpt = None,
        data_dir: DataDirOpt = None,
        lines: Annotated[int, typer.Option("--lines", "-n", min=1, help="How many lines.")] = 40,
    ) -> None:
        """Print the last lines of the broker log (stdout/stderr of the java process)."""
        config = _config(port, None, data_dir, None)
        tail = kafka_broker.log_tail(config, lines)
        if not tail:
            _err.print(Text(f"no broker log at {config.log_file}"), soft_wrap=True)
            raise typer.Exit(1)
        typer.echo(tail)

    app.add_typer(broker_app, name="broker")
