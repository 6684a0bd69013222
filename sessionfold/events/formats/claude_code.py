"""Claude Code transcripts (`~/.claude/projects/<project>/<session>.jsonl`) as pi v3 entries.

What maps to what (docs/formats.md says it for users):

- The first line naming a `sessionId` gives the pi session header (`format: "claude-code"`); a
  subagent transcript (`<session>/subagents/agent-<id>.jsonl`, lines with `isSidechain` and an
  `agentId`) is a session of its own, `<sessionId>.agent-<agentId>`, whose header names its
  parent in `parentSession`.
- The assistant lines of one API response (several lines sharing `message.id`, one content
  block each) are one assistant message, id the last line's `uuid`: `text`, `thinking`
  (`redacted_thinking` as redacted thinking) and `tool_use` (as `toolCall`) blocks, `usage`
  with its cache tokens, `stopReason` "toolUse" when it calls tools.
- The `tool_result` blocks of the user lines answering those calls are `toolResult` messages
  (toolName from the call, `is_error` as `isError`), one per block, right after the response.
- `attachment` lines with `rendered` text (CLI 2.1) are what the model is sent beside the
  conversation: hidden `custom_message` entries (`customType` "x-claude-code.attachment").
- A `compact_boundary` system line and the `isCompactSummary` user line after it are one pi
  `compaction` (`summary`, `tokensBefore` from `compactMetadata.preTokens`, parent the
  boundary's `logicalParentUuid`): Claude Code keeps nothing but the summary.
- User lines are user messages; `isMeta` lines and command lines (`<command-name>`,
  `<local-command-stdout>`, ...) are what the agent injected: `custom_message` entries
  (`customType` "x-claude-code.meta", not displayed), never the user's words.
- Every other line (progress, system, attachment, file-history-snapshot, queue-operation,
  summary, inline sidechains of old CLIs, types not known yet) is an `x-claude-code.<type>`
  entry holding the line as `raw`: kept, and ignored by the folds.

Grouping: the translator holds the lines from the last *anchor* (a user turn, a response's first
line, a compaction's boundary) until the next one, since a response's lines, the results of its
calls and the lines written between them are only complete then. Lines off the parentUuid chain
(no uuid, or an old CLI's inline sidechain) are emitted first in their group, chained from the
anchor's parent, so the session's leaf stays on the conversation. A group is one chain: the
response's message, the results of its calls (which the file hangs each under its own call's
line, a fork), then the rest; a later line that names a line of the group just closed hangs off
its last entry. State: that group, the last group's line uuids, and the merged ids of recent
responses (bounded); a reader resumed at the group's first line feeds a fresh translator the
lines before it (base.py), so it reads on the same.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sessionfold.events.formats.base import MappingError

FORMAT = "claude-code"
PREFIX = "x-claude-code."
META_TYPE = PREFIX + "meta"
#: customType of an attachment line whose rendered text the model is sent.
ATTACHMENT_TYPE = PREFIX + "attachment"
#: How many response lines `_merged` remembers (a kept segment names a recent response).
MERGED_KEPT = 512

#: Claude Code's line types (agent-schemas up to CLI 2.1.144, and what 2.1.328 writes: see
#: docs/formats.md); others are kept as unknown.
LINE_TYPES = frozenset(
    {
        "api-request-shape",
        "api-request-blob",
        "api-request",
        "tools-used",
        "atis-latch",
        "cost-state",
        "mode",
        "user",
        "assistant",
        "system",
        "summary",
        "file-history-snapshot",
        "queue-operation",
        "progress",
        "pr-link",
        "agent-name",
        "custom-title",
        "last-prompt",
        "attachment",
        "permission-mode",
        "ai-title",
        "agent-setting",
        "bridge-session",
        "worktree-state",
    }
)
_NAMING_FIELDS = ("uuid", "sessionId", "leafUuid", "messageId")
#: Text the CLI writes into user lines itself: slash commands and their local output.
_INJECTED = re.compile(r"\A\s*<(command-name|command-message|local-command-[a-z]+)>")
_STOP_REASONS = {"tool_use": "toolUse", "max_tokens": "length", "end_turn": "stop"}


def is_claude_code(value: dict[str, Any]) -> bool:
    """Whether a file's first JSON object is a Claude Code transcript line."""
    kind = value.get("type")
    if not isinstance(kind, str) or "payload" in value:
        return False
    named = any(isinstance(value.get(name), str) for name in _NAMING_FIELDS)
    return named and (kind in LINE_TYPES or isinstance(value.get("uuid"), str))


