"""The recall tool's answer: the original outputs behind refs, as `context_tree_query` gives them.

pi-condense's tool (reference §10.4) takes short refs (`t12`) or raw tool call ids and returns,
per match, a header (toolRef, Tool, Args, Status, Turn) and the original output, cut to the host's
defaults (2,000 lines or 50 KB). The originals come from the log: `entries` maps a sequence
number to the entry there. Pure: the same state and entries give the same text.

`resolve` is the one reading of a ref, for every route and command that recalls (serve's and
the workers' recall and ref routes, `sessionfold context --ref`), in this order:
- `eN`: the output at sequence number N of the log (an output nothing indexed);
- `tN`: the occurrence its short ref names;
- an occurrence key (`id@timestamp`, or a bare id indexed without a timestamp): that one;
- a bare tool call id: its indexed occurrence with the newest timestamp (pi-condense falls
  back to the bare id; an id a model reuses, such as `faux_call_3`, names the newest output
  that was summarized, the one a stub points at).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from sessionfold.projections.pruning import digest, index
from sessionfold.projections.pruning.capture import result_text
from sessionfold.projections.pruning.digest import message_of
from sessionfold.projections.pruning.records import IndexRecord
from sessionfold.projections.store import Store, key

#: pi's truncateHead defaults (DEFAULT_MAX_LINES, DEFAULT_MAX_BYTES).
MAX_LINES = 2000
MAX_BYTES = 50 * 1024
NOT_FOUND = "(not found in index — may not have been summarized yet)"
#: A log ref: the output at sequence number N (views/chains.py writes them).
LOG_REF = re.compile(r"e(\d+)")


@dataclass(frozen=True, slots=True)
class Resolved:
    """What a ref names: the toolResult's sequence number in the log, and its index record
    when the ref names an indexed occurrence (None for an `eN` ref)."""

    seq: int
    row: IndexRecord | None


def resolve(store: Store, session_id: str, ref: str) -> Resolved | None:
    """What `ref` names (the module's order), or None when it names nothing."""
    found = LOG_REF.fullmatch(ref)
    if found:
        return Resolved(int(found.group(1)), None)
    short = index.resolve_ref(store, session_id, ref) if ref.startswith("t") else None
    row = index.record(store, session_id, short or ref)
    if row is None and short is None:
        newest = index.newest_occurrence(store, session_id, ref)
        row = index.record(store, session_id, newest) if newest is not None else None
    if row is None or row["seq"] is None:
        return None
    return Resolved(row["seq"], row)


def resolve_ref(store: Store, session_id: str, ref: str) -> int | None:
    """The sequence number in the log of the original a ref names, or None."""
    found = resolve(store, session_id, ref)
    return None if found is None else found.seq


def recall_text(
    store: Store,
    session_id: str,
    ids: Sequence[str],
    entry_at: Callable[[int], dict[str, Any] | None],
    whole: bool = False,
) -> tuple[str, int]:
    """The tool's text for `ids`, and how many of them were found; `whole`: each output in
    full, not cut to pi's defaults (the MCP server pages the text instead: `page`)."""
    blocks = []
    found = 0
    for wanted in ids:
        resolved = resolve(store, session_id, wanted)
        result = entry_at(resolved.seq) if resolved is not None else None
        message = message_of(result) if result is not None else None
        if resolved is None or message is None or message.get("role") != "toolResult":
            blocks.append(f"## toolRef: {wanted}\n{NOT_FOUND}")
            continue
        found += 1
        row = resolved.row
        call_id = row["id"] if row is not None else message.get("toolCallId")
        aseq = row["aseq"] if row is not None else _assistant_seq(store, session_id, call_id)
        call = entry_at(aseq) if aseq is not None else None
        args = _arguments(message_of(call) if call is not None else None, call_id)
        tool: object = row["tool"] if row is not None else message.get("toolName")
        error = row["err"] if row is not None else bool(message.get("isError"))
        # An output nothing indexed has no turn of its own: -1, as a backfilled record shows.
        turn = row["turn"] if row is not None else -1
        header = [
            f"## toolRef: {wanted}",
            f"Tool: {tool}",
            f"Args: {orjson.dumps(args, option=orjson.OPT_INDENT_2).decode()}",
            f"Status: {'ERROR' if error else 'OK'}",
            f"Turn: {turn}",
        ]
        body = result_text(message)
        blocks.append("\n".join(header) + "\n\n" + (body if whole else _head(body)))
    return "\n\n---\n\n".join(blocks), found


def _assistant_seq(store: Store, session_id: str, call_id: object) -> int | None:
    """The log position of the newest assistant on the branch that made the call, or None."""
    if not isinstance(call_id, str):
        return None
    call = store.get(key(session_id, "c", call_id))
    row = digest.row_at(store, session_id, call["n"]) if call is not None else None
    if call is None or row is None or row["id"] != call["id"]:
        return None
    seq: int | None = row.get("seq")
    return seq


def _arguments(assistant: dict[str, Any] | None, call_id: object) -> Any:
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


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a text: its characters from `offset`, where the next page starts (None on
    the last page) and the text's length."""

    text: str
    offset: int
    next_offset: int | None
    total: int


def page(text: str, offset: int, limit: int) -> Page:
    """The page of `text` that starts at character `offset`, at most `limit` characters long.

    A page ends after a newline when one falls in its second half (a model reads whole lines),
    so the pages that follow each other's `next_offset` from 0 join into `text` exactly.
    """
    if offset < 0 or limit < 1:
        raise ValueError("offset >= 0 and limit >= 1")
    start = min(offset, len(text))
    end = min(start + limit, len(text))
    if end < len(text):
        newline = text.rfind("\n", start + limit // 2, end)
        end = newline + 1 if newline >= 0 else end
    return Page(text[start:end], start, end if end < len(text) else None, len(text))
