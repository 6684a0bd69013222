"""`sessionfold hook claude-code|codex`: the agents' `SessionStart` hook (docs/agents.md).

After the agent's own compaction (source `compact`) or on `resume` of a session that compacted,
it prints `{"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": ...}}`
whose context is the rule ledger's view for the next span (projections/ledger/hook.py). The
ledger comes from `serve` when it answers at once and has folded the compaction (`GET
/sessions/{id}`, SESSIONFOLD_SERVE_URL, default http://127.0.0.1:6068), else from folding the
transcript here with the offline model.

It fails open: any failure prints nothing on stdout, one line naming the error's class on
stderr (never a message's text), and exits 0, so the agent goes on as without it. Other events
and sources print nothing. It imports only what it uses, so the agent waits for it as little
as possible.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

AGENTS = ("claude-code", "codex")
DEFAULT_SERVE_URL = "http://127.0.0.1:6068"
#: How long the hook waits for serve, seconds: serve on this machine answers in milliseconds;
#: past this the hook folds the transcript itself.
SERVE_TIMEOUT_S = 0.3
#: The largest hook input read (the agents send a few hundred bytes).
MAX_STDIN_BYTES = 1 << 20
SOURCES = frozenset({"compact", "resume"})


class HookInputError(ValueError):
    """The hook's stdin is not the SessionStart input it expects."""


@dataclass(frozen=True)
class AgentCompactions:
    """What the transcript holds of the agent's own compactions."""

    count: int = 0
    #: The newest one's summary text (Claude Code's `isCompactSummary` line, Codex's
    #: `compacted` message).
    summary: str | None = None
    #: The model answered after the newest one: a compaction being reported now is not
    #: written yet (Claude Code 2.1.328 runs the hook before it writes the summary line).
    answered_since: bool = True
    #: The newest one's entry id where the format gives it (Claude Code: the summary line's
    #: uuid, which names the ledger's span record of it).
    entry: str | None = None


def agent_summary(path: Path, agent: str) -> AgentCompactions:
    """The agent's compactions in the transcript (one read, a JSON parse of the few lines
    that can matter)."""
    marker = b"isCompactSummary" if agent == "claude-code" else b'"compacted"'
    answer = b'"assistant"' if agent == "claude-code" else b'"response_item"'
    data = path.read_bytes()
    if marker not in data:
        return AgentCompactions()
    count, text, answered, entry = 0, None, True, None
    for line in data.splitlines():
        if marker in line:
            obj = _json(line)
            found = _summary_of(obj, agent)
            if found is not None:
                count, text, answered = count + 1, found, False
                uuid = obj.get("uuid") if isinstance(obj, dict) else None
                entry = uuid if isinstance(uuid, str) else None
        elif not answered and answer in line:
            answered = _answers(_json(line), agent)
    return AgentCompactions(count, text, answered, entry)


def _json(line: bytes) -> object:
    try:
        return json.loads(line)
    except ValueError:
        return None


def _answers(obj: object, agent: str) -> bool:
    """Whether a line is the model's answer (an assistant message or a tool call)."""
    if not isinstance(obj, dict):
        return False
    if agent == "claude-code":
        return obj.get("type") == "assistant"
    payload = obj.get("payload")
    if obj.get("type") != "response_item" or not isinstance(payload, dict):
        return False
    return payload.get("role") == "assistant" or payload.get("type") == "function_call"


def _summary_of(obj: object, agent: str) -> str | None:
    if not isinstance(obj, dict):
        return None
    if agent == "claude-code":
        if obj.get("isCompactSummary") is not True:
            return None
        content = (obj.get("message") or {}).get("content")
        if isinstance(content, str):
            return content
        return "".join(
            b.get("text", "")
            for b in content or []
            if isinstance(b, dict) and isinstance(b.get("text"), str)
        )
    if obj.get("type") != "compacted" or not isinstance(obj.get("payload"), dict):
        return None
    message = obj["payload"].get("message")
    return message if isinstance(message, str) else ""


def _token() -> str | None:
    token = os.environ.get("SESSIONFOLD_API_TOKEN")
    if token:
        return token.strip()
    path = os.environ.get("SESSIONFOLD_API_TOKEN_FILE")
    return Path(path).read_text().strip() if path else None


