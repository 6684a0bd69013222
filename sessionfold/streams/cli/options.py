"""Options shared by the subcommands that talk to Kafka (ARCHITECTURE.md, CLI conventions)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from typer.models import OptionInfo

from sessionfold.events.formats import FORMATS, TRANSLATORS
from sessionfold.projections.pruning.config import ConfigError, PruneConfig
from sessionfold.streams.kafka import security as ks
from sessionfold.streams.kafka.topics import DEFAULT_PARTITIONS, DEFAULT_PREFIX
from sessionfold.streams.publishing.session_file import FORCED_FORMAT
from sessionfold.streams.runtime.config_files import load_config
from sessionfold.streams.web.anthropic_api import ANTHROPIC
from sessionfold.streams.web.auth import TokenProblem, read_token
from sessionfold.streams.web.openai_api import OPENAI

Bootstrap = Annotated[
    str,
    typer.Option(
        "--bootstrap",
        envvar="SESSIONFOLD_BOOTSTRAP",
        help="Kafka bootstrap address HOST:PORT.",
    ),
]
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"

TopicPrefix = Annotated[
    str,
    typer.Option(
        "--topic-prefix",
        envvar="SESSIONFOLD_TOPIC_PREFIX",
        help="Prefix of every topic name.",
    ),
]

Partitions = Annotated[
    int,
    typer.Option(
        "--partitions",
        envvar="SESSIONFOLD_PARTITIONS",
        min=1,
        help="Partition count of topics created (all topics share it: co-partitioning).",
    ),
]

ConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--config",
        envvar="SESSIONFOLD_CONFIG",
        help="TOML file with pruning settings (top level or a \\[pruning] table).",
    ),
]

Settings = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override one setting, e.g. --set minBatchChars=500 (repeatable)."),
]


def _force_format(value: str | None) -> str | None:
    """Make every file this command reads be read in `value`'s format (None: detect each)."""
    if value is not None and value not in FORMATS:
        raise typer.BadParameter(f"one of {', '.join(FORMATS)}")
    if value not in (None, "pi", *TRANSLATORS):
        raise typer.BadParameter(f"{value} transcripts are not read by this build")
    FORCED_FORMAT.set(value)
    return value


_FORMAT_HELP = (
    "Read the files as pi, claude-code or codex transcripts (default: detected from each "
    "file's first line; docs/formats.md)."
)
Format = Annotated[
    str | None,
    typer.Option("--format", "--input-format", help=_FORMAT_HELP, callback=_force_format),
]
#: `--input-format` alone, for a command whose `--format` names its output (`context`).
InputFormat = Annotated[
    str | None,
    typer.Option("--input-format", help=_FORMAT_HELP, callback=_force_format),
]

Ledger = Annotated[
    bool,
    typer.Option(
        "--ledger/--no-ledger",
        envvar="SESSIONFOLD_LEDGER",
        help="Fold the rule ledger beside the pruning state (passes at pi's compactions and "
        "compact requests).",
    ),
]


# The Kafka security block: every command that talks to Kafka takes these through
# `kafka_security_options`. There is no password option: the password comes from
# SESSIONFOLD_SASL_PASSWORD or --sasl-password-file, never from a command line that `ps` shows.
_SECURITY_HELP = "Kafka security (docs/security-kafka.md)"


def _security_option(flag: str, envvar: str, text: str) -> OptionInfo:
    """One option of the Kafka security block, listed in its own help panel."""
    return typer.Option(flag, envvar=envvar, help=text, rich_help_panel=_SECURITY_HELP)


