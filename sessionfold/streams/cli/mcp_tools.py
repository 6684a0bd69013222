"""What `sessionfold mcp`'s tools answer, without the MCP SDK (cli/mcp.py serves them).

- `recall`: `context_tree_query`'s text (views/recall.py) for refs or tool call ids, each
  original output whole, read back from the agent's transcript, then paged (`page`);
- `ledger`: the rule ledger's rules, commands and errors with their ids (projections/ledger/
  hook.py's text), read-only.

Both ask `serve` first (SESSIONFOLD_SERVE_URL, default http://127.0.0.1:6068, with the hook's
token settings) and fold the transcript here, offline, when serve does not answer at once, does
not know the session or does not find every id. The session is the one the server was started
for (`--session-file`, `--session`), else the one the agent names: Claude Code gives its MCP
servers `CLAUDE_CODE_SESSION_ID`, Codex names its thread in each call's `_meta` (`sessionId`).
A call that names another session is refused. Failures raise `ToolFailure`, whose message never
holds a transcript's words.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sessionfold.streams.runtime.agent_dirs import claude_projects_dir, codex_sessions_dir

if TYPE_CHECKING:
    from sessionfold.projections.pruning.config import PruneConfig

# The folds and views are imported where they are used: the agent waits for the server's
# start (Codex 0.169's `exec` lists a server's tools only if it answers within about a second).

AGENTS = ("claude-code", "codex")
DEFAULT_SERVE_URL = "http://127.0.0.1:6068"
#: How long a tool waits for serve, seconds, before it folds the transcript itself.
SERVE_TIMEOUT_S = 0.5
#: Characters per page by default: about 10k tokens, under Claude Code's warning for an MCP
#: tool's output (10,000 tokens; it refuses past MAX_MCP_OUTPUT_TOKENS, 25,000 by default).
DEFAULT_LIMIT = 40_000
MAX_LIMIT = 200_000
#: serve's bounds on a recall (web/live_contract.py): most ids, longest id.
MAX_IDS = 100
MAX_ID_CHARS = 256
#: The newest rollouts looked at when Codex names no session (the one in this cwd).
CODEX_RECENT = 50


class ToolFailure(Exception):
    """A tool's failure, with a message for the model that quotes no transcript."""


@dataclass
class _Folded:
    """One transcript folded here: what a recall needs, kept while the file is unchanged."""

    stamp: tuple[int, int]
    store: Any
    log: dict[int, dict[str, Any]]


