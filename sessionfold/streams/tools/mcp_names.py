"""The names of `sessionfold mcp`'s tools: the server registers them (cli/mcp.py) and
`sessionfold install` allows them in Claude Code's settings (tools/install/plans.py)."""

from __future__ import annotations

from sessionfold.projections.views.chains import RECOVERY_TOOL

#: The recall tool the stubs name (pi-condense's own name for it).
RECALL_TOOL = RECOVERY_TOOL
#: The read-only ledger tool.
LEDGER_TOOL = "ledger"
#: Every tool of the server, in the order it registers them.
MCP_TOOLS = (RECALL_TOOL, LEDGER_TOOL)
