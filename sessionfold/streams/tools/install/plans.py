"""What `sessionfold install` writes for each agent, and where (docs/agents.md).

Claude Code (2.1.328): the SessionStart hook (and, with the gateway, `env.ANTHROPIC_BASE_URL`
and serve's token in `env.ANTHROPIC_CUSTOM_HEADERS` when it has one) in `settings.json` (the
user's: `$CLAUDE_CONFIG_DIR` or `~/.claude`; the project's: `.claude/`), the MCP server in
`.claude.json` (`$CLAUDE_CONFIG_DIR/.claude.json` or `~/.claude.json`) or the project's
`.mcp.json` (where `claude mcp list` finds them).
Codex (0.169): the hook in `hooks.json`, the MCP server, `[features] hooks` and (gateway) a
`model_providers` entry (serve's token in its `http_headers`) and `model_provider` in
`config.toml`, under `$CODEX_HOME` (default `~/.codex`) or the project's `.codex/`.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sessionfold.streams.tools.install.changes import AddItem, Edit, SetKey
from sessionfold.streams.tools.mcp_names import MCP_TOOLS
from sessionfold.streams.web.auth import GATEWAY_TOKEN_HEADER

AGENTS = ("claude-code", "codex")
SCOPES = ("user", "project")
#: The name of every entry install writes (MCP server, model provider).
NAME = "sessionfold"
RECORD_NAME = "sessionfold-install.json"
#: Why a Codex hook may not run yet (reference/agent-clis.md: an untrusted hook is skipped).
CODEX_TRUST_NOTE = (
    "Codex runs a new hook only once you have trusted it, and skips it silently until then: "
    "start `codex` once and trust the sessionfold hook when it asks you to review new hooks "
    "(`codex exec --dangerously-bypass-hook-trust` runs it for one run without that)."
)
MCP_APPROVAL_NOTE = (
    "Claude Code asks before it starts a project's .mcp.json server: approve `sessionfold` "
    "when `claude` asks in this project."
)


@dataclass(frozen=True)
class FilePlan:
    """The edits to one file; `kind` is "json" or "toml"."""

    path: Path
    kind: str
    edits: tuple[Edit, ...]


@dataclass(frozen=True)
class Plan:
    """Everything install writes for one agent and scope, and what the user must still do."""

    agent: str
    scope: str
    record: Path
    files: tuple[FilePlan, ...]
    notes: tuple[str, ...] = ()
    #: The file of the hook the agent must trust before it runs it, its command, and the
    #: config that keeps the trust (Codex: always the user's, a project cannot trust itself).
    trusted_hook: tuple[Path, str, Path] | None = None


#: Claude Code's names of the MCP server's tools, as `permissions.allow` lists them.
CLAUDE_ALLOWED_TOOLS = tuple(f"mcp__{NAME}__{tool}" for tool in MCP_TOOLS)
#: The environment Codex does not pass its MCP servers that `sessionfold mcp` reads.
CODEX_MCP_ENV = ("CODEX_HOME", "SESSIONFOLD_SERVE_URL", "SESSIONFOLD_API_TOKEN_FILE")


def plan(
    agent: str,
    scope: str,
    command: list[str],
    env: Mapping[str, str],
    cwd: Path,
    gateway_url: str | None = None,
    gateway_token: str | None = None,
) -> Plan:
    """The plan for `agent` in `scope`; `command` runs sessionfold (absolute paths), `env`
    gives HOME, CLAUDE_CONFIG_DIR, CODEX_HOME; `gateway_url` is serve's URL with `--gateway`,
    `gateway_token` serve's API token, which the agent's model calls then carry."""
    gateway = None if gateway_url is None else Gateway(gateway_url, gateway_token)
    if agent == "claude-code":
        return _claude_code(scope, command, env, cwd, gateway)
    return _codex(scope, command, env, cwd, gateway)


@dataclass(frozen=True)
class Gateway:
    """Where the agent's model calls go (serve's URL) and the token they carry, if any."""

    url: str
    token: str | None = None


def _hook_group(matcher: str, command: list[str], agent: str) -> dict[str, object]:
    hook = {"type": "command", "command": shlex.join([*command, "hook", agent])}
    return {"matcher": matcher, "hooks": [hook]}


def _claude_code(
    scope: str, command: list[str], env: Mapping[str, str], cwd: Path, gateway: Gateway | None
) -> Plan:
    home = Path(env["HOME"])
    own = env.get("CLAUDE_CONFIG_DIR")
    config_dir = Path(own) if own else home / ".claude"
    if scope == "user":
        settings, record = config_dir / "settings.json", config_dir
        mcp = (config_dir if own else home) / ".claude.json"
    else:
        settings, record = cwd / ".claude" / "settings.json", cwd / ".claude"
        mcp = cwd / ".mcp.json"
    edits: list[Edit] = [
        AddItem(("hooks", "SessionStart"), _hook_group("compact", command, "claude-code")),
        # The recall tools only read: without this Claude Code asks before each call, and
        # `claude -p` refuses it.
        *(AddItem(("permissions", "allow"), tool) for tool in CLAUDE_ALLOWED_TOOLS),
    ]
    if gateway:
        edits.append(SetKey(("env", "ANTHROPIC_BASE_URL"), gateway.url))
        if gateway.token:
            header = f"{GATEWAY_TOKEN_HEADER}: {gateway.token}"
            edits.append(SetKey(("env", "ANTHROPIC_CUSTOM_HEADERS"), header))
    server = {
        "type": "stdio",
        "command": command[0],
        "args": [*command[1:], "mcp", "claude-code"],
        "env": {},
    }
    files = (
        FilePlan(settings, "json", tuple(edits)),
        FilePlan(mcp, "json", (SetKey(("mcpServers", NAME), server),)),
    )
    notes = (MCP_APPROVAL_NOTE,) if scope == "project" else ()
    return Plan("claude-code", scope, record / RECORD_NAME, files, notes)


def _codex(
    scope: str, command: list[str], env: Mapping[str, str], cwd: Path, gateway: Gateway | None
) -> Plan:
    own = env.get("CODEX_HOME")
    user_home = Path(own) if own else Path(env["HOME"]) / ".codex"
    codex_home = user_home if scope == "user" else cwd / ".codex"
    config: list[Edit] = []
    if gateway:
        provider: dict[str, object] = {
            "name": NAME,
            "base_url": f"{gateway.url.rstrip('/')}/v1",
            "wire_api": "responses",
            "env_key": "OPENAI_API_KEY",
        }
        if gateway.token:
            provider["http_headers"] = {GATEWAY_TOKEN_HEADER: gateway.token}
        config += [SetKey(("model_provider",), NAME), SetKey(("model_providers", NAME), provider)]
    server: dict[str, object] = {"command": command[0], "args": [*command[1:], "mcp", "codex"]}
    # Codex gives an MCP server HOME, LANG and PATH only: what else finds the session and serve
    # goes in the entry's env.
    passed = {k: env[k] for k in CODEX_MCP_ENV if env.get(k)}
    if passed:
        server["env"] = passed
    # `codex exec` (0.169) asks the model after about a second without the tools of a server not
    # started yet, and the MCP SDK's import alone takes that long: Codex waits for a required one.
    server["required"] = True
    config += [SetKey(("features", "hooks"), True), SetKey(("mcp_servers", NAME), server)]
    group = _hook_group("compact|resume", command, "codex")
    hooks_file = codex_home / "hooks.json"
    files = (
        FilePlan(hooks_file, "json", (AddItem(("hooks", "SessionStart"), group),)),
        FilePlan(codex_home / "config.toml", "toml", tuple(config)),
    )
    hook = (hooks_file, shlex.join([*command, "hook", "codex"]), user_home / "config.toml")
    return Plan("codex", scope, codex_home / RECORD_NAME, files, (CODEX_TRUST_NOTE,), hook)
