"""`sessionfold context`: the message list the model is given at a point of a session.

From a session file (`sessionfold context FILE`) or from session-events (`--session ID
--bootstrap HOST:PORT`), folded to the end or to `--turn N` (0-based, up to and including the
N-th assistant message), then rendered as pi-condense's `context` handler would: per-batch
summaries, stubs with refs, error purge, chain compression, orphan sweep. The token count of
what the model sees is printed beside that of pi's unpruned context.

`--format json` prints {"messages": [...], "tokens": {"pruned": N, "unpruned": N}} where
tokens are the sum over messages of floor(JSON length / 4 + 0.5). `--ref REF` prints instead
the original output a ref in the context names, read back from the log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
import typer
from rich.console import Console
from rich.table import Table

from sessionfold.projections.pruning.capture import result_text
from sessionfold.projections.pruning.config import PruneConfig
from sessionfold.projections.pruning.digest import message_of
from sessionfold.projections.views.context import (
    ContextView,
    context_at,
    message_tokens,
    resolve_ref,
)
from sessionfold.streams.cli.inputs import session_inputs
from sessionfold.streams.cli.options import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_PREFIX,
    Bootstrap,
    ConfigFile,
    InputFormat,
    Settings,
    TopicPrefix,
    config_or_exit,
    kafka_security_options,
)
from sessionfold.streams.cli.replay import Turn, run_replay
from sessionfold.streams.kafka.security import PLAINTEXT, KafkaSecurity
from sessionfold.streams.publishing.session_file import header_of
from sessionfold.streams.tools.replay import Collector, Point, Replayer, ReplayError, replay_files

PREVIEW = 90  # chars of a message shown per row in the text format


def file_session(path: Path) -> str | None:
    """The id of the first session a file holds (its header), or None."""
    header = header_of(path)
    return None if header is None else str(header["id"])


def view_from_replay(replayer: Replayer, collector: Collector, config: PruneConfig) -> ContextView:
    """Render the collected session at the point the replayer stopped it."""
    runtime = replayer.runtime
    return context_at(
        collector.entries,
        runtime.store,
        collector.session_id,
        config,
        collector.compact_points(runtime),
    )


def _preview(message: dict[str, Any]) -> str:
    role = message.get("role")
    content = message.get("content")
    if isinstance(content, list):
        parts = []
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                parts.append(str(block.get("text", "")))
            elif kind == "toolCall":
                parts.append(
                    f"{block.get('name')}({orjson.dumps(block.get('arguments')).decode()})"
                )
            elif kind == "thinking":
                parts.append("[thinking]")
        text = " ".join(parts)
    elif isinstance(content, str):
        text = content
    elif role in ("compactionSummary", "branchSummary"):
        text = str(message.get("summary", ""))
    elif role == "bashExecution":
        text = f"!{message.get('command', '')}"
    else:
        text = ""
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


def _print_text(view: ContextView, label: str) -> None:
    out = Console()
    table = Table(title=label, title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("role")
    table.add_column("tokens", justify="right")
    table.add_column("content")
    for number, message in enumerate(view.messages):
        table.add_row(
            str(number),
            str(message.get("role")),
            f"{message_tokens(message):,}",
            _preview(message),
        )
    out.print(table)
    counts = view.tokens
    saved = counts["unpruned"] - counts["pruned"]
    share = f", {-100 * saved / counts['unpruned']:+.1f}%" if counts["unpruned"] else ""
    out.print(
        f"tokens the model sees: {counts['pruned']:,} (unpruned: {counts['unpruned']:,}{share}); "
        f"{len(view.messages)} messages (unpruned: {len(view.unpruned)}), "
        f"{len(view.chains)} compressed chains, {len(view.removed)} outputs out of context "
        "(each recoverable by its ref: --ref REF)",
        highlight=False,
    )
    if view.repairs:
        # the placeholders a provider needs for calls whose result the log does not hold
        out.print(
            f"{len(view.repairs)} calls without a result in the log, answered 'No result "
            "provided' (ledger --anomalies lists them)",
            highlight=False,
        )


def _print_originals(
    err: Console, replayer: Replayer, collector: Collector, refs: list[str], output: str
) -> None:
    """Resolve refs to their originals in the log and print them (exit 1 if one is unknown)."""
    log = {item.seq: item.entry for item in collector.entries}
    found = []
    for ref in refs:
        seq = resolve_ref(replayer.runtime.store, collector.session_id, ref)
        message = message_of(log[seq]) if seq in log else None
        if message is None or message.get("role") != "toolResult":
            err.print(f"[red]unknown ref:[/] {ref}", highlight=False)
            raise typer.Exit(1)
        found.append((ref, seq, message))
    if output == "json":
        typer.echo(orjson.dumps([{"ref": r, "seq": s, "message": m} for r, s, m in found]))
        return
    for ref, seq, message in found:
        status = "ERROR" if message.get("isError") else "OK"
        typer.echo(f"## {ref} (seq {seq}): {message.get('toolName')} {status}")
        typer.echo(result_text(message))


def register(app: typer.Typer) -> None:
    """Attach the `context` command to the root app."""

    @app.command("context")
    @kafka_security_options
    def context(
        path: Annotated[
            Path | None,
            typer.Argument(help="A pi session file; without it, --session reads session-events."),
        ] = None,
        session: Annotated[
            str | None,
            typer.Option("--session", help="The session (required without FILE)."),
        ] = None,
        bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
        topic_prefix: TopicPrefix = DEFAULT_PREFIX,
        turn: Turn = None,
        output: Annotated[
            Literal["text", "json"],
            typer.Option("--format", help="text: a table; json: messages and token counts."),
        ] = "text",
        refs: Annotated[
            list[str] | None,
            typer.Option(
                "--ref",
                help="Instead of the context, print the original output a ref names "
                "(tN, id@timestamp or eN, as cited in the context, or a tool call id: its "
                "newest summarized occurrence; repeatable).",
            ),
        ] = None,
        config_file: ConfigFile = None,
        settings: Settings = None,
        security: KafkaSecurity = PLAINTEXT,
        file_format: InputFormat = None,
    ) -> None:
        """Print the message list the model is given at a point, and its token count."""
        err = Console(stderr=True)
        config = config_or_exit(err, config_file, settings or [])
        point = Point("turn", turn) if turn is not None else Point()
        if path is not None:
            session_inputs([path], directories=False)
            session_id = session or file_session(path)
            if session_id is None:
                err.print(f"[red]no session in[/] {path}")
                raise typer.Exit(1)
            collector = Collector(session_id)
            try:
                replayer = replay_files([path], config, [session_id], point, collector)
            except ReplayError as exc:
                err.print(f"[red]context failed:[/] {exc}", highlight=False)
                raise typer.Exit(1) from None
        else:
            if session is None:
                err.print("[red]give a session FILE, or --session ID to read session-events[/]")
                raise typer.Exit(2)
            collector = Collector(session)
            replayer = run_replay(
                err, bootstrap, topic_prefix, config, [session], point, collector, security
            )
        if refs:
            _print_originals(err, replayer, collector, refs, output)
            return
        view = view_from_replay(replayer, collector, config)
        if output == "json":
            typer.echo(orjson.dumps(view.to_json()))
            return
        _print_text(view, f"session {collector.session_id} at {point.describe()}")
