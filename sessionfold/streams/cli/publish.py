"""`sessionfold publish`: pi session files into Kafka, once each, in order."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Annotated

import typer
from kafka.errors import KafkaError
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from sessionfold.streams.cli.options import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_PARTITIONS,
    DEFAULT_PREFIX,
    Bootstrap,
    Partitions,
    TopicPrefix,
    access_or_exit,
    kafka_failure,
    kafka_security_options,
)
from sessionfold.streams.kafka_security import PLAINTEXT, KafkaSecurity
from sessionfold.streams.publish import (
    Checkpoints,
    Publisher,
    default_checkpoint_path,
    make_producer,
    publish_paths,
)
from sessionfold.streams.session_file import session_files
from sessionfold.streams.topics import Topics, ensure_topics

log = logging.getLogger(__name__)


def register(app: typer.Typer) -> None:
    """Attach the `publish` command to the root app."""

    @app.command("publish")
    @kafka_security_options
    def publish(
        paths: Annotated[
            list[Path],
            typer.Argument(help="Session files or directory trees (like ~/.pi/agent/sessions)."),
        ],
        follow: Annotated[
            bool, typer.Option("--follow", help="Keep tailing growing files until Ctrl-C.")
        ] = False,
        bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
        topic_prefix: TopicPrefix = DEFAULT_PREFIX,
        partitions: Partitions = DEFAULT_PARTITIONS,
        state_file: Annotated[
            Path | None,
            typer.Option(
                "--state-file",
                envvar="SESSIONFOLD_PUBLISH_STATE",
                help="Where to remember per file how far publishing got.",
            ),
        ] = None,
        world: Annotated[
            bool,
            typer.Option(
                "--world/--no-world",
                help=(
                    "Takes a read-only git snapshot of each session's working directory "
                    "for the rule ledger."
                ),
            ),
        ] = True,
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        """Publish pi session files to the session-events topic."""
        err = Console(stderr=True)
        missing = [p for p in paths if not p.exists()]
        if missing:
            err.print(f"[red]no such file or directory:[/] {missing[0]}")
            raise typer.Exit(2)
        topics = Topics(topic_prefix)
        checkpoints = Checkpoints.load(state_file or default_checkpoint_path(bootstrap, topics))
        stopping = False

        def stop(_signum: int, _frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        access_or_exit(err, bootstrap, security)
        try:
            ensure_topics(bootstrap, topics, partitions, security=security)
            producer = make_producer(bootstrap, security)
        except KafkaError as exc:
            err.print(
                f"[red]error:[/] {kafka_failure(bootstrap, exc)}", highlight=False, soft_wrap=True
            )
            raise typer.Exit(1) from None
        total = sum(p.stat().st_size for p in session_files(paths))
        progress = Progress(
            TextColumn("publish"),
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
        )
        with progress:
            task = progress.add_task("publish", total=total)
            publisher = Publisher(
                producer, topics, checkpoints, lambda n: progress.advance(task, n), world=world
            )
            try:
                counts = publish_paths(
                    publisher, paths, follow=follow, should_stop=lambda: stopping
                )
            except KeyboardInterrupt:
                counts = publisher.counts
            except KafkaError as exc:
                producer.close(timeout=5)
                err.print(f"[red]publish failed:[/] {type(exc).__name__}; re-run to resume")
                raise typer.Exit(1) from None
        producer.close(timeout=30)
        typer.echo(counts.line())
