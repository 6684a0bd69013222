"""`sessionfold compare`: two pruning configurations over the same sessions, side by side.

    sessionfold compare FILE... --a k=v,... --b k=v,... [--chart PATH.png] [--json]

Each configuration is the defaults with its settings over them (`--a`/`--b` take
comma-separated `key=value` pairs and may be repeated; an empty one means the defaults). For
every session the context view is rendered after each assistant message; the table reports the
tokens the model sees per turn (mean, p50, max, and the final view), the flushes that
processed a batch, model calls and cost, for A and B, with pi's unpruned context as reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from sessionfold.projections.pruning.config import ConfigError
from sessionfold.streams.cli.inputs import session_inputs
from sessionfold.streams.cli.options import Format
from sessionfold.streams.tools.compare import Comparison, compare, config_of, write_chart


def _row(label: str, a: float, b: float, money: bool = False) -> tuple[str, str, str, str]:
    if money:
        return label, f"${a:.4f}", f"${b:.4f}", f"{b - a:+.4f}"
    delta = b - a
    change = f"{delta:+,.1f}" if isinstance(delta, float) else f"{delta:+,}"
    if a:
        change += f" ({100 * delta / a:+.1f}%)"
    fmt = "{:,.1f}" if isinstance(a, float) or isinstance(b, float) else "{:,}"
    return label, fmt.format(a), fmt.format(b), change


def _table(title: str, a: dict[str, Any], b: dict[str, Any], unpruned: dict[str, Any]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("")
    table.add_column("A", justify="right")
    table.add_column("B", justify="right")
    table.add_column("B - A", justify="right")
    table.add_column("unpruned", justify="right", style="dim")
    labels = {
        "mean": "tokens/turn mean",
        "p50": "tokens/turn p50",
        "max": "tokens/turn max",
        "final": "tokens at the end",
    }
    for name, label in labels.items():
        row = _row(label, a["summary"][name], b["summary"][name])
        table.add_row(*row, f"{unpruned[name]:,}")
    table.add_row(*_row("flushes", a["flushes"], b["flushes"]), "")
    table.add_row(*_row("flush attempts", a["flush_attempts"], b["flush_attempts"]), "")
    table.add_row(*_row("model calls", a["model_calls"], b["model_calls"]), "")
    table.add_row(*_row("cost (USD)", a["cost"], b["cost"], money=True), "")
    return table


def _print(comparison: Comparison) -> None:
    out = Console()
    data = comparison.to_json()
    a_text = ", ".join(comparison.a_settings) or "defaults"
    b_text = ", ".join(comparison.b_settings) or "defaults"
    out.print(f"A: {a_text}\nB: {b_text}", highlight=False)
    out.print(
        "tokens the model sees after each assistant message; flushes = flush attempts that "
        "processed a batch; unpruned = pi's own context of the branch",
        style="dim",
        highlight=False,
    )
    unpruned = data["unpruned"]
    for session_id, a_run in data["a"]["sessions"].items():
        b_run = data["b"]["sessions"][session_id]
        out.print(
            _table(
                f"session {session_id} ({len(a_run['tokens_per_turn'])} turns)",
                a_run,
                b_run,
                unpruned["sessions"][session_id]["summary"],
            )
        )
    if len(data["a"]["sessions"]) > 1:
        out.print(
            _table(
                "all sessions (turns pooled; final summed)",
                data["a"]["totals"],
                data["b"]["totals"],
                unpruned["summary"],
            )
        )


def register(app: typer.Typer) -> None:
    """Attach the `compare` command to the root app."""

    @app.command("compare")
    def compare_command(
        paths: Annotated[list[Path], typer.Argument(help="Session files or directory trees.")],
        a: Annotated[
            list[str] | None,
            typer.Option("--a", help="Configuration A: key=value pairs, comma-separated."),
        ] = None,
        b: Annotated[
            list[str] | None,
            typer.Option("--b", help="Configuration B: key=value pairs, comma-separated."),
        ] = None,
        chart: Annotated[
            Path | None,
            typer.Option("--chart", help="Write tokens per turn, A against B, to this PNG."),
        ] = None,
        as_json: Annotated[
            bool, typer.Option("--json", help="Print the comparison as JSON.")
        ] = False,
        file_format: Format = None,
    ) -> None:
        """Run two configurations over the same sessions and compare what the model sees."""
        err = Console(stderr=True)
        a_settings, b_settings = a or [], b or []
        for name, settings in (("--a", a_settings), ("--b", b_settings)):
            try:
                config_of(settings)
            except ConfigError as exc:
                err.print(f"[red]invalid {name}[/] {exc.key}: {exc.problem}", highlight=False)
                raise typer.Exit(2) from None
        files = session_inputs(paths)
        with err.status(f"replaying {len(files)} file(s) under A and B"):
            comparison = compare(files, a_settings, b_settings)
        if chart is not None:
            if chart.suffix.lower() != ".png":
                err.print(f"[red]--chart must name a .png file:[/] {chart}")
                raise typer.Exit(2)
            write_chart(comparison, chart)
            err.print(f"chart written to {chart}", highlight=False)
        if as_json:
            typer.echo(orjson.dumps(comparison.to_json(), option=orjson.OPT_INDENT_2))
            return
        _print(comparison)
