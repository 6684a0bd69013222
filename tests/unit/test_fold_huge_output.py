"""A fold is linear in an entry's size: one bash output of a megabyte on one line folds in
seconds (issue #10, item 1; before the fix the ledger's value scan took many minutes on it).

The session runs through the embedded runtime with the pruning folds and the rule ledger, and
the huge output stands inside the span a pi compaction closes, so the ledger's offline pass
runs over it too (its command's head and tail, and the values code read from all of it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sessionfold.projections.ledger.config import DEFAULT_LEDGER
from sessionfold.projections.ledger.values import CUT_MARK
from sessionfold.streams.runtime.embedded import fold_files
from sessionfold.streams.tools.synthetic import generate_session, session_bytes

HUGE_CHARS = 1_000_000
# Backticks, quotes, slashes, digits and "…" (never " … ", the excerpt's cut mark: the line
# that holds one is left out when values are read, and this line is the whole output).
UNIT = 'GET /api/v1/items?id=42 200 took 12ms on port 8080 `ok` "done…" a.b/c  '
COMPACTION_ID = "c0ffee01"


def _is_bash_result(entry: dict[str, Any]) -> bool:
    message = entry.get("message") if entry.get("type") == "message" else None
    return (
        isinstance(message, dict)
        and message.get("role") == "toolResult"
        and message.get("toolName") == "bash"
    )


def _huge(unit: str) -> str:
    return (unit * (HUGE_CHARS // len(unit) + 1))[:HUGE_CHARS]


def huge_output_session(path: Path, *, lines: bool = False, everything: bool = False) -> Path:
    """A generated session whose third bash output is `HUGE_CHARS` long (on one line, or the
    same text split into lines), followed a few entries later by a pi compaction.

    With `everything`, two user messages and one file tool's path are that long too, each
    made of what the rule reading and the protected-path globs used to read again and again.
    """
    entries = generate_session(seed=3, turns=60)
    index = [i for i, entry in enumerate(entries) if _is_bash_result(entry)][2]
    text = _huge(UNIT)
    if lines:
        text = text.replace("  ", "\n")
    entries[index]["message"]["content"] = [{"type": "text", "text": text}]
    at = index + 6
    before = entries[at - 1]
    entries.insert(
        at,
        {
            "type": "compaction",
            "id": COMPACTION_ID,
            "parentId": before["id"],
            "timestamp": before["timestamp"],
            "summary": "## Goal\nKeep going.\n\n## Progress\nRan the server; it listens on 8080.",
            "firstKeptEntryId": before["id"],
            "tokensBefore": 150_000,
        },
    )
    entries[at + 1]["parentId"] = COMPACTION_ID
    if everything:
        messages = [e["message"] for e in entries if e.get("type") == "message"]
        users = [m for m in messages if m["role"] == "user"]
        for user, unit in zip(users[1:3], EVIL_USER_UNITS, strict=True):
            user["content"] = [{"type": "text", "text": _huge(unit)}]
        call = next(
            block
            for m in messages
            if m["role"] == "assistant"
            for block in m["content"]
            if block.get("type") == "toolCall" and "path" in (block.get("arguments") or {})
        )
        call["arguments"]["path"] = _huge("skills/") + "x.txt"
    path.write_bytes(session_bytes(entries))
    return path


EVIL_USER_UNITS = (
    "never the only don't forget the “ « <goal ` I don't think ok, ,  ",
    "a thing that never ",
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lines", [False, True], ids=["one line", "split into lines"])
def test_a_megabyte_tool_output_folds_in_seconds(tmp_path: Path, lines: bool) -> None:
    """The fold (pruning, ledger, the ledger's pass at pi's compaction) finishes, reads the
    output's values from the whole of it and keeps only its head and tail."""
    path = huge_output_session(tmp_path / "huge.jsonl", lines=lines)
    result = fold_files([path], ledger=DEFAULT_LEDGER)
    (state,) = result["sessions"].values()
    ledger = state["ledger"]
    (span,) = [s for s in ledger["spans"] if s["trigger"] == "compaction"]
    assert span["entry"] == COMPACTION_ID
    (huge,) = [c for c in ledger["commands"] if c["excerpt"].startswith(UNIT[:40])]
    assert span["commands"]["first"] <= int(huge["id"][1:]) <= span["commands"]["last"]
    assert CUT_MARK in huge["excerpt"]
    assert len(huge["excerpt"]) <= 2 * DEFAULT_LEDGER.excerpt_chars + len(CUT_MARK)
    assert ["12ms", "timing"] in huge["values"]
    assert ["port 8080", "port"] in huge["values"]


@pytest.mark.timeout(60)
def test_megabyte_user_messages_and_paths_fold_in_seconds(tmp_path: Path) -> None:
    """Two megabyte user messages (rule words, quotes and tags left open) and a megabyte
    path of `skills/` directories fold as fast as the rest: the ledger keeps each message's
    head and reads rules from it, the protected-path globs read the path once."""
    path = huge_output_session(tmp_path / "huge.jsonl", everything=True)
    result = fold_files([path], ledger=DEFAULT_LEDGER)
    (state,) = result["sessions"].values()
    assert [s["trigger"] for s in state["ledger"]["spans"]] == ["compaction"]
