"""`sessionfold replay`: a session's state at any point, replayed from session-events.

Reads the topic from the beginning by assigning partitions (the workers' consumer group never
sees the replay), folds in process with the embedded runtime and the offline summarizer, and
prints the state where each session stops, in the shape of `sessionfold fold --json`:

    --until-seq N   events with sequence number <= N
    --turn N        up to and including the N-th assistant message (0-based branch ordinal)
    --span N        up to and including the N-th compaction boundary (1-based)

A named session that is not on the topic, or a --turn/--span past a session's end, exits 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import orjson
import typer
from kafka.errors import KafkaError
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from sessionfold.events.envelope import SchemaVersionError
from sessionfold.projections.pruning.config import PruneConfig
from sessionfold.streams.cli.options import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_PREFIX,
    Bootstrap,
    ConfigFile,
    Settings,
    TopicPrefix,
    access_or_exit,
    config_or_exit,
    kafka_failure,
    kafka_security_options,
)
from sessionfold.streams.cli.session_table import session_table
from sessionfold.streams.kafka.security import PLAINTEXT, KafkaSecurity
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.tools.replay import Point, Replayer, ReplayError, replay_topic

Turn = Annotated[
    int | None,
    typer.Option(
        "--turn",
        min=0,
        help="Stop after the N-th assistant message of the branch (0-based, as in the state).",
    ),
]


def point_or_exit(err: Console, until_seq: int | None, turn: int | None, span: int | None) -> Point:
    """The one stop point given (exit 2 when several are)."""
    given = [
        (kind, value)
        for kind, value in (("seq", until_seq), ("turn", turn), ("span", span))
        if value is not None
    ]
    if len(given) > 1:
        err.print("[red]give at most one of --until-seq, --turn, --span[/]")
        raise typer.Exit(2)
    if not given:
        return Point()
    kind, value = given[0]
    return Point(kind, value)  # type: ignore[arg-type]


def progress_bar(console: Console, label: str) -> Progress:
    """The replay's progress bar on stderr: records read of the records to read."""
    return Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def run_replay(
    err: Console,
    bootstrap: str,
    topic_prefix: str,
    config: PruneConfig,
    sessions: list[str] | None,
    point: Point,
    on_folded: Callable[[Any], None] | None = None,
    security: KafkaSecurity = PLAINTEXT,
) -> Replayer:
    """Replay with a progress bar; errors become a message on stderr and exit 1."""
    access_or_exit(err, bootstrap, security)
    with progress_bar(err, "replay") as progress:
        task = progress.add_task("replay", total=0)

        def sized(total: int) -> None:
            current = progress.tasks[0].total or 0
            progress.update(task, total=current + total)

        try:
            return replay_topic(
                bootstrap,
                Topics(topic_prefix),
                config,
                sessions,
                point,
                on_size=sized,
                on_record=lambda: progress.advance(task),
                on_folded=on_folded,
                security=security,
            )
        except ReplayError as exc:
            progress.stop()
            err.print(f"[red]replay failed:[/] {exc}", highlight=False)
            raise typer.Exit(1) from None
        except SchemaVersionError as exc:
            progress.stop()
            err.print(f"[red]replay failed:[/] {exc}", highlight=False)
            raise typer.Exit(1) from None
        except KafkaError as exc:
            progress.stop()
            err.print(
                f"[red]error:[/] {kafka_failure(bootstrap, exc)}", highlight=False, soft_wrap=True
            )
            raise typer.Exit(1) from None


def register(app: typer.Typer) -> None:
    """Attach the `replay` command to the root app."""

    @app.command("replay")
    @kafka_security_options
    def replay(
        bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
        topic_prefix: TopicPrefix = DEFAULT_PREFIX,
        session: Annotated[
            list[str] | None,
            typer.Option("--session", help="Replay only this session (repeatable)."),
        ] = None,
        until_seq: Annotated[
            int | None,
            typer.Option("--until-seq", min=0, help="Stop after the events with seq <= N."),
        ] = None,
        turn: Turn = None,
        span: Annotated[
            int | None,
            typer.Option(
                "--span",
                min=1,
                help="Stop after the N-th compaction boundary (1-based: pi compaction entries "
                "and compact-request events).",
            ),
        ] = None,
        config_file: ConfigFile = None,
        settings: Settings = None,
        as_json: Annotated[
            bool, typer.Option("--json", help="Print the state as stable JSON (fold --json).")
        ] = False,
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        """Replay session-events to a point and print each session's state there."""
        err = Console(stderr=True)
        point = point_or_exit(err, until_seq, turn, span)
        config = config_or_exit(err, config_file, settings or [])
        replayer = run_replay(
            err, bootstrap, topic_prefix, config, session, point, security=security
        )
        result = replayer.result()
        if as_json:
            typer.echo(orjson.dumps(result, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2))
            return
        out = Console()
        for session_id, state in result["sessions"].items():
            table = session_table(session_id, state)
            table.title = f"session {session_id} at {point.describe()}"
            out.print(table)