def iso_ms(text: Any) -> int | None:
    """Unix milliseconds of an ISO timestamp, or None when it is not one (integer arithmetic)."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is not None:
        offset = moment.utcoffset()
        moment = moment.replace(tzinfo=None) - (offset if offset is not None else moment - moment)
    return calendar.timegm(moment.timetuple()) * 1000 + moment.microsecond // 1000


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def session_of(value: dict[str, Any]) -> tuple[str, str | None] | None:
    """(session id, parent session id) a line belongs to; None when it names no session."""
    session = _str(value.get("sessionId"))
    if not session:  # absent, not a string, or empty: no session is named
        return None
    agent = _str(value.get("agentId"))
    if value.get("isSidechain") is True and agent:
        return f"{session}.agent-{agent}", session
    return session, None


def _detached(value: dict[str, Any]) -> bool:
    """A line off the parentUuid chain: no uuid, or an old CLI's inline sidechain line."""
    if not isinstance(value.get("uuid"), str):
        return True
    return value.get("isSidechain") is True and not _str(value.get("agentId"))


def _kind(value: dict[str, Any]) -> str:
    """What a chain line is: assistant, results, summary, boundary, user or other."""
    kind = value.get("type")
    message = value.get("message")
    if kind == "assistant":
        return "assistant"
    if kind == "system" and value.get("subtype") == "compact_boundary":
        return "boundary"
    if kind != "user":
        return "other"
    if value.get("isCompactSummary") is True:
        return "summary"
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    ):
        return "results"
    return "user"


def _result_ids(value: dict[str, Any]) -> list[str]:
    message = value.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return []
    return [
        b["tool_use_id"]
        for b in content
        if isinstance(b, dict)
        and b.get("type") == "tool_result"
        and isinstance(b.get("tool_use_id"), str)
    ]


def _response_id(value: dict[str, Any]) -> str | None:
    message = value.get("message")
    found = message.get("id") if isinstance(message, dict) else None
    return found if isinstance(found, str) else _str(value.get("uuid"))


@dataclass
class _Group:
    """The lines from the last anchor on, and what deciding membership needs."""

    since: int
    lines: list[tuple[dict[str, Any], int]] = field(default_factory=list)
    anchor: str | None = None  # the kind of its anchor line, None before one came
    response: str | None = None  # an assistant anchor's message.id
    calls: set[str] = field(default_factory=set)  # tool_use ids its response made
    summarized: bool = False  # a boundary's summary line came

    def takes(self, value: dict[str, Any]) -> bool:
        """Whether a line joins this group rather than starting the next one."""
        if _detached(value):
            return True
        kind = _kind(value)
        if self.anchor is None or kind == "other":
            return True
        if kind == "assistant":
            return self.anchor == "assistant" and _response_id(value) == self.response
        if kind == "results":
            ids = _result_ids(value)
            return bool(ids) and all(i in self.calls for i in ids)
        if kind == "summary":
            return self.anchor == "boundary" and not self.summarized
        return False

    def add(self, value: dict[str, Any], line: int) -> None:
        """Join a line, noting what later lines' membership depends on."""
        self.lines.append((value, line))
        if _detached(value):
            return
        kind = _kind(value)
        if self.anchor is None and kind != "other":
            self.anchor = kind
            self.response = _response_id(value) if kind == "assistant" else None
        if kind == "assistant":
            message = value.get("message")
            content = message.get("content") if isinstance(message, dict) else None
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    call = block.get("id")
                    if isinstance(call, str):
                        self.calls.add(call)
        elif kind == "summary":
            self.summarized = True


