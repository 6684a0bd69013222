"""The recall tool's answer: the original outputs behind refs, as `context_tree_query` gives them.

pi-condense's tool (reference §10.4) takes short refs (`t12`) or raw tool call ids and returns,
per match, a header (toolRef, Tool, Args, Status, Turn) and the original output, cut to the host's
defaults (2,000 lines or 50 KB). The originals come from the log: `entries` maps a sequence
number to the entry there. Pure: the same state and entries give the same text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson

from sessionfold.projections.pruning import index
from sessionfold.projections.pruning.capture import result_text
from sessionfold.projections.pruning.digest import message_of
from sessionfold.projections.store import Store

#: pi's truncateHead defaults (DEFAULT_MAX_LINES, DEFAULT_MAX_BYTES).
MAX_LINES = 2000
MAX_BYTES = 50 * 1024
NOT_FOUND = "(not found in index — may not have been summarized yet)"


def recall_text(
    store: Store,
    session_id: str,
    ids: Sequence[str],
    entry_at: Callable[[int], dict[str, Any] | None],
) -> tuple[str, int]:
    """The tool's text for `ids`, and how many of them were found."""
    blocks = []
    found = 0
    for wanted in ids:
        key = index.resolve_ref(store, session_id, wanted) if wanted.startswith("t") else None
        row = index.record(store, session_id, key or wanted)
        result = entry_at(row["seq"]) if row is not None and row["seq"] is not None else None
        message = message_of(result) if result is not None else None
        if row is None or message is None:
            blocks.append(f"## toolRef: {wanted}\n{NOT_FOUND}")
            continue
        found += 1
        call = entry_at(row["aseq"]) if row["aseq"] is not None else None
        args = _arguments(message_of(call) if call is not None else None, row["id"])
        status = "ERROR" if row["err"] else "OK"
        header = [
            f"## toolRef: {wanted}",
            f"Tool: {row['tool']}",
            f"Args: {orjson.dumps(args, option=orjson.OPT_INDENT_2).decode()}",
            f"Status: {status}",
            f"Turn: {row['turn']}",
        ]
        blocks.append("\n".join(header) + "\n\n" + _head(result_text(message)))
    return "\n\n---\n\n".join(blocks), found


def _arguments(assistant: dict[str, Any] | None, call_id: str) -> Any:
    content = assistant.get("content") if assistant is not None else None
    for block in content if isinstance(content, list) else []:
        if (
            isinstance(block, dict)
            and block.get("type") == "toolCall"
            and block.get("id") == call_id
        ):
            return block.get("arguments")
    return {}


def _head(text: str) -> str:
    """The text cut to MAX_LINES lines and MAX_BYTES bytes, saying so when cut."""
    lines = text.split("\n")
    kept: list[str] = []
    size = 0
    for line in lines[:MAX_LINES]:
        size += len(line.encode()) + 1
        if size > MAX_BYTES:
            break
        kept.append(line)
    if len(kept) == len(lines):
        return text
    return "\n".join(kept) + f"\n[Output truncated: {len(kept)}/{len(lines)} lines shown]"
