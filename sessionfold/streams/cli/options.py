"""Options shared by the subcommands that talk to Kafka (ARCHITECTURE.md, CLI conventions)."""

from __future__ import annotations

from typing import Annotated

import typer

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

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "DEFAULT_PARTITIONS",
    "DEFAULT_PREFIX",
    "Bootstrap",
    "Partitions",
    "TopicPrefix",
]