class ClaudeCodeTranslator:
    """Maps one Claude Code transcript, line by line, onto pi v3 entries (base.Translator)."""

    format = FORMAT

    def __init__(self) -> None:
        self._header = False
        self._group: _Group | None = None
        # The last closed group's line uuids -> the id of its last entry: a later line hangs
        # off whichever result was written last, and the group is one chain now.
        self._tails: dict[str, str] = {}
        # Lines of recent responses -> their merged message's id (a compaction's kept segment
        # names a response by one of its lines); bounded, oldest dropped first.
        self._merged: dict[str, str] = {}

    @property
    def open_since(self) -> int | None:
        """The first line of the group held, or None."""
        return None if self._group is None else self._group.since

    def feed(self, value: dict[str, Any], line: int) -> list[dict[str, Any]]:
        """The entries this line completes (the header first, once); see the module docstring."""
        kind = value.get("type")
        if not isinstance(kind, str):
            raise MappingError("type is not a string")
        _check(value)
        out: list[dict[str, Any]] = []
        if not self._header:
            session = session_of(value)
            if session is not None:
                self._header = True
                out.append(_header(value, *session))
        group = self._group
        if group is not None and not group.takes(value):
            out += self._close(group)
            group = None
        if group is None:
            group = self._group = _Group(since=line)
        group.add(value, line)
        return out

    def close(self) -> list[dict[str, Any]]:
        """The entries of the group still held (end of the file)."""
        group, self._group = self._group, None
        return [] if group is None else self._close(group)

    def _close(self, group: _Group) -> list[dict[str, Any]]:
        """A group's entries, remembering where later lines that name its lines now hang."""
        entries = _entries(group, self._tails, self._merged)
        if entries:
            last = entries[-1]["id"]
            self._tails = {v["uuid"]: last for v, _n in group.lines if _on_chain(v)}
        merged = _merged_id(group)
        if merged is not None:
            for value, _line in group.lines:
                if _on_chain(value) and _kind(value) == "assistant":
                    self._merged[value["uuid"]] = merged
            while len(self._merged) > MERGED_KEPT:
                del self._merged[next(iter(self._merged))]
        return entries


def _check(value: dict[str, Any]) -> None:
    """Refuse a message line whose shape cannot be mapped (by field name, never its text)."""
    kind = value.get("type")
    if kind not in ("user", "assistant") or _detached(value):
        return
    uuid = _str(value.get("uuid"))
    parent = value.get("parentUuid")
    named = {"id": uuid, "parent_id": parent if isinstance(parent, str) else None}
    if parent is not None and not isinstance(parent, str):
        raise MappingError("parentUuid is not a string", **named)
    message = value.get("message")
    if not isinstance(message, dict):
        raise MappingError(f"{kind} line without a message object", **named)
    content = message.get("content")
    if not isinstance(content, (str, list)):
        raise MappingError(f"{kind} message.content is neither a string nor an array", **named)


def _header(value: dict[str, Any], session: str, parent: str | None) -> dict[str, Any]:
    header: dict[str, Any] = {"type": "session", "version": 3, "id": session}
    if isinstance(value.get("timestamp"), str):
        header["timestamp"] = value["timestamp"]
    if isinstance(value.get("cwd"), str):
        header["cwd"] = value["cwd"]
    header["format"] = FORMAT
    if parent is not None:
        header["parentSession"] = parent
    return header


def _entries(group: _Group, tails: dict[str, str], merged: dict[str, str]) -> list[dict[str, Any]]:
    """A closed group's entries as one chain: off-chain lines first, then the chain lines.

    The response's lines make one assistant message where its first line stood, and the
    results of its calls follow it at once, in the order they were written (as Claude Code
    sends them), before any other line of the group: a result hangs under its own call's line
    in the file, a fork whose other branches the path from the leaf would skip. A boundary and
    the summary line after it make one compaction.
    """
    detached = [(v, n) for v, n in group.lines if _detached(v)]
    chain = [v for v, _n in group.lines if not _detached(v)]
    out: list[dict[str, Any]] = []
    parent = _parent(chain[0], tails) if chain else None
    for value, line in detached:
        entry = _unknown(value, _str(value.get("uuid")) or f"line-{line}", parent)
        out.append(entry)
        parent = entry["id"]
    chunks = [v for v in chain if _kind(v) == "assistant"]
    head: list[dict[str, Any]] = []  # up to the response's message
    results: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for position, value in enumerate(chain):
        kind = _kind(value)
        if kind == "assistant":
            if value is chunks[0]:
                head = [*rest, _assistant(chunks)]
                rest = []
            continue
        if kind == "summary" and position > 0 and _kind(chain[position - 1]) == "boundary":
            continue  # taken with its boundary
        if kind == "boundary":
            following = chain[position + 1] if position + 1 < len(chain) else None
            summary = following if following is not None and _kind(following) == "summary" else None
            rest.append(_compaction(value, summary, merged))
            continue
        for entry in _line_entries(value, kind, group):
            is_result = entry.get("message", {}).get("role") == "toolResult"
            (results if is_result and head else rest).append(entry)
    for entry in [*head, *results, *rest]:
        entry["parentId"] = parent
        parent = entry["id"]
        out.append(entry)
    return out