SecurityProtocol = Annotated[
    str,
    _security_option(
        "--security-protocol", ks.ENV_PROTOCOL, "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."
    ),
]
SslCafile = Annotated[
    Path | None,
    _security_option(
        "--ssl-cafile",
        ks.ENV_CAFILE,
        "PEM CA certificate(s) the brokers' certificates are checked against "
        "(default: the system's).",
    ),
]
SslCertfile = Annotated[
    Path | None,
    _security_option(
        "--ssl-certfile",
        ks.ENV_CERTFILE,
        "PEM client certificate (chain), for brokers that require one.",
    ),
]
SslKeyfile = Annotated[
    Path | None,
    _security_option(
        "--ssl-keyfile", ks.ENV_KEYFILE, "PEM private key of --ssl-certfile (if not in that file)."
    ),
]
SaslMechanism = Annotated[
    str,
    _security_option(
        "--sasl-mechanism", ks.ENV_MECHANISM, "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."
    ),
]
SaslUsername = Annotated[
    str | None, _security_option("--sasl-username", ks.ENV_USERNAME, "SASL user name.")
]
SaslPasswordFile = Annotated[
    Path | None,
    _security_option(
        "--sasl-password-file",
        ks.ENV_PASSWORD_FILE,
        f"File whose first line is the SASL password (else env {ks.ENV_PASSWORD}).",
    ),
]

_SECURITY_PARAMETERS: dict[str, tuple[Any, Any]] = {
    "security_protocol": (SecurityProtocol, "PLAINTEXT"),
    "ssl_cafile": (SslCafile, None),
    "ssl_certfile": (SslCertfile, None),
    "ssl_keyfile": (SslKeyfile, None),
    "sasl_mechanism": (SaslMechanism, "PLAIN"),
    "sasl_username": (SaslUsername, None),
    "sasl_password_file": (SaslPasswordFile, None),
}

Command = TypeVar("Command", bound=Callable[..., Any])


def security_or_exit(err: Console, **values: Any) -> ks.KafkaSecurity:  # noqa: ANN401 - option values
    """The Kafka security settings from the option values; exit 2 with the problem on a misfit."""
    try:
        return ks.load_security(
            protocol=values["security_protocol"],
            ssl_cafile=values["ssl_cafile"],
            ssl_certfile=values["ssl_certfile"],
            ssl_keyfile=values["ssl_keyfile"],
            sasl_mechanism=values["sasl_mechanism"],
            sasl_username=values["sasl_username"],
            sasl_password_file=values["sasl_password_file"],
        )
    except ks.KafkaSecurityError as exc:
        err.print(
            f"[red]invalid Kafka security settings:[/] {exc}", highlight=False, soft_wrap=True
        )
        raise typer.Exit(2) from None


def kafka_security_options(command: Command) -> Command:
    """Give a command the Kafka security options; it receives them as one `security` argument.

    The command declares a keyword parameter `security: KafkaSecurity`; typer sees the seven
    options of the block in its place, and the wrapper folds their values into the settings
    (exit 2 for settings that do not go together). Apply it below `@app.command`.
    """
    signature = inspect.signature(command, eval_str=True)
    kept = [p for name, p in signature.parameters.items() if name != "security"]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=kind, default=default)
        for name, (kind, default) in _SECURITY_PARAMETERS.items()
    ]

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401 - any command's arguments
        values = {name: kwargs.pop(name) for name in _SECURITY_PARAMETERS}
        kwargs["security"] = security_or_exit(Console(stderr=True), **values)
        return command(*args, **kwargs)

    positional = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in kept]
    wrapper.__signature__ = signature.replace(parameters=[*positional, *added])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in [*positional, *added]}
    return wrapper  # type: ignore[return-value]


def access_or_exit(err: Console, bootstrap: str, security: ks.KafkaSecurity) -> None:
    """Exit 1 with one line when the brokers refuse the credentials or the TLS handshake fails."""
    try:
        ks.check_access(bootstrap, security)
    except ks.KafkaAccessError as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


def kafka_failure(bootstrap: str, exc: BaseException) -> str:
    """What to say when a Kafka client failed: the access problem, else the error class."""
    return (
        ks.access_problem(exc, bootstrap)
        or f"cannot reach Kafka at {bootstrap}: {type(exc).__name__}"
    )


ApiToken = Annotated[
    str | None,
    typer.Option(
        "--api-token",
        envvar="SESSIONFOLD_API_TOKEN",
        help="Bearer token of the state API (prefer the variable or --api-token-file: "
        "a command-line value shows in the process list).",
        show_default=False,
    ),
]

