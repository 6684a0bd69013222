"""The `sessionfold` console script: one Typer app, one module per subcommand group."""

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
    state,
    worker,
)

app = typer.Typer(
    name="sessionfold",
    help="Event-sourced context engine for coding-agent sessions.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

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
    state,
    report,
):
    module.register(app)


def main() -> None:
    """Run the console script."""
    app()