@dataclass
class SessionSource:
    """Where the server finds its session: the command's arguments, the agent's environment
    and working directory, the pruning settings serve folds with."""

    agent: str
    session_file: Path | None = None
    session_id: str | None = None
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    cwd: Path = field(default_factory=Path.cwd)
    #: The pruning settings (`--config`, `--set`): read at the first fold, not at the start.
    config_file: Path | None = None
    overrides: list[str] = field(default_factory=list)
    _folded: dict[Path, _Folded] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def pinned(self) -> str | None:
        """The session the arguments or the agent's environment name (None: per call)."""
        if self.session_file is not None:
            return self.session_id or _file_session(self.session_file)
        if self.session_id:
            return self.session_id
        if self.agent == "claude-code":
            return self.env.get("CLAUDE_CODE_SESSION_ID") or None
        return None

    def resolve(self, named: str | None) -> tuple[str, Path]:
        """The session id and transcript for a call; `named`: the session the call itself
        names (Codex's `_meta`, or the tool's `session_id` argument)."""
        pinned = self.pinned()
        if pinned is not None and named is not None and named != pinned:
            raise ToolFailure(
                "that session is not this agent's session: this server recalls only its own"
            )
        wanted = pinned or named
        if self.session_file is not None:
            path: Path | None = self.session_file
        elif wanted is not None:
            path = self._find(wanted)
        else:
            path, wanted = self._in_cwd()
        if path is None or wanted is None or not path.is_file():
            raise ToolFailure("no transcript of this session was found")
        return wanted, path

    def _find(self, session_id: str) -> Path | None:
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", session_id):
            return None
        if self.agent == "claude-code":
            found = list(claude_projects_dir(self.env).glob(f"*/{session_id}.jsonl"))
        else:
            found = list(codex_sessions_dir(self.env).glob(f"*/*/*/rollout-*-{session_id}.jsonl"))
        return max(found, key=_mtime) if found else None

    def _in_cwd(self) -> tuple[Path | None, str | None]:
        """The newest transcript the agent wrote for this working directory."""
        if self.agent == "claude-code":
            folder = re.sub(r"[^A-Za-z0-9]", "-", str(self.cwd))
            found = list((claude_projects_dir(self.env) / folder).glob("*.jsonl"))
            newest = max(found, key=_mtime) if found else None
            return newest, newest.stem if newest is not None else None
        rollouts = sorted(codex_sessions_dir(self.env).glob("*/*/*/rollout-*.jsonl"), key=_mtime)
        for path in reversed(rollouts[-CODEX_RECENT:]):
            meta = _first_line(path).get("payload") or {}
            if isinstance(meta, dict) and meta.get("cwd") == str(self.cwd) and meta.get("id"):
                return path, str(meta["id"])
        return None, None

    def config(self) -> PruneConfig:
        """The pruning settings serve folds with; ToolFailure naming a bad key."""
        from sessionfold.projections.pruning.config import ConfigError
        from sessionfold.streams.runtime.config_files import load_config

        try:
            return load_config(self.config_file, self.overrides)
        except ConfigError as exc:
            raise ToolFailure(f"invalid sessionfold config {exc.key}: {exc.problem}") from None
        except OSError as exc:
            raise ToolFailure(
                f"cannot read the sessionfold config ({type(exc).__name__})"
            ) from None

    def fold(self, path: Path, session_id: str) -> _Folded:
        """The transcript folded here (the last fold again while the file is unchanged)."""
        # Imported here: a recall that serve answers never needs the fold.
        from sessionfold.streams.tools.replay import Collector, replay_files

        stat = path.stat()
        stamp = (stat.st_size, stat.st_mtime_ns)
        with self._lock:
            known = self._folded.get(path)
            if known is not None and known.stamp == stamp:
                return known
            collector = Collector(session_id)
            replayer = replay_files([path], self.config(), [session_id], on_folded=collector)
            log = {item.seq: item.entry for item in collector.entries}
            folded = _Folded(stamp, replayer.runtime.store, log)
            self._folded[path] = folded
            return folded


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _first_line(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            value = json.loads(handle.readline())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _file_session(path: Path) -> str | None:
    from sessionfold.streams.publishing.session_file import header_of

    try:
        header = header_of(path)
    except OSError:
        return None
    return None if header is None else str(header["id"])


def check_ids(ids: object) -> list[str]:
    """The ids a recall names; ToolFailure when they are not 1 to 100 short strings."""
    if not isinstance(ids, list) or not ids or len(ids) > MAX_IDS:
        raise ToolFailure(f"toolCallIds: give 1 to {MAX_IDS} refs (t12) or tool call ids")
    if not all(isinstance(i, str) and 0 < len(i) <= MAX_ID_CHARS for i in ids):
        raise ToolFailure(f"toolCallIds: each a string of 1 to {MAX_ID_CHARS} characters")
    return ids


def paged(text: str, offset: int, limit: int) -> str:
    """`text` from `offset`, at most `limit` characters, with a last line saying where the next
    page starts when there is one (none when the whole text fits)."""
    if offset < 0 or not 0 < limit <= MAX_LIMIT:
        raise ToolFailure(f"offset >= 0 and 1 <= limit <= {MAX_LIMIT}")
    if offset and offset >= len(text):
        raise ToolFailure(f"offset is past the end: the text has {len(text)} characters")
    from sessionfold.projections.views.recall import page

    part = page(text, offset, limit)
    if part.offset == 0 and part.next_offset is None:
        return part.text
    end = part.offset + len(part.text)
    note = f"[Page: characters {part.offset}-{end} of {part.total}."
    if part.next_offset is not None:
        note += f" Next page: call again with offset={part.next_offset}.]"
    else:
        note += " Last page.]"
    return f"{part.text}\n\n{note}"


def _token(env: Mapping[str, str]) -> str | None:
    """serve's API token, as the hook reads it (cli/hook.py)."""
    token = env.get("SESSIONFOLD_API_TOKEN")
    if token:
        return token.strip()
    path = env.get("SESSIONFOLD_API_TOKEN_FILE")
    return Path(path).read_text().strip() if path else None


def ask_serve(
    env: Mapping[str, str], method: str, route: str, body: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """serve's JSON answer to one route of a session, or None when it does not answer 200
    within `SERVE_TIMEOUT_S`."""
    # http.client, not httpx: the server starts when the agent does.
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(env.get("SESSIONFOLD_SERVE_URL") or DEFAULT_SERVE_URL)
    kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    if token := _token(env):
        headers["Authorization"] = f"Bearer {token}"
    payload = json.dumps(body).encode() if body is not None else None
    try:
        connection = kind(url.hostname or "127.0.0.1", url.port, timeout=SERVE_TIMEOUT_S)
        connection.request(method, f"{url.path.rstrip('/')}{route}", payload, headers)
        response = connection.getresponse()
        document = json.loads(response.read()) if response.status == 200 else None
        connection.close()
    except (OSError, ValueError, http.client.HTTPException):
        return None
    return document if isinstance(document, dict) else None


def _route(session_id: str, tail: str = "") -> str:
    from urllib.parse import quote

    return f"/sessions/{quote(session_id, safe='')}{tail}"


def recall(
    source: SessionSource,
    ids: object,
    offset: int = 0,
    limit: int = DEFAULT_LIMIT,
    named: str | None = None,
) -> str:
    """`context_tree_query`'s page: the originals behind `ids` (refs or tool call ids) of the
    session, whole, from `offset`."""
    wanted = check_ids(ids)
    session_id, path = source.resolve(named)
    text = _recall_from_serve(source.env, session_id, wanted)
    if text is None:
        from sessionfold.projections.views.recall import recall_text

        folded = source.fold(path, session_id)
        text, _found = recall_text(folded.store, session_id, wanted, folded.log.get, whole=True)
    return paged(text, offset, limit)


def _recall_from_serve(env: Mapping[str, str], session_id: str, ids: list[str]) -> str | None:
    """serve's text when it finds every id (a serve behind the file may not know a new one)."""
    answer = ask_serve(env, "POST", _route(session_id, "/recall"), {"ids": ids, "whole": True})
    if answer is None or answer.get("found") != len(ids) or not isinstance(answer.get("text"), str):
        return None
    text: str = answer["text"]
    return text


#: The ledger tool's text when the ledger holds nothing yet.
EMPTY_LEDGER = "(the rule ledger holds no rules, commands or errors yet)"


def ledger(
    source: SessionSource, offset: int = 0, limit: int = DEFAULT_LIMIT, named: str | None = None
) -> str:
    """The `ledger` tool's page: the rules in force, commands and errors with their ids."""
    from sessionfold.projections.ledger.hook import hook_context

    session_id, path = source.resolve(named)
    document = ask_serve(source.env, "GET", _route(session_id))
    view = document.get("ledger") if document is not None else None
    if not isinstance(view, dict):
        from sessionfold.streams.cli.hook import embedded_view

        view = embedded_view(path, to_end=True)
    text = hook_context(view, None) if view is not None else ""
    return paged(text or EMPTY_LEDGER, offset, limit)


def call_session(meta: Mapping[str, Any] | None) -> str | None:
    """The session a call's `_meta` names (Codex 0.169: `sessionId`, `threadId`, and
    `session_id` in `x-codex-turn-metadata`), or None."""
    if not meta:
        return None
    for key in ("sessionId", "threadId"):
        if isinstance(meta.get(key), str) and meta[key]:
            return str(meta[key])
    turn = meta.get("x-codex-turn-metadata")
    if isinstance(turn, Mapping) and isinstance(turn.get("session_id"), str):
        return str(turn["session_id"])
    return None


def named_sessions(asked: str | None, meta: str | None) -> str | None:
    """The one session a call names (its argument, its `_meta`); ToolFailure when they differ."""
    if asked is not None and meta is not None and asked != meta:
        raise ToolFailure(
            "that session is not this agent's session: this server recalls only its own"
        )
    return asked or meta
