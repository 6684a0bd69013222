"""One entry's facts, derived once: what every fold needs to know about an entry and its message.

`facts_of(envelope)` reads an entry envelope's raw entry once into an `EntryFacts`, a compact
immutable msgspec struct kept on the envelope's payload, so each fold step (the digest, the tool
windows, the metrics, the ledger) is handed the same facts instead of reading the dict again.
The raw entry stays on the envelope: the archive, the held events and the context view read it.
Both runtimes derive the facts with this one function from the same entry dict (read from a
file by any format's reader, or decoded from the wire), so they fold the same facts.

The facts (pi-condense's definitions, reference §1 and §3):
- `message`: the message the entry puts on the branch (`message_of`: a `message` entry's, or a
  `custom_message` projected as pi does), None for other entries; `role` its role.
- `chars`: `JSON.stringify(message).length` (jsjson); `ts` the message's numeric timestamp,
  `ets` the entry's ISO timestamp.
- assistant: `text_only` (no toolCall block), `stop`, `think` (JSON length of the thinking
  blocks), `calls` (every toolCall block: id, name, path argument, arguments, their JSON size),
  and with calls `text` (its text trimmed) and `stamp` (its batch's timestamp in ms); `usage`
  (the context tokens its usage reports, None if none).
- toolResult: `call_id`, `tool`, `occ` (occurrence key), `is_error`, `text` (its text blocks
  joined) and `raw` (its JavaScript length).
- user: `passthrough` (a `<compressed-chain` synthetic); custom: `custom_type`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec

from sessionfold.events.envelope import EntryEnvelope, FactsCell
from sessionfold.projections.jsjson import js_json_length, js_length, js_number_text, js_trim
from sessionfold.projections.pruning.message_facts import call_path, is_passthrough

#: Stop reasons of assistant messages pi-ai drops before sending (their usage and calls count
#: for nothing the model sees).
DROPPED_STOPS = frozenset({"error", "aborted"})
#: `custom_type` of a custom message without a `customType` field.
NO_CUSTOM_TYPE: Any = msgspec.UNSET


class CallFact(msgspec.Struct, frozen=True, gc=False):
    """One toolCall block of an assistant: id and name as written, its file argument (`input ??
    arguments`), its arguments (`input ?? args ?? arguments ?? {}`) and their JSON length, and
    its `arguments` field as written (the ledger reads commands and files from it)."""

    id: Any
    name: Any
    path: str | None
    args: dict[str, Any]
    args_chars: int
    arguments: Any


class EntryFacts(msgspec.Struct, frozen=True, gc=False):
    """An entry's facts (see the module docstring); None/0/"" where a fact does not apply.
    `id` is the entry's id when a string, `parent` its parentId and `kind` its type as written."""

    id: str | None
    parent: Any
    kind: Any
    message: dict[str, Any] | None = None
    role: Any = None
    chars: int = 0
    ts: int | float | None = None
    ets: str | None = None
    text_only: bool = False
    stop: Any = None
    think: int = 0
    calls: tuple[CallFact, ...] = ()
    text: str = ""
    raw: int = 0
    stamp: int = 0
    usage: int | None = None
    call_id: str | None = None
    tool: Any = None
    occ: str | None = None
    is_error: bool = False
    passthrough: bool = False
    custom_type: Any = NO_CUSTOM_TYPE


def facts_of(envelope: EntryEnvelope) -> EntryFacts:
    """The facts of an entry envelope, derived on first use and kept on its payload."""
    payload = envelope.payload
    cell: FactsCell = payload.__pydantic_private__["_facts"]  # type: ignore[index]
    entry = payload.entry
    if cell.entry is not entry:  # never derived, or a copy's cell: derive from this entry
        cell.facts = entry_facts(entry)
        cell.entry = entry
    facts: EntryFacts = cell.facts
    return facts


def entry_facts(entry: dict[str, Any]) -> EntryFacts:
    """Read one v3-shaped entry's facts (the only reader of an entry's message for the folds)."""
    entry_id = entry.get("id")
    facts_id = entry_id if isinstance(entry_id, str) else None
    parent = entry.get("parentId")
    kind = entry.get("type")
    message = message_of(entry)
    if message is None:
        return EntryFacts(facts_id, parent, kind)
    role = message.get("role")
    timestamp = message.get("timestamp")
    chars = js_json_length(message)
    ts = _number_or_none(timestamp)
    found = entry.get("timestamp")
    ets = found if isinstance(found, str) else None
    if role == "assistant":
        calls, think = _blocks(message.get("content"))
        return EntryFacts(
            facts_id,
            parent,
            kind,
            message,
            role,
            chars,
            ts,
            ets,
            text_only=not calls,
            stop=message.get("stopReason"),
            think=think,
            calls=calls,
            text=assistant_text(message) if calls else "",
            stamp=_batch_timestamp(ets, ts) if calls else 0,
            usage=_usage_tokens(message),
        )
    if role == "toolResult":
        call_id = message.get("toolCallId")
        text = result_text(message)
        return EntryFacts(
            facts_id,
            parent,
            kind,
            message,
            role,
            chars,
            ts,
            ets,
            call_id=call_id if isinstance(call_id, str) else None,
            tool=message.get("toolName"),
            occ=occurrence_key(call_id, timestamp),
            is_error=message.get("isError") is True,
            text=text,
            raw=js_length(text),
        )
    if role == "user":
        passthrough = is_passthrough(message)
        return EntryFacts(
            facts_id, parent, kind, message, role, chars, ts, ets, passthrough=passthrough
        )
    if role == "custom" and "customType" in message:
        custom_type = message["customType"]
        return EntryFacts(
            facts_id, parent, kind, message, role, chars, ts, ets, custom_type=custom_type
        )
    return EntryFacts(facts_id, parent, kind, message, role, chars, ts, ets)


