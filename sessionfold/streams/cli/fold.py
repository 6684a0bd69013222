"""`sessionfold fold`: fold pi session files in the embedded runtime and report every session.

`--json` prints `fold_files`'s result with sorted keys: {"sessions": {id: {metrics, frontier,
pending_batches, flush_attempts, stats, counts, ledger, dead_letters}}} (`ledger`: the rule
ledger as folded, passes at pi's compactions; `--no-ledger` leaves it out). Without `--json`,
one short table per session goes to stdout and progress to stderr. An invalid config exits 2
naming the key; a path that is no session file exits 1 (`inputs.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.console import Console

from sessionfold.projections.ledger.config import DEFAULT_LEDGER
from sessionfold.streams.cli.inputs import session_inputs
from sessionfold.streams.cli.options import ConfigFile, Format, Ledger, Settings, config_or_exit
from sessionfold.streams.cli.session_table import session_table
from sessionfold.streams.runtime.embedded import fold_files


def register(app: typer.Typer) -> None:
    """Attach the `fold` command to the root app."""

    @app.command("fold")
    def fold(
        paths: Annotated[
            list[Path], typer.Argument(help="Session files or directory trees to fold.")
        ],
        config_file: ConfigFile = None,
        settings: Settings = None,
        as_json: Annotated[
            bool, typer.Option("--json", help="Print the state as stable JSON.")
        ] = False,
        ledger: Ledger = True,
        file_format: Format = None,
    ) -> None:
        """Fold session files and print each session's pruning state."""
        err = Console(stderr=True)
        config = config_or_exit(err, config_file, settings or [])
        files = session_inputs(paths)

        def progress(path: Path, records: int) -> None:
            err.print(f"folded {path.name}: {records} records", highlight=False)

        result = fold_files(
            files, config, progress=progress, ledger=DEFAULT_LEDGER if ledger else None
        )
        if as_json:
            typer.echo(orjson.dumps(result, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2))
            return
        out = Console()
        for session_id, state in result["sessions"].items():
            out.print(session_table(session_id, state))
