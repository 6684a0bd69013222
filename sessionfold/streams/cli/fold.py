"""`sessionfold fold`: fold pi session files in the embedded runtime and report every session.

`--json` prints `fold_files`'s result with sorted keys: {"sessions": {id: {metrics, frontier,
pending_batches, flush_attempts, stats, counts, dead_letters}}}. Without it, one short table per
session goes to stdout and progress to stderr. An invalid config exits 2 naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from sessionfold.projections.config import ConfigError, PruneConfig, load_config
from sessionfold.streams.embedded import fold_files
from sessionfold.streams.session_file import session_files


def register(app: typer.Typer) -> None:
    """Attach the `fold` command to the root app."""

    @app.command("fold")
    def fold(
        paths: Annotated[
            list[Path], typer.Argument(help="Session files or directory trees to fold.")
        ],
        config_file: Annotated[
            Path | None,
            typer.Option(
                "--config",
                envvar="SESSIONFOLD_CONFIG",
                help="TOML file with pruning settings (top level or a \\[pruning] table).",
            ),
        ] = None,
        settings: Annotated[
            list[str] | None,
            typer.Option(
                "--set", help="Override one setting, e.g. --set minBatchChars=500 (repeatable)."
            ),
        ] = None,
        as_json: Annotated[
            bool, typer.Option("--json", help="Print the state as stable JSON.")
        ] = False,
    ) -> None:
        """Fold session files and print each session's pruning state."""
        err = Console(stderr=True)
        config = _config_or_exit(err, config_file, settings or [])
        missing = [p for p in paths if not p.exists()]
        if missing:
            err.print(f"[red]no such file or directory:[/] {missing[0]}")
            raise typer.Exit(2)
        files = list(session_files(paths))

        def progress(path: Path, records: int) -> None:
            err.print(f"folded {path.name}: {records} records", highlight=False)

        result = fold_files(files, config, progress=progress)
        if as_json:
            typer.echo(orjson.dumps(result, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2))
            return
        out = Console()
        for session_id, state in result["sessions"].items():
            out.print(_session_table(session_id, state))


def _config_or_exit(err: Console, path: Path | None, overrides: list[str]) -> PruneConfig:
    try:
        return load_config(path, overrides)
    except ConfigError as exc:
        err.print(f"[red]invalid config[/] {exc.key}: {exc.problem}", highlight=False)
        raise typer.Exit(2) from None
    except OSError as exc:
        err.print(f"[red]cannot read config[/] {path}: {type(exc).__name__}", highlight=False)
        raise typer.Exit(2) from None


def _session_table(session_id: str, state: dict[str, Any]) -> Table:
    table = Table(title=f"session {session_id}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    metrics = state["metrics"]
    attempts = state["flush_attempts"]
    outcomes: dict[str, int] = {}
    for attempt in attempts:
        outcomes[attempt["outcome"]] = outcomes.get(attempt["outcome"], 0) + 1
    frontier = state["frontier"]
    roles = state["counts"]["messages"]
    stats = state["stats"]
    table.add_row("messages", ", ".join(f"{role} {n}" for role, n in roles.items()) or "0")
    table.add_row(
        "flush attempts",
        f"{len(attempts)}" + (f" ({_counts(outcomes)})" if outcomes else ""),
    )
    table.add_row("pending batches", str(state["pending_batches"]))
    table.add_row(
        "frontier",
        "none"
        if frontier is None
        else f"turn {frontier['last_attempted_turn_index']}, {frontier['outcome']}",
    )
    table.add_row("open-cycle thinking", f"{metrics['open_cycle_thinking_tokens']:,} tokens")
    table.add_row("largest-chain share", f"{metrics['largest_chain_share_pct']}%")
    table.add_row("frontier gap", f"{metrics['frontier_gap_tokens']:,} tokens")
    table.add_row(
        "summarized",
        f"{stats['summarized_calls']} calls in {stats['summaries']} summaries, "
        f"{stats['deduped_calls']} deduped, {stats['spilled_calls']} spilled; "
        f"~{stats['reclaimed_chars'] // 4:,} tokens reclaimed",
    )
    table.add_row("dead letters", str(state["dead_letters"]))
    return table


def _counts(outcomes: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(outcomes.items()))
