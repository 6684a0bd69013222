"""The `sessionfold` console script: one Typer app, one module per subcommand group.

Public: `app`, `main`, and the `fold` and `worker` modules (tests set the worker's test hooks
and read the fold command's output names). Private to it: the other subcommand modules and
their helpers `options`, `inputs`, `session_table`.
"""

from __future__ import annotations

import typer

from sessionfold.streams.cli import (
    broker,
    compare,
    context,
    demo,
    fold,
    generate,
    ledger,
    publish,
    replay,
    report,
    serve,
    state,
    worker,
)
from sessionfold.streams.logs import configure_cli_logging

__all__ = ["app", "fold", "main", "worker"]

app = typer.Typer(
    name="sessionfold",
    help="Event-sourced context engine for coding-agent sessions.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Event-sourced context engine for coding-agent sessions."""
    # Warnings (a dead letter, a skipped file) reach stderr with their facts; `worker` hands
    # logging over to Faust, which replaces this handler with its own.
    configure_cli_logging()


for module in (
    demo,
    broker,
    fold,
    generate,
    publish,
    ledger,
    replay,
    context,
    compare,
    worker,
    serve,
    state,
    report,
):
    module.register(app)


def main() -> None:
    """Run the console script."""
    app()
