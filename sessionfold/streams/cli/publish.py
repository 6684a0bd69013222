"""`sessionfold publish`: pi session files into Kafka, once each, in order."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import Annotated

import typer
from kafka import KafkaProducer
from kafka.errors import KafkaError
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from sessionfold.streams.cli.inputs import session_inputs
from sessionfold.streams.cli.options import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_PARTITIONS,
    DEFAULT_PREFIX,
    Bootstrap,
    Format,
    Partitions,
    TopicPrefix,
    access_or_exit,
    kafka_failure,
    kafka_security_options,
)
from sessionfold.streams.kafka.security import PLAINTEXT, KafkaSecurity
from sessionfold.streams.kafka.topics import Topics, ensure_topics
from sessionfold.streams.publishing.publisher import (
    DEFAULT_TIMEOUT_S,
    Checkpoints,
    Publisher,
    PublishFailed,
    PublishStopped,
    TopicLog,
    abandon,
    default_checkpoint_path,
    make_producer,
    publish_paths,
)
from sessionfold.streams.publishing.session_file import ReadPosition, session_files

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
        timeout: Annotated[
            float,
            typer.Option(
                "--timeout",
                envvar="SESSIONFOLD_PUBLISH_TIMEOUT",
                min=1.0,
                help=(
                    "Seconds the broker may leave publish without an answer or "
                    "acknowledgement before it exits 1 (checkpointed, resumable)."
                ),
            ),
        ] = DEFAULT_TIMEOUT_S,
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
        file_format: Format = None,
    ) -> None:
        """Publish pi session files to the session-events topic.

        Exit codes: 0 done (or, with --follow, stopped by a signal once everything sent was
        acknowledged), 1 the broker failed (no acknowledgement within --timeout, or a record
        refused), 2 usage error, 130/143 stopped by SIGINT/SIGTERM. A second signal ends it at
        once. In every case the checkpoint holds what the broker acknowledged, and a re-run
        publishes nothing twice.
        """
        err = Console(stderr=True)
        session_inputs(paths, need_session=False)
        topics = Topics(topic_prefix)
        checkpoints = Checkpoints.load(state_file or default_checkpoint_path(bootstrap, topics))
        stop = _Signals()
        stop.install()
        access_or_exit(err, bootstrap, security)
        try:
            ensure_topics(bootstrap, topics, partitions, timeout_s=timeout, security=security)
            producer = make_producer(bootstrap, timeout, security)
        except KafkaError as exc:
            err.print(
                f"[red]error:[/] {kafka_failure(bootstrap, exc)}", highlight=False, soft_wrap=True
            )
            raise typer.Exit(1) from None
        except _Interrupted:
            raise typer.Exit(stop.exit_code()) from None
        topic_log = TopicLog(bootstrap, security)
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
                producer,
                topics,
                checkpoints,
                lambda n: progress.advance(task, n),
                world=world,
                topic_log=topic_log,
                timeout_s=timeout,
                should_stop=stop.is_set,
            )
            stop.armed = True
            try:
                counts = publish_paths(publisher, paths, follow=follow)
            except PublishFailed as exc:
                reason = "no acknowledgement" if exc.code == "timeout" else exc.code
                _give_up(producer, topic_log, checkpoints)
                err.print(
                    f"publish failed: Kafka at {bootstrap}: {reason} within {timeout:g} s; "
                    f"{_where(publisher)}",
                    soft_wrap=True,
                )
                raise typer.Exit(1) from None
            except PublishStopped:
                _give_up(producer, topic_log, checkpoints)
                err.print(f"publish stopped by {stop.name()}; {_where(publisher)}", soft_wrap=True)
                typer.echo(publisher.counts.line())
                raise typer.Exit(stop.exit_code()) from None
            except KafkaError as exc:  # a read-back that could not even connect
                _give_up(producer, topic_log, checkpoints)
                err.print(
                    f"publish failed: Kafka at {bootstrap}: {type(exc).__name__}; "
                    f"{_where(publisher)}"
                )
                raise typer.Exit(1) from None
        topic_log.close()
        producer.close(timeout=timeout)
        typer.echo(counts.line())


class _Interrupted(Exception):
    """A signal arrived before publishing began: nothing to settle, stop at once."""


class _Signals:
    """SIGTERM and SIGINT: the first asks publish to stop, a second one ends it at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.armed = False  # the publisher polls the flag from now on

    def install(self) -> None:
        """Take over SIGTERM and SIGINT for the rest of the command."""
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        if self.signum is not None:
            # Asked twice: no more waiting. The unsure mark makes a re-run skip what landed.
            os._exit(128 + signum)
        self.signum = signum
        if not self.armed:
            raise _Interrupted

    def is_set(self) -> bool:
        """Whether a stop was asked for."""
        return self.signum is not None

    def name(self) -> str:
        """The signal's name, e.g. SIGTERM."""
        return signal.Signals(self.signum).name if self.signum else "signal"

    def exit_code(self) -> int:
        """128 plus the signal number, the shell's convention."""
        return 128 + (self.signum or 0)


def _give_up(producer: KafkaProducer, topic_log: TopicLog, checkpoints: Checkpoints) -> None:
    """Keep what was acknowledged, drop what was not, close without waiting."""
    checkpoints.save()
    abandon(producer)
    with contextlib.suppress(KafkaError):
        topic_log.close()


def _where(publisher: Publisher) -> str:
    """How far publishing got and where a re-run resumes: counts and positions only."""
    counts = publisher.counts
    text = f"published {counts.published}, dead-lettered {counts.dead_lettered}"
    resumes = publisher.resumes_at()
    if resumes is not None:
        line = publisher.checkpoints.positions.get(resumes, ReadPosition()).line
        text += f"; a re-run resumes at {Path(resumes).name} line {line + 1}"
    return text