def serve_view(session_id: str, found: AgentCompactions) -> dict[str, Any] | None:
    """serve's ledger view of the session when serve answers within `SERVE_TIMEOUT_S` and has
    folded the transcript's newest compaction (its span record names it, or serve has as many
    compaction spans as the transcript has compactions); else None."""
    # http.client, not httpx: a hook's start time is the agent's wait.
    import http.client
    from urllib.parse import quote, urlsplit

    url = urlsplit(os.environ.get("SESSIONFOLD_SERVE_URL") or DEFAULT_SERVE_URL)
    kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    connection = kind(url.hostname or "127.0.0.1", url.port, timeout=SERVE_TIMEOUT_S)
    headers = {"Accept": "application/json"}
    if token := _token():
        headers["Authorization"] = f"Bearer {token}"
    try:
        path = f"{url.path.rstrip('/')}/sessions/{quote(session_id, safe='')}"
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        if response.status != 200:
            return None
        document = json.loads(response.read())
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        connection.close()
    view = document.get("ledger") if isinstance(document, dict) else None
    if not isinstance(view, dict):
        return None
    spans = [s for s in view.get("spans", []) if s.get("trigger") == "compaction"]
    if found.entry is not None and any(s.get("entry") == found.entry for s in spans):
        return view
    return view if len(spans) >= found.count else None


def embedded_view(path: Path, to_end: bool) -> dict[str, Any] | None:
    """The ledger view of the transcript folded here, offline; `to_end`: with a pass at its
    end when no compaction closed it (what was just compacted, when the agent has not written
    its compaction yet), else up to its last compaction."""
    # Imported here: the fold is only needed when serve did not answer.
    from sessionfold.ports.ledger.model import OfflineModel
    from sessionfold.projections.ledger.config import DEFAULT_LEDGER
    from sessionfold.projections.ledger.view import ledger_view
    from sessionfold.streams.publishing.session_file import read_session_file
    from sessionfold.streams.runtime.ledger_loop import fold_records

    # On resume what came after the last compaction is in the agent's context word for word:
    # no pass over it.
    run = fold_records(
        read_session_file(path), OfflineModel(), config=DEFAULT_LEDGER, final_pass=to_end
    )
    if run.session_id is None:
        return None
    return ledger_view(run.store, run.session_id, DEFAULT_LEDGER)


def hook_output(agent: str, stdin: bytes) -> str | None:
    """The hook's stdout for one input (None: print nothing). Raises on a bad input."""
    from sessionfold.projections.ledger.hook import hook_context

    if agent not in AGENTS:
        raise HookInputError("agent")
    data = json.loads(stdin)
    if not isinstance(data, dict):
        raise HookInputError("input")
    if data.get("hook_event_name") != "SessionStart" or data.get("source") not in SOURCES:
        return None
    session_id, transcript = data.get("session_id"), data.get("transcript_path")
    if not isinstance(session_id, str) or not isinstance(transcript, str) or not transcript:
        raise HookInputError("input")
    path = Path(transcript)
    found = agent_summary(path, agent)
    resume = data["source"] == "resume"
    if found.count == 0 and resume:
        return None  # nothing was compacted: the whole session is in the agent's context
    # The newest compaction written is the one in force (not so when the model answered since:
    # the one reported is not written yet). serve folds only what is written, so it can answer
    # only then; and only then does the agent's summary in the file hold what the model sees.
    current = resume or not found.answered_since
    view = serve_view(session_id, found) if current else None
    if view is None:
        view = embedded_view(path, to_end=not resume)
    text = hook_context(view, found.summary if current else None)
    if not text:
        return None
    output = {"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": text}}
    return json.dumps(output, ensure_ascii=False)


def register(app: typer.Typer) -> None:
    """Attach the `hook` command to the root app."""

    @app.command("hook")
    def hook(
        agent: Annotated[
            str, typer.Argument(metavar="claude-code|codex", help="The agent that runs the hook.")
        ],
    ) -> None:
        """The agents' SessionStart hook: the rule ledger after a compaction (fails open)."""
        # The reader's warnings (a line it could not read) are not the agent's business here.
        logging.disable(logging.CRITICAL)
        try:
            output = hook_output(agent, sys.stdin.buffer.read(MAX_STDIN_BYTES))
        except Exception as exc:  # the hook must never stop the agent
            # The class only: an exception's message may quote the transcript.
            print(f"sessionfold hook: {type(exc).__name__}", file=sys.stderr)
            return
        if output is not None:
            sys.stdout.write(output + "\n")