def _blocks(content: Any) -> tuple[tuple[CallFact, ...], int]:
    """An assistant's toolCall blocks as facts, and the JSON length of its thinking blocks."""
    if not isinstance(content, list):
        return (), 0
    calls: list[CallFact] = []
    think = 0
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "thinking":
            think += js_json_length(block)
        elif kind == "toolCall":
            args = call_arguments(block)
            calls.append(
                CallFact(
                    block.get("id"),
                    block.get("name"),
                    call_path(block),
                    args,
                    js_json_length(args) if args else 2,
                    block.get("arguments"),
                )
            )
    return tuple(calls), think


def _batch_timestamp(ets: str | None, ts: int | float | None) -> int:
    """The entry's ISO timestamp in ms, else the message's, else 0 (a fold has no clock)."""
    ms = iso_to_ms(ets)
    if ms is None and ts is not None:
        ms = int(ts)
    return ms if ms is not None else 0


def result_text(message: dict[str, Any]) -> str:
    """A tool result's text: its text blocks joined by a newline; other blocks ignored (H3)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    # A plain loop, not a generator in the join: one text block (most results) is one pass.
    texts = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            text = block.get("text")
            if isinstance(text, str):
                texts.append(text)
    return "\n".join(texts)


def assistant_text(message: dict[str, Any]) -> str:
    """An assistant's text blocks joined by a newline, trimmed (reference §3.1)."""
    return js_trim(result_text(message))


def call_arguments(block: dict[str, Any]) -> dict[str, Any]:
    """A tool call's arguments: `input ?? args ?? arguments ?? {}` (H2)."""
    # Spelled out, not a loop over the three names: a call per toolCall block, one frame.
    value = block.get("input")
    if value is None:
        value = block.get("args")
        if value is None:
            value = block.get("arguments")
            if value is None:
                return {}
    return value if isinstance(value, dict) else {}


def _usage_tokens(message: dict[str, Any]) -> int | None:
    """The context tokens an assistant's usage reports (pi's turn end), None when none: no
    usage, an errored or aborted turn, or a total that is not above zero."""
    usage = message.get("usage")
    if not isinstance(usage, dict) or message.get("stopReason") in DROPPED_STOPS:
        return None
    total = usage.get("totalTokens")
    if not isinstance(total, int) or total <= 0:
        # The four parts spelled out (`_USAGE_PARTS`' order): no loop per assistant.
        total = 0
        part = usage.get("input")
        if isinstance(part, int):
            total += part
        part = usage.get("output")
        if isinstance(part, int):
            total += part
        part = usage.get("cacheRead")
        if isinstance(part, int):
            total += part
        part = usage.get("cacheWrite")
        if isinstance(part, int):
            total += part
    return total if total > 0 else None


_USAGE_PARTS = ("input", "output", "cacheRead", "cacheWrite")


def _number_or_none(value: Any) -> int | float | None:
    return value if isinstance(value, _NUMBER) and not isinstance(value, bool) else None


#: `int | float` built once: the union in an isinstance call is built at every call.
_NUMBER = (int, float)


# --- entry -> message ------------------------------------------------------------------------


def message_of(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The message an entry puts on the branch (metrics projection, §9.1), or None."""
    kind = entry.get("type")
    if kind == "message":
        message = entry.get("message")
        return message if isinstance(message, dict) else None
    if kind != "custom_message":
        return None
    # pi's createCustomMessage: undefined fields vanish from JSON.stringify, so leave them out.
    custom: dict[str, Any] = {"role": "custom"}
    for field in ("customType", "content", "display", "details"):
        if field in entry:
            custom[field] = entry[field]
    custom["timestamp"] = iso_to_ms(entry.get("timestamp"))
    return custom


#: The Unix epoch, built once: an aware datetime built per call cost as much as the parse.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso_to_ms(value: Any) -> int | None:
    """`new Date(value).getTime()` for an ISO timestamp; None where JavaScript gives NaN."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # ISO date-times without offset: read as UTC here
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def occurrence_key(call_id: Any, timestamp: Any) -> str:
    """`id@timestamp` (§1.1), or the bare id when the timestamp is not a number."""
    bare = _js_string(call_id)
    if isinstance(timestamp, _NUMBER) and not isinstance(timestamp, bool):
        return f"{bare}@{js_number_text(timestamp)}"
    return bare


def _js_string(value: Any) -> str:
    # What a template literal makes of the value; ids are strings in every real file.
    if isinstance(value, str):
        return value
    if value is None:
        return "undefined"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return js_number_text(value)
    return "[object Object]"
