"""The gateway's rewrite plan: what the rendered context changes of the agent's own tool
results and compressed chains, by tool call id, in a form every model API can carry.

A provider's request holds the agent's messages, not pi's: the gateway cannot drop or insert
messages freely without breaking the pairs of calls and results the APIs require. So the plan
says two things:
- each tool result the render took out, by call id: a stubbed result (reference §7.2) becomes
  the stub's text, a result of a compressed chain (§7.5) the stub of its ref, and the summary
  that covers them (a per-batch summary, a chain's text) rides in the first of its results;
- each compressed chain the render shows: its calls and its synthetic message's text. The
  gateway drops the chain's range whole (every call with its result, and the assistant
  messages that made them) and puts the text after the chain's prompt, as the render does;
  where the request's range does not hold exactly those calls, it stubs their results instead.
Everything else passes as the agent sent it.

Pure: a function of the rendered view (context.py), no I/O.
"""

from __future__ import annotations

import re
from typing import Any

from sessionfold.projections.views.base import split_occurrence
from sessionfold.projections.views.context import ContextView
from sessionfold.projections.views.phases import SYNTHETIC_ID

#: customType of the per-batch summary messages the render puts in pi's context.
SUMMARY_TYPE = "context-prune-summary"
_CHAIN_TOOLS = re.compile(r'\A<compressed-chain id="[^"]*" tools="([^"]*)">')


def stub_text(ref: str) -> str:
    """The text a summarized result becomes (pi-condense's stub, §7.2)."""
    return (
        f"[Summarized in pruner summary, ref `{ref}`. "
        "Use context_tree_query to retrieve full output.]"
    )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)
    )


def rewrite_plan(view: ContextView) -> dict[str, str]:
    """Tool call id -> the text its result becomes, for every result the render took out."""
    plan: dict[str, str] = {}
    for message in view.messages:
        if message.get("role") != "toolResult" or id(message) in view.origin:
            continue  # the log's own result, as the agent sent it
        details = message.get("details")
        call = message.get("toolCallId")
        if isinstance(call, str) and not (isinstance(details, dict) and "sessionfold" in details):
            plan[call] = _text(message.get("content"))  # a stub (placeholders are not ours)
    by_ref: dict[str, str] = {}
    for removal in view.removed:
        # a chain's results, and stubs a later chain range dropped (the removal says stub)
        if removal.how in ("chain", "stub") and removal.ref is not None:
            call, _stamp = split_occurrence(removal.key)
            plan.setdefault(call, stub_text(removal.ref))
            by_ref[removal.ref] = call
    for message in view.messages:
        covered = _covered(message, by_ref)
        first = next((call for call in covered if call in plan), None)
        if first is not None:
            plan[first] += "\n\n" + _text(message.get("content"))
    return plan


def chain_plan(view: ContextView) -> list[dict[str, Any]]:
    """Each compressed chain the render shows: its id, the calls its range holds (first seen
    first) and the text of the message that stands in for it."""
    texts: dict[str, str] = {}
    for message in view.messages:
        if message.get("role") == "user":
            text = _text(message.get("content"))
            found = SYNTHETIC_ID.match(text)
            if found is not None:
                texts.setdefault(found.group(1), text)
    return [
        {
            "id": entry.block_id,
            "calls": list(
                dict.fromkeys(split_occurrence(c)[0] for c in entry.dropped_tool_call_ids)
            ),
            "text": texts[entry.block_id],
        }
        for entry in view.chains
        if entry.block_id in texts and entry.dropped_tool_call_ids
    ]


def _covered(message: dict[str, Any], by_ref: dict[str, str]) -> list[str]:
    """The tool call ids a summary message covers, in its order ([] for any other message)."""
    if message.get("role") == "custom" and message.get("customType") == SUMMARY_TYPE:
        details = message.get("details")
        refs = details.get("toolCallRefs") if isinstance(details, dict) else None
        return [
            r["toolCallId"]
            for r in (refs if isinstance(refs, list) else [])
            if isinstance(r, dict) and isinstance(r.get("toolCallId"), str)
        ]
    if message.get("role") == "user":
        found = _CHAIN_TOOLS.match(_text(message.get("content")))
        if found is not None:
            return [by_ref[ref] for ref in found.group(1).split(",") if ref in by_ref]
    return []