def _merged_id(group: _Group) -> str | None:
    """The id of the message a group's response lines make (its last line's uuid)."""
    chunks = [v for v, _n in group.lines if _on_chain(v) and _kind(v) == "assistant"]
    return chunks[-1]["uuid"] if chunks else None


def _on_chain(value: dict[str, Any]) -> bool:
    return not _detached(value)


def _parent(value: dict[str, Any], alias: dict[str, str]) -> str | None:
    parent = value.get("parentUuid")
    if value.get("type") == "system" and value.get("subtype") == "compact_boundary":
        parent = value.get("logicalParentUuid") or parent
    return alias.get(parent, parent) if isinstance(parent, str) else None


def _base(kind: str, entry_id: str, parent: str | None, value: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": kind, "id": entry_id, "parentId": parent}
    if isinstance(value.get("timestamp"), str):
        entry["timestamp"] = value["timestamp"]
    return entry


def _unknown(value: dict[str, Any], entry_id: str, parent: str | None) -> dict[str, Any]:
    kind = value["type"]
    sidechain = isinstance(value.get("uuid"), str) and _detached(value)
    entry = _base(PREFIX + ("sidechain" if sidechain else kind), entry_id, parent, value)
    entry["raw"] = value
    return entry


def _assistant(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """One assistant message from the lines of one API response, id the last line's uuid."""
    content: list[Any] = []
    model = usage = stop = None
    error = False
    for chunk in chunks:
        message = chunk["message"]
        blocks = message["content"]
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        content += [_assistant_block(b) for b in blocks]
        model = _str(message.get("model")) or model
        if isinstance(message.get("usage"), dict):
            usage = message["usage"]
        stop = _str(message.get("stop_reason")) or stop
        error = error or chunk.get("isApiErrorMessage") is True
    calls = any(isinstance(b, dict) and b.get("type") == "toolCall" for b in content)
    mapped: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "api": "anthropic-messages",
        "provider": "anthropic",
        "model": model,
    }
    if usage is not None:
        mapped["usage"] = _usage(usage)
    mapped["stopReason"] = (
        "error" if error else "toolUse" if calls else _STOP_REASONS.get(stop or "", "stop")
    )
    ms = iso_ms(chunks[0].get("timestamp"))
    if ms is not None:
        mapped["timestamp"] = ms
    entry = _base("message", chunks[-1]["uuid"], None, chunks[0])
    entry["message"] = mapped
    return entry


def _assistant_block(block: Any) -> Any:
    if not isinstance(block, dict):
        return block
    kind = block.get("type")
    if kind == "tool_use":
        return {
            "type": "toolCall",
            "id": block.get("id"),
            "name": block.get("name"),
            "arguments": block.get("input") if isinstance(block.get("input"), dict) else {},
        }
    if kind == "thinking":
        mapped: dict[str, Any] = {"type": "thinking", "thinking": block.get("thinking", "")}
        if isinstance(block.get("signature"), str):
            mapped["thinkingSignature"] = block["signature"]
        return mapped
    if kind == "redacted_thinking":
        return {
            "type": "thinking",
            "thinking": "",
            "thinkingSignature": block.get("data", ""),
            "redacted": True,
        }
    return block  # text is pi's shape already; other blocks are kept as they are


def _count(usage: dict[str, Any], name: str) -> int:
    value = usage.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    counts = {
        "input": _count(usage, "input_tokens"),
        "output": _count(usage, "output_tokens"),
        "cacheRead": _count(usage, "cache_read_input_tokens"),
        "cacheWrite": _count(usage, "cache_creation_input_tokens"),
    }
    zero = {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}
    return {**counts, "totalTokens": sum(counts.values()), "cost": zero}


def _compaction(
    boundary: dict[str, Any], summary: dict[str, Any] | None, merged: dict[str, str]
) -> dict[str, Any]:
    """A boundary and its summary line as one compaction: what it kept is the segment its
    `compactMetadata.preservedSegment` names from its head on (CLI 2.1), else nothing."""
    meta = boundary.get("compactMetadata")
    meta = meta if isinstance(meta, dict) else {}
    tokens = meta.get("preTokens")
    entry_id = summary["uuid"] if summary is not None else boundary["uuid"]
    entry = _base("compaction", entry_id, None, boundary)
    text = _text(summary["message"]["content"]) if summary is not None else ""
    entry["summary"] = text
    segment = meta.get("preservedSegment")
    kept = segment.get("headUuid") if isinstance(segment, dict) else None
    # the head names a line; a response's lines are one message, whose id is its last line's
    entry["firstKeptEntryId"] = merged.get(kept, kept) if isinstance(kept, str) else None
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        entry["tokensBefore"] = tokens
    return entry


def _rendered(value: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The text blocks of an attachment line the model is sent (`rendered[].content`), or None
    for a line the model never sees (no `rendered`: state the CLI keeps for itself)."""
    if value.get("type") != "attachment":
        return None
    rendered = value.get("rendered")
    if not isinstance(rendered, list):
        return None
    texts = [
        {"type": "text", "text": part["content"]}
        for part in rendered
        if isinstance(part, dict) and isinstance(part.get("content"), str)
    ]
    return texts or None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        b["text"]
        for b in content
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
    )


def _user_blocks(blocks: list[Any]) -> list[Any]:
    out: list[Any] = []
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "image":
            source = block.get("source")
            source = source if isinstance(source, dict) else {}
            out.append(
                {"type": "image", "data": source.get("data"), "mimeType": source.get("media_type")}
            )
        else:
            out.append(block)
    return out


def _line_entries(value: dict[str, Any], kind: str, group: _Group) -> list[dict[str, Any]]:
    """The entries of one user or other chain line; the last one takes the line's uuid.

    Their `parentId`s are set by the caller, which chains the group's entries."""
    uuid: str = value["uuid"]
    parent = None
    if kind == "other":
        rendered = _rendered(value)
        if rendered is not None:  # an attachment the model is sent (CLI 2.1's `rendered`)
            entry = _base("custom_message", uuid, None, value)
            entry.update(customType=ATTACHMENT_TYPE, content=rendered, display=False)
            return [entry]
        return [_unknown(value, uuid, parent)]
    message = value["message"]
    content = message["content"]
    ms = iso_ms(value.get("timestamp"))
    if kind == "summary":  # a summary without its boundary: a compaction all the same
        return [_compaction(value, value, {})]
    if kind == "results":
        names = _call_names(group)
        pieces: list[dict[str, Any]] = []
        rest: list[Any] = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                pieces.append(_tool_result(block, names, ms))
            else:
                rest.append(block)
        if rest:
            pieces.append(_user_message(_user_blocks(rest), ms))
    elif value.get("isMeta") is True or _INJECTED.match(_text(content)):
        pieces = [{"customType": META_TYPE, "content": content, "display": False}]
    else:
        blocks = content if isinstance(content, str) else _user_blocks(content)
        pieces = [_user_message(blocks, ms)]
    entries = []
    for index, piece in enumerate(pieces):
        last = index == len(pieces) - 1
        entry_id = uuid if last else f"{uuid}.{index}"
        if "role" in piece:
            entry = _base("message", entry_id, parent, value)
            entry["message"] = piece
        else:
            entry = _base("custom_message", entry_id, parent, value)
            entry.update(piece)
        entries.append(entry)
        parent = entry_id
    return entries


def _user_message(content: Any, ms: int | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "user", "content": content}
    if ms is not None:
        message["timestamp"] = ms
    return message


def _call_names(group: _Group) -> dict[str, str]:
    names: dict[str, str] = {}
    for value, _line in group.lines:
        if _kind(value) != "assistant" or _detached(value):
            continue
        for block in value["message"]["content"]:
            if (
                isinstance(block, dict)
                and block.get("type") == "tool_use"
                and isinstance(block.get("id"), str)
                and isinstance(block.get("name"), str)
            ):
                names[block["id"]] = block["name"]
    return names


def _tool_result(block: dict[str, Any], names: dict[str, str], ms: int | None) -> dict[str, Any]:
    call = block.get("tool_use_id")
    body = block.get("content")
    if isinstance(body, str):
        content: list[Any] = [{"type": "text", "text": body}]
    elif isinstance(body, list):
        content = _user_blocks(body)
    else:
        content = []
    message: dict[str, Any] = {
        "role": "toolResult",
        "toolCallId": call,
        "toolName": names.get(call) if isinstance(call, str) else None,
        "content": content,
        "isError": block.get("is_error") is True,
    }
    if ms is not None:
        message["timestamp"] = ms
    return message