ApiTokenFile = Annotated[
    Path | None,
    typer.Option(
        "--api-token-file",
        envvar="SESSIONFOLD_API_TOKEN_FILE",
        help="File holding the state API's bearer token (surrounding whitespace ignored).",
    ),
]


def api_token_or_exit(err: Console, token: str | None, path: Path | None) -> str | None:
    """The API token from a value or a file (not both), None for none; exit 2 if unusable."""
    try:
        return read_token(token, path)
    except TokenProblem as problem:
        err.print(f"[red]error:[/] {problem}", highlight=False)
        raise typer.Exit(2) from None


def config_or_exit(err: Console, path: Path | None, overrides: list[str]) -> PruneConfig:
    """The pruning config from a TOML file and overrides; exit 2 naming the bad key."""
    try:
        return load_config(path, overrides)
    except ConfigError as exc:
        err.print(f"[red]invalid config[/] {exc.key}: {exc.problem}", highlight=False)
        raise typer.Exit(2) from None
    except OSError as exc:
        err.print(f"[red]cannot read config[/] {path}: {type(exc).__name__}", highlight=False)
        raise typer.Exit(2) from None


# The gateway's options, the same on `sessionfold serve` and `sessionfold worker` (docs/live.md,
# "The gateway").
AnthropicUpstream = Annotated[
    str,
    typer.Option(
        "--anthropic-upstream",
        envvar="SESSIONFOLD_ANTHROPIC_UPSTREAM",
        help="Where the gateway sends Claude Code's calls (Anthropic Messages).",
    ),
]
ANTHROPIC_UPSTREAM = ANTHROPIC.default_upstream

OpenaiUpstream = Annotated[
    str,
    typer.Option(
        "--openai-upstream",
        envvar="SESSIONFOLD_OPENAI_UPSTREAM",
        help="Where the gateway sends Codex's calls (OpenAI Responses).",
    ),
]
OPENAI_UPSTREAM = OPENAI.default_upstream

MinFreedTokens = Annotated[
    int,
    typer.Option(
        "--min-freed-tokens",
        envvar="SESSIONFOLD_MIN_FREED_TOKENS",
        min=0,
        help="Tokens a change of the gateway's rewrite must free before it gives up "
        "the provider's cached prefix.",
    ),
]

CacheTtl = Annotated[
    float,
    typer.Option(
        "--cache-ttl",
        envvar="SESSIONFOLD_CACHE_TTL",
        min=0.0,
        help="The provider's cache life, seconds: after that long without a call the "
        "gateway takes the newest rewrite whatever it frees.",
    ),
]


def upstreams_or_exit(err: Console, anthropic: str, openai: str) -> dict[str, str]:
    """The gateway's upstream base URLs by API name; exit 2 on one that is not http(s)."""
    upstreams = {ANTHROPIC.name: anthropic, OPENAI.name: openai}
    for name, url in upstreams.items():
        if not url.startswith(("http://", "https://")):
            err.print(f"[red]--{name}-upstream wants an http(s) URL[/]", highlight=False)
            raise typer.Exit(2)
    return upstreams


__all__ = [
    "ANTHROPIC_UPSTREAM",
    "DEFAULT_BOOTSTRAP",
    "DEFAULT_PARTITIONS",
    "DEFAULT_PREFIX",
    "OPENAI_UPSTREAM",
    "AnthropicUpstream",
    "ApiToken",
    "ApiTokenFile",
    "Bootstrap",
    "CacheTtl",
    "ConfigFile",
    "Ledger",
    "MinFreedTokens",
    "OpenaiUpstream",
    "Partitions",
    "SaslMechanism",
    "SaslPasswordFile",
    "SaslUsername",
    "SecurityProtocol",
    "Settings",
    "SslCafile",
    "SslCertfile",
    "SslKeyfile",
    "TopicPrefix",
    "access_or_exit",
    "api_token_or_exit",
    "config_or_exit",
    "kafka_failure",
    "kafka_security_options",
    "security_or_exit",
    "upstreams_or_exit",
]
