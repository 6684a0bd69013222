"""Options shared by the subcommands that talk to Kafka (ARCHITECTURE.md, CLI conventions)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from sessionfold.projections.config import ConfigError, PruneConfig, load_config
from sessionfold.streams.topics import DEFAULT_PARTITIONS, DEFAULT_PREFIX
from sessionfold.streams.web_auth import MIN_TOKEN_CHARS

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

Ledger = Annotated[
    bool,
    typer.Option(
        "--ledger/--no-ledger",
        envvar="SESSIONFOLD_LEDGER",
        help="Fold the rule ledger beside the pruning state (passes at pi's compactions and "
        "compact requests).",
    ),
]


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
    if token is not None and path is not None:
        err.print("[red]--api-token and --api-token-file exclude each other[/]")
        raise typer.Exit(2)
    if path is not None:
        try:
            token = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            err.print(f"[red]cannot read the API token file:[/] {type(exc).__name__}")
            raise typer.Exit(2) from None
    if token is None:
        return None
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        err.print(f"[red]the API token must be at least {MIN_TOKEN_CHARS} characters, no spaces[/]")
        raise typer.Exit(2)
    return token


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


__all__ = [
    "DEFAULT_BOOTSTRAP",
    "DEFAULT_PARTITIONS",
    "DEFAULT_PREFIX",
    "ApiToken",
    "ApiTokenFile",
    "Bootstrap",
    "ConfigFile",
    "Ledger",
    "Partitions",
    "Settings",
    "TopicPrefix",
    "api_token_or_exit",
    "config_or_exit",
]
