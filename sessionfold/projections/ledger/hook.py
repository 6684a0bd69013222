"""What the `SessionStart` hook hands an agent after its own compaction: the ledger, shorter.

The same render as pi's compaction summary (render.py), over the ledger view (view.py, the
shape serve's `GET /sessions/{id}` and `sessionfold ledger --json` give), with only what the
next span needs: the rules in force in the user's exact words with their ids (a withdrawn rule
never), decisions, dead ends, Now (what was last asked), the files read and not changed since,
the commands worth knowing (the last run of each, newest kept) and the errors no later run of
the same command cleared. Lifted rules, values, the narrative, files modified and the World are
left out: the agent's own summary tells the story, and the lifted words must not come back.

A rule the agent's own summary already quotes word for word (whitespace folded) is named by
id only, so the model is not told the same words twice.
"""

from __future__ import annotations

from typing import Any

from sessionfold.projections.ledger.render import render

#: The hook's text is at most this long (Claude Code keeps a hook's context whole up to 10,000
#: characters; this leaves room).
HOOK_CHARS = 8_000
#: At most this many commands (the newest distinct ones).
HOOK_COMMANDS = 20
HOOK_HEADER = (
    "# sessionfold rule ledger (the user's standing rules and the state of the work, "
    "kept across the compaction)"
)
_LEFT_OUT = frozenset({"lifted", "values", "narrative", "modified", "world"})


def _folded(text: str) -> str:
    return " ".join(text.split())


def state_of_view(view: dict[str, Any]) -> dict[str, Any]:
    """The render's state from a ledger view: rules in force only, each with its origin."""
    sources = {s["id"]: s for s in view.get("ruleSources", [])}
    rules = [
        {
            "id": rule["id"],
            "words": rule["words"],
            "entry": rule.get("entry"),
            "u": sources.get(rule["id"], {}).get("u", "?"),
            "lifted": None,
        }
        for rule in view.get("rules", [])
        if not rule.get("lifted")
    ]
    return {**view, "rules": rules}


def _commands_that_matter(
    commands: list[dict[str, Any]], errors: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The last run of each command (newest `HOOK_COMMANDS`), and the errors not cleared by a
    later run of the same command that ended with exit 0."""
    last: dict[str, dict[str, Any]] = {}
    for command in commands:
        text = _folded(str(command.get("command") or ""))
        last.pop(text, None)  # re-inserted: dict order is then the order of last runs
        last[text] = command
    kept = list(last.values())[-HOOK_COMMANDS:]
    cleared = {
        str(c.get("id"))
        for c in commands
        if (final := last.get(_folded(str(c.get("command") or "")))) is not None
        and final is not c
        and final.get("exit") == 0
    }
    return kept, [e for e in errors if str(e.get("command")) not in cleared]


def hook_context(
    view: dict[str, Any] | None, agent_summary: str | None = None, limit: int = HOOK_CHARS
) -> str:
    """The hook's additionalContext for a ledger view; empty when there is nothing to say."""
    if not view:
        return ""
    state = state_of_view(view)
    quoted: list[str] = []
    if agent_summary:
        held = _folded(agent_summary)
        quoted = [r["id"] for r in state["rules"] if _folded(r["words"]) in held]
        state["rules"] = [r for r in state["rules"] if r["id"] not in quoted]
    state["commands"], state["errors"] = _commands_that_matter(
        state.get("commands", []), state.get("errors", [])
    )
    if (
        not any(
            state.get(key)
            for key in ("rules", "decisions", "deadEnds", "now", "commands", "errors")
        )
        and not quoted
        and not any(f.get("op") == "read" for f in state.get("files", []))
    ):
        return ""
    header = HOOK_HEADER
    if quoted:
        ids = ", ".join(quoted)
        header += f"\n\nIn force and quoted word for word in the summary above: {ids}."
    text, _ = render(state, limit, leave_out=_LEFT_OUT, header=header)
    return text
