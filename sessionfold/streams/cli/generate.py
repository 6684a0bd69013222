"""`sessionfold generate`: write synthetic session files (pi v3, Claude Code transcripts, Codex
rollouts) for tests and benches."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sessionfold.streams.tools.synthetic import WrittenSession, write_fleet
from sessionfold.streams.tools.synthetic_claude import write_claude_fleet
from sessionfold.streams.tools.synthetic_codex import GENERATIONS, write_codex_fleet

#: The formats `generate` writes, and how.
_WRITERS = {"pi": write_fleet, "claude-code": write_claude_fleet, "codex": write_codex_fleet}


def _progress(console: Console, show: bool) -> Progress:
    return Progress(
        TextColumn("generating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not show,
    )


def register(app: typer.Typer) -> None:
    """Attach the `generate` command to the root app."""

    @app.command("generate")
    def _generate(
        out: Annotated[
            Path,
            typer.Argument(
                help="Directory for the session files; created if missing.",
                file_okay=False,
                dir_okay=True,
                writable=True,
            ),
        ],
        sessions: Annotated[
            int, typer.Option("--sessions", min=1, help="How many session files to write.")
        ] = 1,
        turns: Annotated[
            int, typer.Option("--turns", min=1, help="Assistant messages per session (exact).")
        ] = 200,
        seed: Annotated[
            int, typer.Option("--seed", min=0, help="Seed; the same seed gives identical files.")
        ] = 0,
        file_format: Annotated[
            str,
            typer.Option(
                "--format",
                help="pi; claude-code: transcripts under OUT/<project>/<session>.jsonl, "
                "each with its subagents' files; codex: rollouts under "
                "OUT/YYYY/MM/DD/rollout-*.jsonl.",
            ),
        ] = "pi",
        cli_version: Annotated[
            str | None,
            typer.Option(
                "--cli-version",
                help="codex only: the CLI generation whose shapes to write "
                f"({', '.join(GENERATIONS)}; default {GENERATIONS[0]}, the current CLI).",
            ),
        ] = None,
    ) -> None:
        """Write N synthetic sessions shaped like real ones, deterministic per seed.

        pi files get pi's names (<timestamp>_<uuid>.jsonl), Claude Code transcripts and Codex
        rollouts their agent's layout; same-named files in OUT are replaced.
        """
        writer = _WRITERS.get(file_format)
        if writer is None:
            typer.echo(f"sessionfold generate: --format must be one of {', '.join(_WRITERS)}")
            raise typer.Exit(2)
        if cli_version is not None:
            if file_format != "codex" or cli_version not in GENERATIONS:
                typer.echo(
                    "sessionfold generate: --cli-version takes a codex generation: "
                    + ", ".join(GENERATIONS),
                    err=True,
                )
                raise typer.Exit(2)
            writer = partial(write_codex_fleet, cli=cli_version)
        console = Console(stderr=True)
        totals = {"entries": 0, "bytes": 0}
        # a bar only helps a person waiting on several files; logs and pipes get none
        with _progress(console, show=sessions > 1 and console.is_terminal) as progress:
            files = None if file_format == "claude-code" else sessions  # subagents add files
            task = progress.add_task("generating", total=files)

            def written(result: WrittenSession) -> None:
                totals["entries"] += result.entries
                totals["bytes"] += result.size
                progress.advance(task)

            try:
                writer(out, sessions, turns, seed, on_written=written)
            except OSError as exc:
                typer.echo(f"sessionfold generate: cannot write to {out}: {exc.strerror}", err=True)
                raise typer.Exit(1) from None
        typer.echo(
            f"wrote {sessions} sessions ({totals['entries']} entries, {totals['bytes']} bytes) "
            f"to {out}"
        )
