"""Where the coding agents keep their session files, as each agent's own settings say.

- pi: `$PI_CODING_AGENT_DIR/sessions`, else `~/.pi/agent/sessions` (a `pi --session-dir X`
  session lies wherever X is: its client names its file, docs/live.md);
- Claude Code: `$CLAUDE_CONFIG_DIR/projects`, else `~/.claude/projects`;
- Codex: `$CODEX_HOME/sessions`, else `~/.codex/sessions`.

`sessionfold serve` watches all three by default, and allows them as roots of a file a client
names (`--allow-root`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def _home(env: Mapping[str, str]) -> Path:
    home = env.get("HOME")
    return Path(home) if home else Path.home()


def _under(env: Mapping[str, str], variable: str, default: str, leaf: str) -> Path:
    value = env.get(variable)
    base = Path(value).expanduser() if value else _home(env) / default
    return base / leaf


def pi_sessions_dir(env: Mapping[str, str] | None = None) -> Path:
    """pi's session directory (`PI_CODING_AGENT_DIR`'s `sessions`, else ~/.pi/agent/sessions)."""
    return _under(
        os.environ if env is None else env, "PI_CODING_AGENT_DIR", ".pi/agent", "sessions"
    )


def claude_projects_dir(env: Mapping[str, str] | None = None) -> Path:
    """Claude Code's session directory (`CLAUDE_CONFIG_DIR`'s `projects`, else
    ~/.claude/projects)."""
    return _under(os.environ if env is None else env, "CLAUDE_CONFIG_DIR", ".claude", "projects")


def codex_sessions_dir(env: Mapping[str, str] | None = None) -> Path:
    """Codex's session directory (`CODEX_HOME`'s `sessions`, else ~/.codex/sessions)."""
    return _under(os.environ if env is None else env, "CODEX_HOME", ".codex", "sessions")


def agent_session_dirs(env: Mapping[str, str] | None = None) -> list[Path]:
    """Every agent's session directory: pi's, Claude Code's, Codex's."""
    return [pi_sessions_dir(env), claude_projects_dir(env), codex_sessions_dir(env)]
