"""Options shared by the subcommands that talk to Kafka (ARCHITECTURE.md, CLI conventions)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from sessionfold.projections.config import ConfigError, PruneConfig, load_config
from sessionfold.streams.topics import DEFAULT_PARTITIONS, DEFAULT_PREFIX

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
    "Bootstrap",
    "ConfigFile",
    "Ledger",
    "Partitions",
    "Settings",
    "TopicPrefix",
    "config_or_exit",
]
