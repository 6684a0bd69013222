"""`sessionfold mcp claude-code|codex`: the recall tool over MCP, on stdio (docs/agents.md).

Claude Code and Codex call tools of their own only through MCP servers; the gateway's stubs
tell the model to call `context_tree_query`. The server offers it (`mcp__sessionfold__
context_tree_query` in Claude Code, `context_tree_query` in Codex's `mcp__sessionfold`
namespace) and a read-only `ledger` tool. The answers come from cli/mcp_tools.py; this module
holds the command and the MCP SDK, imported only when the command runs.

A tool's failure is an error result with a short message (never a transcript's words); the
server goes on. Nothing is logged but the SDK's own lines, which name no content.
"""

# No `from __future__ import annotations`: the SDK and Typer read the tools' and the command's
# annotations at run time, and the tools' types are imported inside `build_server`.
import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from sessionfold.streams.cli import mcp_tools
from sessionfold.streams.cli.mcp_tools import DEFAULT_LIMIT, SessionSource, ToolFailure
from sessionfold.streams.tools.mcp_names import LEDGER_TOOL, RECALL_TOOL

if TYPE_CHECKING:
    from mcp.server.mcpserver import Context, MCPServer

T = TypeVar("T")

RECALL_DESCRIPTION = (
    "Retrieve the full original output of tool results that were summarized out of the "
    'context. Pass the refs named in the summaries and stubs, e.g. ["t12","t3"], or raw tool '
    "call ids. A large answer comes in pages: call again with the offset it names."
)
LEDGER_DESCRIPTION = (
    "Read this session's rule ledger: the user's standing rules in force (their exact words, "
    "ids R1...), the last commands run (C1...) and the errors not cleared (E1...). Read-only."
)


def _meta_of(ctx: "Context[Any]") -> Mapping[str, Any] | None:
    """The call's `_meta` as the client sent it (Codex names its thread there)."""
    params = ctx.request_context.params
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    if isinstance(meta, Mapping):
        return meta
    found = ctx.request_context.meta
    dumped = found.model_dump() if hasattr(found, "model_dump") else found
    return dumped if isinstance(dumped, Mapping) else None


async def _answer(work: Callable[[], T]) -> T:
    """Run a tool's work off the event loop; any failure becomes a ToolError that names its
    class only (an exception's message may quote the transcript)."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        return await asyncio.to_thread(work)
    except ToolFailure as exc:
        raise ToolError(str(exc)) from None
    except Exception as exc:
        raise ToolError(f"sessionfold could not answer ({type(exc).__name__})") from None


def build_server(source: SessionSource) -> "MCPServer[Any]":
    """The MCP server with its two tools, answering for `source`'s session."""
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.types import ToolAnnotations

    server: MCPServer[Any] = MCPServer(
        "sessionfold",
        instructions="Use context_tree_query when a stub says an output was summarized and "
        "you need it verbatim.",
        log_level="WARNING",
    )
    # Read-only: Codex runs such a tool without asking for approval.
    read_only = ToolAnnotations(readOnlyHint=True, destructiveHint=False, openWorldHint=False)

    @server.tool(
        name=RECALL_TOOL,
        description=RECALL_DESCRIPTION,
        annotations=read_only,
        structured_output=False,
    )
    async def context_tree_query(
        toolCallIds: list[str],  # pi-condense's parameter name
        ctx: Context[Any],
        offset: int = 0,
        limit: int = DEFAULT_LIMIT,
        session_id: str | None = None,
    ) -> str:
        """The originals behind refs or tool call ids, paged."""
        meta = mcp_tools.call_session(_meta_of(ctx))

        def work() -> str:
            named = mcp_tools.named_sessions(session_id, meta)
            return mcp_tools.recall(source, toolCallIds, offset, limit, named)

        return await _answer(work)

    @server.tool(
        name=LEDGER_TOOL,
        description=LEDGER_DESCRIPTION,
        annotations=read_only,
        structured_output=False,
    )
    async def ledger(
        ctx: Context[Any],
        offset: int = 0,
        limit: int = DEFAULT_LIMIT,
        session_id: str | None = None,
    ) -> str:
        """The session's rules, commands and errors with their ids."""
        meta = mcp_tools.call_session(_meta_of(ctx))

        def work() -> str:
            return mcp_tools.ledger(
                source, offset, limit, mcp_tools.named_sessions(session_id, meta)
            )

        return await _answer(work)

    return server


def register(app: typer.Typer) -> None:
    """Attach the `mcp` command to the root app."""

    @app.command("mcp")
    def mcp(
        agent: Annotated[
            str,
            typer.Argument(metavar="claude-code|codex", help="The agent that starts the server."),
        ],
        session_file: Annotated[
            Path | None,
            typer.Option(
                "--session-file",
                help="The transcript to recall from (default: the "
                "agent's current session, found in its session folder).",
            ),
        ] = None,
        session: Annotated[
            str | None,
            typer.Option("--session", help="The session id (default: the one the agent names)."),
        ] = None,
        config_file: Annotated[
            Path | None,
            typer.Option(
                "--config",
                envvar="SESSIONFOLD_CONFIG",
                help="TOML file with the pruning settings serve folds with (its refs).",
            ),
        ] = None,
        settings: Annotated[
            list[str] | None,
            typer.Option("--set", help="Override one setting, as serve's --set (repeatable)."),
        ] = None,
    ) -> None:
        """The recall tool over MCP (stdio) for Claude Code and Codex: originals by ref, ledger."""
        if agent not in mcp_tools.AGENTS:
            typer.echo(f"the agent is one of: {', '.join(mcp_tools.AGENTS)}", err=True)
            raise typer.Exit(2)
        # The file reader's warnings name lines, not content, but stdout is the protocol and
        # stderr the agent's log: keep both quiet.
        logging.disable(logging.WARNING)
        # The settings are read at the first fold (a bad one is that call's error): the pruning
        # config module would cost the start a third of a second.
        source = SessionSource(
            agent, session_file, session, config_file=config_file, overrides=settings or []
        )
        build_server(source).run("stdio")
