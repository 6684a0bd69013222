"""A read-only git snapshot of a session's working directory: the ledger's World.

The session file names its directory, so the directory is untrusted input: its repository
may configure programs (an fsmonitor hook, clean/smudge filters, a pager, hooks, a promisor
remote with a command transport). The snapshot therefore runs only five commands that never
read worktree file contents, so no filter and no fsmonitor hook has a reason to run:

- `rev-parse --show-toplevel` and `rev-parse --short HEAD` read refs and the repository layout;
- `symbolic-ref --short -q HEAD` reads one ref;
- `diff-index --cached --name-only HEAD` compares the index with HEAD's tree (object store
  only: the worktree is not looked at, unlike `status` or a plain `diff`);
- `ls-files --others --exclude-standard` lists untracked names from the directory tree and the
  ignore files, without opening the files themselves.

On top of that every command disables what could still run something: fsmonitor, hooks, the
untracked cache, signature checks and the pager on the command line; optional locks, prompts,
the system config, lazy fetching of missing objects and every transport (a promisor remote
could otherwise be an `ext::` command) in the environment. Inherited `GIT_*` variables are
dropped so the snapshot depends on the directory alone.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: How many paths a list fact keeps; its `_count` fact holds the full number.
PATH_CAP = 20

_GIT = [
    "git",
    "--no-pager",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.untrackedCache=false",
    "-c",
    "log.showSignature=false",
]

_ENV = {
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_CONFIG_NOSYSTEM": "1",
    "LC_ALL": "C",
    # A partial clone fetches missing objects on demand, through whatever transport its
    # promisor remote names; no fetch, and an empty allow-list admits no transport at all.
    "GIT_NO_LAZY_FETCH": "1",
    "GIT_ALLOW_PROTOCOL": "",
}

#: The five commands, by the fact they produce.
COMMANDS: dict[str, list[str]] = {
    "root": ["rev-parse", "--show-toplevel"],
    "branch": ["symbolic-ref", "--short", "-q", "HEAD"],
    "head": ["rev-parse", "--short", "HEAD"],
    "staged": ["diff-index", "--cached", "--name-only", "-z", "HEAD"],
    "untracked": ["ls-files", "--others", "--exclude-standard", "-z"],
}


def world_facts(directory: Path, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """Facts about the repository holding `directory`, or None; never raises.

    `timeout_s` bounds the five commands together. Only the first one failing (not a
    repository, git missing, a timeout) gives None; a later failure leaves its fact out.
    """
    deadline = time.monotonic() + timeout_s
    try:
        root = _run("root", Path(directory), deadline)
        if root is None:
            return None
        root = root.rstrip(b"\n")
        facts: dict[str, Any] = {"root": _text(root)}
        # The rest run at the top, so both path lists are relative to it and cover the
        # whole repository whichever subdirectory the session worked in.
        top = Path(os.fsdecode(root))
        for name in ("branch", "head"):
            out = _run(name, top, deadline)
            if out is not None and out.strip():
                facts[name] = _text(out.strip())
        for name in ("staged", "untracked"):
            out = _run(name, top, deadline)
            if out is not None:
                facts.update(_path_list(name, out))
        return facts
    except Exception as exc:  # a snapshot is optional: it must never stop a publish
        log.warning("world snapshot failed", extra={"world": {"error": type(exc).__name__}})
        return None


def _run(name: str, cwd: Path, deadline: float) -> bytes | None:
    """Run one of the five commands; its stdout, or None when it failed or timed out."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        log.warning("world command skipped", extra={"world": {"command": name, "code": "time"}})
        return None
    try:
        done = subprocess.run(
            [*_GIT, *COMMANDS[name]],
            cwd=cwd,
            env=_environment(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=remaining,
            check=False,
        )
    except subprocess.TimeoutExpired:
        log.warning("world command failed", extra={"world": {"command": name, "code": "timeout"}})
        return None
    except OSError as exc:
        # git not on PATH, or the directory gone: no snapshot, and nothing unusual.
        log.debug(
            "world command failed", extra={"world": {"command": name, "code": type(exc).__name__}}
        )
        return None
    if done.returncode != 0:
        # Expected ones: root outside a repository, branch when detached, head and staged
        # before the first commit.
        log.debug(
            "world command failed", extra={"world": {"command": name, "code": done.returncode}}
        )
        return None
    return done.stdout


def _environment() -> dict[str, str]:
    """The caller's environment without its GIT_* variables, plus the fixed additions."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(_ENV)
    return env


def _path_list(name: str, out: bytes) -> dict[str, Any]:
    """A NUL-separated path list as `name` (capped) and `name_count` (all of them)."""
    paths = [_text(p) for p in out.split(b"\0") if p]
    return {name: paths[:PATH_CAP], f"{name}_count": len(paths)}


def _text(raw: bytes) -> str:
    """Git output as text; undecodable bytes become U+FFFD so the facts stay valid JSON."""
    return raw.decode("utf-8", errors="replace")
