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
from sessionfold.streams.embedded import fold_files
from sessionfold.streams.synthetic import generate_session, session_bytes

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


def huge_output_session(path: Path, *, lines: bool = False) -> Path:
    """A generated session whose third bash output is `HUGE_CHARS` long (on one line, or the
    same text split into lines), followed a few entries later by a pi compaction."""
    entries = generate_session(seed=3, turns=60)
    index = [i for i, entry in enumerate(entries) if _is_bash_result(entry)][2]
    text = (UNIT * (HUGE_CHARS // len(UNIT) + 1))[:HUGE_CHARS]
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
    path.write_bytes(session_bytes(entries))
    return path


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
