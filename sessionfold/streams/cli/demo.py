"""`sessionfold demo [FILE]`: the main job for a new user.

One session (a generated one when no file is given) goes through the embedded runtime with a
progress bar; then a report: flushes by trigger and outcome, what the model would see before and
after pruning, and the three context metrics over time.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from sessionfold.projections.pruning import context_metrics as metrics
from sessionfold.projections.pruning import digest
from sessionfold.projections.pruning.config import PruneConfig
from sessionfold.projections.views.base import log_entry
from sessionfold.projections.views.context import ContextView, context_at
from sessionfold.streams.cli.inputs import session_inputs
from sessionfold.streams.cli.options import Format, Settings, config_or_exit
from sessionfold.streams.publishing.session_file import DeadLetter, file_lines, read_session_file
from sessionfold.streams.runtime.embedded import EmbeddedRuntime
from sessionfold.streams.tools.synthetic import write_fleet

#: How many points of the session the metrics table shows.
SAMPLES = 10


def register(app: typer.Typer) -> None:
    """Attach the `demo` command to the root app."""

    @app.command("demo")
    def demo(
        file: Annotated[
            Path | None,
            typer.Argument(help="A pi session file; a generated session when omitted."),
        ] = None,
        turns: Annotated[
            int, typer.Option("--turns", min=1, help="Assistant turns of the generated session.")
        ] = 300,
        seed: Annotated[int, typer.Option("--seed", help="Seed of the generated session.")] = 0,
        settings: Settings = None,
        file_format: Format = None,
    ) -> None:
        """Fold one session through the embedded runtime and report what pruning did."""
        out = Console()
        err = Console(stderr=True)
        config = config_or_exit(err, None, settings or [])
        with tempfile.TemporaryDirectory(prefix="sessionfold-demo-") as tmp:
            if file is None:
                file = write_fleet(Path(tmp), sessions=1, turns=turns, seed=seed)[0].path
                err.print(f"generated a session of {turns} turns (seed {seed})")
            else:
                session_inputs([file], directories=False)
            runtime, samples, dead = _fold_with_progress(file, config, err)
        sessions = runtime.sessions()
        if not sessions:
            err.print(f"[red]no session in {file}[/] ({dead} unreadable lines)")
            raise typer.Exit(1)
        _report(out, runtime, sessions[0], samples, dead)


def _fold_with_progress(
    path: Path, config: PruneConfig, err: Console
) -> tuple[EmbeddedRuntime, list[dict[str, Any]], int]:
    """Fold the file, sampling the metrics at evenly spaced events."""
    total = sum(1 for line in file_lines(path) if line.too_long or line.data.strip())
    every = max(1, total // SAMPLES)
    runtime = EmbeddedRuntime(config)
    samples: list[dict[str, Any]] = []
    dead = 0
    columns = (TextColumn("fold"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task("fold", total=total)
        for i, record in enumerate(read_session_file(path), start=1):
            runtime.publish(record)
            progress.advance(task)
            if isinstance(record, DeadLetter):
                dead += 1
            elif i % every == 0 or i == total:
                sid = record.session_id
                point = metrics.snapshot(runtime.store, sid)
                point["event"] = i
                point["turns"] = digest.head(runtime.store, sid).get("turns", 0)
                samples.append(point)
    return runtime, samples, dead


def _report(
    out: Console, runtime: EmbeddedRuntime, sid: str, samples: list[dict[str, Any]], dead: int
) -> None:
    state = runtime.session_state(sid)
    roles = state["counts"]["messages"]
    out.print(f"[bold]session[/] {sid}: {sum(roles.values())} messages ", end="")
    out.print(", ".join(f"{role} {n}" for role, n in sorted(roles.items())), end="")
    out.print(f"; {dead} unreadable lines" if dead else "")

    attempts = state["flush_attempts"]
    by_cell = Counter((a["trigger"], a["outcome"]) for a in attempts)
    flushes = Table(title=f"flush attempts: {len(attempts)}")
    for column in ("trigger", "outcome", "attempts"):
        flushes.add_column(column)
    for (trigger, outcome), n in sorted(by_cell.items()):
        flushes.add_row(trigger, outcome, str(n))
    out.print(flushes)

    view = _context(runtime, sid)
    sizes = view.tokens
    unpruned, pruned = sizes["unpruned"], sizes["pruned"]
    share = 100 * pruned / unpruned if unpruned else 100.0
    out.print(
        f"the model would see [bold]{pruned:,}[/] tokens after pruning, "
        f"against {unpruned:,} for the unpruned branch ({share:.0f}%); "
        f"{len(view.removed)} outputs taken out, each recoverable by its ref"
    )

    over_time = Table(title="context metrics over the session")
    for column in ("event", "turns", "open-cycle thinking", "largest chain %", "frontier gap"):
        over_time.add_column(column, justify="right")
    for point in samples:
        over_time.add_row(
            str(point["event"]),
            str(point["turns"]),
            f"{point['open_cycle_thinking_tokens']:,}",
            str(point["largest_chain_share_pct"]),
            f"{point['frontier_gap_tokens']:,}",
        )
    out.print(over_time)


def _context(runtime: EmbeddedRuntime, sid: str) -> ContextView:
    """What the model is given at the end of the session (the context view of §7 and §8)."""
    events = (e for e in runtime.log["session-events"] if e.session_id == sid)
    entries = [item for item in map(log_entry, events) if item is not None]
    return context_at(entries, runtime.store, sid, runtime.config)
