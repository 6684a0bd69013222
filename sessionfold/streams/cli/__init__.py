"""The `sessionfold` console script: one Typer app, one module per subcommand group.

A subcommand's module is imported only when that subcommand runs: `sessionfold --help` lists
them from `COMMANDS` and imports none, so neither it nor `sessionfold hook` (which an agent
waits for) pays for Kafka, aiohttp or the plotting code the other subcommands use.

Public: `app`, `main`, `COMMANDS`, and the `fold` and `worker` modules (tests set the worker's
test hooks and read the fold command's output names). Private to it: the other subcommand
modules and their helpers `options`, `inputs`, `session_table`, `json_output`, `mcp_tools`.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

import typer
from typer.core import TyperCommand, TyperGroup

from sessionfold.streams.logs import configure_cli_logging

if TYPE_CHECKING:
    from types import ModuleType

    from typer import _click

__all__ = ["COMMANDS", "app", "fold", "main", "worker"]

#: Each subcommand: the module whose `register(app)` defines it, and the line `--help` shows
#: (the command's own first docstring line; a test keeps them equal).
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "Fold one session through the embedded runtime and report what pruning did."),
    "fold": ("fold", "Fold session files and print each session's pruning state."),
    "generate": (
        "generate",
        "Write N synthetic sessions shaped like real ones, deterministic per seed.",
    ),
    "publish": ("publish", "Publish pi session files to the session-events topic."),
    "facts": (
        "facts",
        "Count, per compaction point, the needed values each compactor's summary kept.",
    ),
    "ledger": ("ledger", "Show the rule ledger of a session file, or (`compact FILE`) compact it."),
    "replay": ("replay", "Replay session-events to a point and print each session's state there."),
    "context": (
        "context",
        "Print the message list the model is given at a point, and its token count.",
    ),
    "compare": (
        "compare",
        "Run two configurations over the same sessions and compare what the model sees.",
    ),
    "worker": (
        "worker",
        "Run a Kafka worker: fold session events, answer flush requests, serve state.",
    ),
    "serve": (
        "serve",
        "Fold pi's live sessions and answer its extension: pruned context, compaction, recall.",
    ),
    "state": (
        "state",
        "Print one session's projections (or flushes, or a ref's original) from a worker.",
    ),
    "report": (
        "report",
        "A digest of the ledger log's newest eight records, safe to paste into an issue.",
    ),
    "hook": (
        "hook",
        "The agents' SessionStart hook: the rule ledger after a compaction (fails open).",
    ),
    "mcp": (
        "mcp",
        "The recall tool over MCP (stdio) for Claude Code and Codex: originals by ref, ledger.",
    ),
    "install": (
        "install",
        "Write an agent's SessionStart hook, MCP server and (--gateway) base URL; --uninstall.",
    ),
    "broker": (
        "broker",
        "Run a local single-node Apache Kafka (KRaft) broker from Maven Central jars.",
    ),
}


@functools.cache
def load_command(name: str) -> _click.Command:
    """The click command `name`, its module imported and registered on an app of its own."""
    module = importlib.import_module(f"sessionfold.streams.cli.{COMMANDS[name][0]}")
    own = typer.Typer(add_completion=False)
    module.register(own)

    @own.callback()
    def _group() -> None:
        """Holds the module's commands."""

    group = typer.main.get_command(own)
    assert isinstance(group, TyperGroup)
    return group.commands[name]


class _LazyGroup(TyperGroup):
    """The root group: commands are loaded when run, listed from `COMMANDS` for the help."""

    _listing = False

    def list_commands(self, ctx: _click.Context) -> list[str]:
        """Every subcommand, in the help's order."""
        return list(COMMANDS)

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        """The command (a stand-in with its help line while the help is written)."""
        if cmd_name not in COMMANDS:
            return None
        if self._listing:
            return TyperCommand(cmd_name, help=COMMANDS[cmd_name][1])
        return load_command(cmd_name)

    def format_help(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        """The help, listing the commands without importing their modules."""
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="sessionfold",
    help="Event-sourced context engine for coding-agent sessions.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_LazyGroup,
)


@app.callback()
def _root() -> None:
    """Event-sourced context engine for coding-agent sessions."""
    # Warnings (a dead letter, a skipped file) reach stderr with their facts; `worker` hands
    # logging over to Faust, which replaces this handler with its own.
    configure_cli_logging()


def __getattr__(name: str) -> ModuleType:
    """`cli.fold`, `cli.worker` and the other modules, imported on first use."""
    if name in {module for module, _ in COMMANDS.values()}:
        return importlib.import_module(f"sessionfold.streams.cli.{name}")
    raise AttributeError(name)


def main() -> None:
    """Run the console script."""
    app()
