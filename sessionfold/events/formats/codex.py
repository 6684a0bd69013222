"""Codex CLI rollouts (`~/.codex/sessions/.../rollout-*.jsonl`) mapped onto pi v3 entries.

A rollout line is `{"timestamp", "type", "payload"}` (reference/live-loop-and-formats.md §2.2).
`session_meta` becomes the pi header; the `response_item`s of one model response (reasoning,
assistant text, tool calls) become ONE pi assistant message, held open until something that is
not part of the response arrives (a tool output, a user turn, a `token_count`, which also gives
the message its `usage`); tool outputs become `toolResult` messages paired by `call_id`;
`turn_context` gives `model_change` (and `thinking_level_change` from its effort); `compacted`
becomes a pi `compaction` whose kept context is its `replacement_history`. Injected turns (the
`developer` role, AGENTS.md instructions, `<environment_context>`) become hidden
`custom_message`s: the model sees them, the ledger does not read them as the user's words.
Everything else is kept as an entry of type `x-codex.<kind>`.

Encrypted reasoning and remote compaction payloads are counted by size only, never kept.

The older generations are read too: the direct one (a header object `{id, timestamp}` with no
`type`, then bare response items, no `payload` wrapper) and its `record_type: "state"` lines
(kept as `x-codex.state` entries).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from sessionfold.events.exit_codes import sandbox_exit
from sessionfold.events.formats.base import MappingError
from sessionfold.events.lines import MAX_DEPTH, too_deep

FORMAT = "codex"
UNKNOWN_PREFIX = "x-codex."
#: customType of the hidden custom messages injected turns become.
DEVELOPER = "codex.developer"
INSTRUCTIONS = "codex.instructions"
ENVIRONMENT = "codex.environment_context"
KEPT = "codex.replacement_history"

# Items of one model response, grouped into one pi assistant message.
_ASSISTANT_ITEMS = {"reasoning", "function_call", "custom_tool_call", "local_shell_call"}
_OUTPUT_ITEMS = {"function_call_output", "custom_tool_call_output"}
# The line kinds of the wrapped generation; a direct-generation line has a bare item instead.
_WRAPPED = {
    "session_meta",
    "response_item",
    "compacted",
    "turn_context",
    "event_msg",
    "inter_agent_communication",
    "inter_agent_communication_metadata",
    "token_usage_record",
    "world_state",
    "retained_context",
    "security_risk_score",
    "realtime_item",
}
# Shell output shapes Codex writes: a freeform head line, or unified exec's exit line.
_EXIT_HEAD = re.compile(r"\AExit code: (-?\d+)\b")
_PROCESS_EXIT = re.compile(r"^Process exited with code (-?\d+)\b", re.M)
#: The deepest a call's parsed `arguments` may nest: the entry holds them four levels down
#: (entry, message, content, block), and every entry stays within the reader's MAX_DEPTH.
ARGUMENTS_DEPTH = MAX_DEPTH - 8
# Codex's effort names onto pi's thinking levels.
_EFFORT = {
    "none": "off",
    "minimal": "minimal",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "xhigh",
}


#: A tool output not yet emitted: its line, timestamp and item.
_Pending = tuple[int, str | None, dict[str, Any]]


@dataclass(slots=True)
class _Group:
    """One model response still open: its blocks, usage, and what came in between."""

    line: int
    timestamp: str | None
    content: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    # entries of lines read while the group was open (event_msgs, unknown items), emitted after it
    after: list[tuple[int, str | None, dict[str, Any]]] = field(default_factory=list)
    # results of its own calls read while it waits for its usage, emitted right after it
    results: list[_Pending] = field(default_factory=list)


class CodexTranslator:
    """Codex rollout lines in, pi v3 entry dicts out (see the module docstring).

    State: the session id, the last entry id (the next entry's parent), the model and effort in
    force, the names of calls waiting for their outputs, the last context size, and the open
    group.
    """

    format = FORMAT

    def __init__(self) -> None:
        self._session: str | None = None
        self._provider: str | None = None
        self._last: str | None = None
        self._model: str | None = None
        self._effort: str | None = None
        self._names: dict[str, str] = {}
        self._tokens: int | None = None
        self._timestamp: str | None = None
        self._group: _Group | None = None
        # Whether a token_count precedes the response it measures (CLI 0.40's order), decided by
        # the first one that carries usage: before any response was opened, it does.
        self._usage_first: bool | None = None
        self._responses = 0
        self._usage_next: dict[str, Any] | None = None  # 0.40: the next response's usage
        # Outputs read before their call (paired once the call comes; at most the next response)
        self._early: dict[str, _Pending] = {}

    @property
    def open_since(self) -> int | None:
        """The line number of the first line of the open group, or None."""
        return self._group.line if self._group is not None else None

    def feed(self, value: dict[str, Any], line: int) -> list[dict[str, Any]]:
        """The pi entries this rollout line completes (the header first, once)."""
        if not isinstance(value, dict):
            raise MappingError("codex: line is not a JSON object")
        kind = value.get("type")
        if "record_type" in value:
            if self._session is None:
                raise MappingError("codex: record_type line before the session header")
            return self._unknown(line, value.get("timestamp"), "state", value)
        if self._session is None:
            return self._header(value, kind, line)
        try:
            return self._line(value, kind, line)
        except MappingError as refused:
            # The reader's placeholder takes the line's place in the chain, as a pi entry's would.
            place = self._id(line, 0)
            parent, self._last = self._last, place
            raise MappingError(str(refused), id=place, parent_id=parent) from None

    def close(self) -> list[dict[str, Any]]:
        """The entries of the response still open at the end of the file."""
        return [*self._flush(), *self._unanswered()]

    # --- lines -------------------------------------------------------------------------------

    def _line(self, value: dict[str, Any], kind: Any, line: int) -> list[dict[str, Any]]:
        timestamp = value.get("timestamp")
        if isinstance(timestamp, str):
            self._timestamp = timestamp
        if isinstance(kind, str) and kind in _WRAPPED and "payload" in value:
            payload = value["payload"]
            if not isinstance(payload, dict):
                raise MappingError(f"codex: {kind}.payload is not an object")
            return self._wrapped(kind, payload, line, self._timestamp)
        if isinstance(kind, str) and "payload" not in value:
            # the direct generation: a bare response item
            return self._item(value, line, self._timestamp)
        if not isinstance(kind, str):
            raise MappingError("codex: line has no string type")
        return self._unknown(line, self._timestamp, kind, value.get("payload"))

    def _header(self, value: dict[str, Any], kind: Any, line: int) -> list[dict[str, Any]]:
        if kind == "session_meta":
            meta = value.get("payload")
            if not isinstance(meta, dict):
                raise MappingError("codex: session_meta.payload is not an object")
        elif kind is None and "id" in value:
            meta = value  # the direct generation's header
        else:
            raise MappingError("codex: no session_meta before this line")
        session = meta.get("id")
        if not isinstance(session, str) or not session:
            raise MappingError("codex: session_meta.id is not a string")
        self._session = session
        timestamp = meta.get("timestamp", value.get("timestamp"))
        self._timestamp = timestamp if isinstance(timestamp, str) else None
        provider = meta.get("model_provider")
        self._provider = provider if isinstance(provider, str) else None
        header: dict[str, Any] = {
            "type": "session",
            "version": 3,
            "id": session,
            "timestamp": self._timestamp,
            "cwd": meta.get("cwd") if isinstance(meta.get("cwd"), str) else None,
            "format": FORMAT,
        }
        if self._provider is not None:
            header["provider"] = self._provider
        for key, name in (("cli_version", "cliVersion"), ("originator", "originator")):
            if isinstance(meta.get(key), str):
                header[name] = meta[key]
        source = meta.get("source")
        spawn = source.get("subagent") if isinstance(source, dict) else None
        spawn = spawn.get("thread_spawn") if isinstance(spawn, dict) else None
        if isinstance(spawn, dict) and isinstance(spawn.get("parent_thread_id"), str):
            header["parentThread"] = spawn["parent_thread_id"]
        if isinstance(meta.get("forked_from_id"), str):
            header["forkedFrom"] = meta["forked_from_id"]
        return [header]

    def _wrapped(
        self, kind: str, payload: dict[str, Any], line: int, timestamp: str | None
    ) -> list[dict[str, Any]]:
        if kind == "response_item":
            return self._item(payload, line, timestamp)
        if kind == "event_msg":
            return self._event(payload, line, timestamp)
        if kind == "turn_context":
            return self._turn_context(payload, line, timestamp)
        if kind == "compacted":
            return self._compacted(payload, line, timestamp)
        if kind == "token_usage_record":
            # CLI 0.169: written right after the response's items, with its usage
            usage = payload.get("usage")
            counted = _counts(usage) if isinstance(usage, dict) else None
            out = self._took(counted, record=True) if counted is not None else []
            return [*out, *self._unknown(line, timestamp, kind, payload)]
        # session_meta again (a resumed or forked rollout) and the newer kinds: kept as they are
        return self._unknown(line, timestamp, kind, payload)

    def _item(self, item: dict[str, Any], line: int, timestamp: str | None) -> list[dict[str, Any]]:
        kind = item.get("type")
        if not isinstance(kind, str):  # any JSON type may stand here; only a string names a kind
            raise MappingError("codex: response_item.type is not a string")
        if kind == "message":
            role = item.get("role")
            if role == "assistant":
                out = self._next_response()
                self._open(line, timestamp).content.extend(_text_blocks(item, "content"))
                return out
            if role not in ("user", "developer", "system"):
                raise MappingError("codex: message.role is not user, assistant or developer")
            return [*self._flush(), *self._turn(item, role, line, timestamp)]
        if kind in _ASSISTANT_ITEMS:
            out = self._next_response()
            self._open(line, timestamp).content.append(self._block(kind, item))
            return out
        if kind in _OUTPUT_ITEMS:
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise MappingError(f"codex: {kind}.call_id is not a string")
            return self._output(call_id, (line, timestamp, item))
        return self._unknown(line, timestamp, kind, item)

    def _next_response(self) -> list[dict[str, Any]]:
        """The open response, closed when its results came already: a model item now is the
        next response's (a CLI whose usage follows the outputs may have none for it)."""
        return self._flush() if self._group is not None and self._group.results else []

    def _output(self, call_id: str, output: _Pending) -> list[dict[str, Any]]:
        """A call's output: held with the open response that made the call (its usage may still
        come), held until its call comes when none made it yet, else the next entry."""
        group = self._group
        if group is not None and call_id in _call_ids(group.content):
            group.results.append(output)
            return []
        if call_id not in self._names:
            # written before its call (a Codex rollout can): paired when the call comes
            self._early[call_id] = output
            return []
        return [*self._flush(), self._result(*output)]

    def _event(
        self, event: dict[str, Any], line: int, timestamp: str | None
    ) -> list[dict[str, Any]]:
        kind = event.get("type")
        if not isinstance(kind, str):
            raise MappingError("codex: event_msg.type is not a string")
        if kind == "token_count":
            usage = _usage(event)
            if usage is not None:
                return [*self._took(usage), *self._unknown(line, timestamp, kind, event)]
        return self._unknown(line, timestamp, kind, event)

    def _took(self, usage: dict[str, Any], record: bool = False) -> list[dict[str, Any]]:
        """A request's usage: the open response's (it closes it), or, in a rollout whose counts
        precede their responses (CLI 0.40), the next response's."""
        self._tokens = usage["totalTokens"]
        if self._usage_first is None:
            self._usage_first = not record and self._responses == 0 and self._group is None
        if self._usage_first and not record:
            out = self._flush()
            self._usage_next = usage
            return out
        if self._group is not None:
            if self._group.usage is None:
                self._group.usage = usage
            return self._flush()
        return []  # a count repeated after its response (current CLIs): the response has it

    def _turn_context(
        self, context: dict[str, Any], line: int, timestamp: str | None
    ) -> list[dict[str, Any]]:
        out = self._flush()
        model = context.get("model")
        effort = context.get("effort")
        changed = False
        if isinstance(model, str) and model != self._model:
            self._model = model
            out.append(
                self._entry(
                    line,
                    timestamp,
                    {"type": "model_change", "provider": self._provider, "modelId": model},
                )
            )
            changed = True
        level = _EFFORT.get(effort) if isinstance(effort, str) else None
        if level is not None and level != self._effort:
            self._effort = level
            body = {"type": "thinking_level_change", "thinkingLevel": level}
            out.append(self._entry(line, timestamp, body, part=1))
            changed = True
        if not changed:
            out.extend(self._unknown(line, timestamp, "turn_context", context))
        return out

    def _compacted(
        self, payload: dict[str, Any], line: int, timestamp: str | None
    ) -> list[dict[str, Any]]:
        """The replacement history as hidden messages (the kept context), then the compaction."""
        out = self._flush()
        summary = payload.get("message")
        summary = summary if isinstance(summary, str) else ""
        history = payload.get("replacement_history")
        kept: list[dict[str, Any]] = []
        opaque = 0
        for item in history if isinstance(history, list) else []:
            if not isinstance(item, dict):
                continue
            encrypted = item.get("encrypted_content")
            if item.get("type") in ("compaction", "compaction_summary"):
                opaque += len(encrypted) if isinstance(encrypted, str) else 0
                continue
            blocks = _text_blocks(item, "content")
            if summary and blocks and _joined(blocks).endswith(summary):
                continue  # Codex's summary turn: the compaction's own summary stands for it
            kept.append(
                {
                    "type": "custom_message",
                    "customType": KEPT,
                    "content": blocks or [{"type": "text", "text": _scrubbed_json(item)}],
                    "display": False,
                    "details": {"role": item.get("role"), "item": item.get("type")},
                }
            )
        entries = [self._entry(line, timestamp, body, part) for part, body in enumerate(kept)]
        compaction: dict[str, Any] = {
            "type": "compaction",
            "summary": summary,
            "firstKeptEntryId": entries[0]["id"] if entries else None,
            "tokensBefore": self._tokens,
        }
        if opaque or not summary:
            # remote (server) compaction: the summary is encrypted, no reader can see its words
            compaction["details"] = {"codex": {"opaque": True, "encryptedChars": opaque}}
        return [*out, *entries, self._entry(line, timestamp, compaction, len(entries))]

    # --- pieces ------------------------------------------------------------------------------

    def _turn(
        self, item: dict[str, Any], role: Any, line: int, timestamp: str | None
    ) -> list[dict[str, Any]]:
        """A user turn, or an injected one (developer, AGENTS.md, environment) as hidden text."""
        blocks = _text_blocks(item, "content")
        text = _joined(blocks).lstrip()
        custom = None
        if role != "user":
            custom = DEVELOPER
        elif text.startswith("<environment_context>"):
            custom = ENVIRONMENT
        elif text.startswith("# AGENTS.md instructions") or text.startswith("<user_instructions>"):
            custom = INSTRUCTIONS
        if custom is not None:
            body: dict[str, Any] = {"type": "custom_message", "customType": custom}
            body.update(content=blocks, display=False)  # hidden, as pi writes extension text
            return [self._entry(line, timestamp, body)]
        message = {"role": "user", "content": blocks, "timestamp": _ms(timestamp)}
        return [self._entry(line, timestamp, {"type": "message", "message": _compact(message)})]

    def _block(self, kind: str, item: dict[str, Any]) -> dict[str, Any]:
        """One item of a model response as a pi content block."""
        if kind == "reasoning":
            parts = _list(item.get("summary")) or _list(item.get("content"))
            texts = [
                p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)
            ]
            block: dict[str, Any] = {"type": "thinking", "thinking": "\n\n".join(texts)}
            encrypted = item.get("encrypted_content")
            if isinstance(encrypted, str):
                block["encryptedChars"] = len(encrypted)  # its size only: never rendered
            return block
        call_id = item.get("call_id")
        if kind == "local_shell_call" and not call_id:
            call_id = item.get("id")  # older local shell calls carry only an item id
        if not isinstance(call_id, str) or not call_id:
            raise MappingError(f"codex: {kind}.call_id is not a string")
        if kind == "local_shell_call":
            name = "local_shell"
            action = item.get("action")
            action = action if isinstance(action, dict) else {}
            arguments = {k: v for k, v in action.items() if k != "type"}
        else:
            given = item.get("name")
            if not isinstance(given, str):
                raise MappingError(f"codex: {kind}.name is not a string")
            name = given
            if kind == "custom_tool_call":
                raw = item.get("input")
                arguments = {"input": raw if isinstance(raw, str) else _scrubbed_json(raw)}
            else:
                arguments = _arguments(item.get("arguments"))
        self._names[call_id] = name
        return {"type": "toolCall", "id": call_id, "name": name, "arguments": arguments}

    def _result(self, line: int, timestamp: str | None, item: dict[str, Any]) -> dict[str, Any]:
        call_id = str(item["call_id"])
        output = item.get("output")
        failed = False
        if isinstance(output, dict) and "content" in output:
            failed = output.get("success") is False  # the old {content, success} payload
            output = output.get("content")
        if isinstance(output, str):
            content = [{"type": "text", "text": output}]
        elif isinstance(output, list):
            content = _text_blocks({"content": output}, "content")
        else:
            content = [{"type": "text", "text": _scrubbed_json(output)}]
        message: dict[str, Any] = {
            "role": "toolResult",
            "toolCallId": call_id,
            "toolName": self._names.pop(call_id, None),
            "content": content,
        }
        code = _exit_code(output) if isinstance(output, str) else None
        if code is not None:
            message["details"] = {"exitCode": code}
        message["isError"] = failed or (code is not None and code != 0)
        message["timestamp"] = _ms(timestamp)
        return self._entry(line, timestamp, {"type": "message", "message": _compact(message)})

    def _open(self, line: int, timestamp: str | None) -> _Group:
        if self._group is None:
            self._group = _Group(line, timestamp)
            self._responses += 1
            if self._usage_next is not None:
                self._group.usage, self._usage_next = self._usage_next, None
        return self._group

    def _flush(self) -> list[dict[str, Any]]:
        """The open response as one assistant message, then what arrived while it was open."""
        group, self._group = self._group, None
        if group is None:
            return []
        calls = any(block.get("type") == "toolCall" for block in group.content)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": group.content,
            "api": "openai-responses",
            "provider": self._provider,
            "model": self._model,
            "usage": group.usage,
            "stopReason": "toolUse" if calls else "stop",
            "timestamp": _ms(group.timestamp),
        }
        out = [
            self._entry(
                group.line, group.timestamp, {"type": "message", "message": _compact(message)}
            )
        ]
        # its results at once (those written before their call first, in call order), so no
        # other message comes between a call and its result
        early = [self._early.pop(c) for c in _call_ids(group.content) if c in self._early]
        out.extend(self._result(*output) for output in [*early, *group.results])
        out.extend(self._entry(*pending) for pending in group.after)
        return out + self._unanswered(before=group.line)

    def _unanswered(self, before: int | None = None) -> list[dict[str, Any]]:
        """Outputs held for a call that did not come (in the response after them, or before
        the end): results with no call, which the render's orphan sweep leaves out."""
        stale = [c for c, (line, _t, _i) in self._early.items() if before is None or line < before]
        return [self._result(*self._early.pop(c)) for c in stale]

    def _unknown(self, line: int, timestamp: Any, kind: str, raw: Any) -> list[dict[str, Any]]:
        """A line this mapping does not read, kept (its encrypted parts by size only)."""
        body = {"type": UNKNOWN_PREFIX + kind[:60], "raw": _scrubbed(raw)}
        stamp = timestamp if isinstance(timestamp, str) else self._timestamp
        if self._group is not None:
            # inside a response (reasoning events, web searches): after its message, in order
            self._group.after.append((line, stamp, body))
            return []
        return [self._entry(line, stamp, body)]

    def _id(self, line: int, part: int) -> str:
        return hashlib.sha256(f"{self._session}/{line}/{part}".encode()).hexdigest()[:16]

    def _entry(
        self, line: int, timestamp: str | None, body: dict[str, Any], part: int = 0
    ) -> dict[str, Any]:
        """`body` as the next entry of the chain; its id derives from the session, the line and
        the entry's `part` of that line, so the same lines always give the same ids."""
        digest = self._id(line, part)
        entry = {"type": body["type"], "id": digest, "parentId": self._last, "timestamp": timestamp}
        entry.update((k, v) for k, v in body.items() if k != "type")
        self._last = digest
        return entry


# --- helpers ---------------------------------------------------------------------------------


def _call_ids(content: list[dict[str, Any]]) -> list[str]:
    """The ids of a response's tool calls, in order."""
    return [b["id"] for b in content if b.get("type") == "toolCall"]


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text_blocks(item: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """Codex content parts as pi blocks: text kinds as text, data-URL images as images."""
    value = item.get(key)
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    blocks: list[dict[str, Any]] = []
    for part in _list(value):
        if not isinstance(part, dict):
            continue
        text = part.get("text")
        url = part.get("image_url")
        if isinstance(text, str):
            blocks.append({"type": "text", "text": text})
        elif isinstance(url, str) and url.startswith("data:") and ";base64," in url:
            mime, data = url[5:].split(";base64,", 1)
            blocks.append({"type": "image", "data": data, "mimeType": mime})
        else:
            kind = part.get("type")
            blocks.append({**_scrubbed(part), "type": UNKNOWN_PREFIX + str(kind)[:60]})
    return blocks


def _joined(blocks: list[dict[str, Any]]) -> str:
    return "\n".join(b["text"] for b in blocks if b.get("type") == "text")


def _json(text: str) -> Any:
    """`text` as JSON the wire carries, or None: orjson's rules (no NaN or Infinity, no lone
    surrogate) and its depth limit, so no text nests the parse past Python's stack."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _arguments(raw: Any) -> dict[str, Any]:
    """A function call's `arguments` (a JSON string) as an object; a string that is not a JSON
    object, or nests deeper than `ARGUMENTS_DEPTH`, is kept whole under `arguments`."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        parsed = _json(raw)
        if isinstance(parsed, dict) and not too_deep(parsed, ARGUMENTS_DEPTH):
            return parsed
        return {"arguments": raw}
    return {} if raw is None else {"arguments": _scrubbed_json(raw)}


def _exit_code(output: str) -> int | None:
    """The exit code a Codex shell output carries: `{"output", "metadata": {"exit_code"}}` JSON,
    a freeform `Exit code: N` head, unified exec's `Process exited with code N` line, or a
    sandbox failure's `exit code: N`; None when it carries none (unknown, not success)."""
    if output.startswith("{"):
        parsed = _json(output)
        metadata = parsed.get("metadata") if isinstance(parsed, dict) else None
        code = metadata.get("exit_code") if isinstance(metadata, dict) else None
        if isinstance(code, int) and not isinstance(code, bool):
            return code
        return None
    head = output[:2000]
    match = _EXIT_HEAD.match(output) or _PROCESS_EXIT.search(head)
    return int(match.group(1)) if match else sandbox_exit(output)


def _usage(event: dict[str, Any]) -> dict[str, Any] | None:
    """A token_count's last request usage in pi's shape, or None."""
    info = event.get("info")
    last = info.get("last_token_usage") if isinstance(info, dict) else None
    if not isinstance(last, dict):
        last = event if "input_tokens" in event else None  # the older flat token_count
    return None if last is None else _counts(last)


def _counts(last: dict[str, Any]) -> dict[str, Any] | None:
    """OpenAI usage counts in pi's shape (OpenAI's input count includes the cached part and the
    part written to the cache), or None when a count is not an integer."""
    names = ("input_tokens", "cached_input_tokens", "cache_write_input_tokens", "output_tokens")
    counts = [last.get(k, 0) for k in names]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in counts):
        return None
    given, cached, written, output = (int(v) for v in counts)
    return {
        "input": max(given - cached - written, 0),
        "output": output,
        "cacheRead": cached,
        "cacheWrite": written,
        "totalTokens": given + output,
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0},
    }


def _ms(timestamp: Any) -> int | None:
    """An ISO timestamp as Unix milliseconds (pi's message timestamps), None if unreadable."""
    if not isinstance(timestamp, str):
        return None
    try:
        moment = datetime.fromisoformat(timestamp.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return int(moment.timestamp() * 1000)


def _compact(message: dict[str, Any]) -> dict[str, Any]:
    """Drop the None values, as pi's JSON.stringify drops undefined ones."""
    return {k: v for k, v in message.items() if v is not None}


def _scrubbed(value: Any) -> Any:
    """`value` with every `encrypted_content` string replaced by its length."""
    if isinstance(value, dict):
        return {
            (f"{k}_chars" if k == "encrypted_content" and isinstance(v, str) else k): (
                len(v) if k == "encrypted_content" and isinstance(v, str) else _scrubbed(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_scrubbed(v) for v in value]
    return value


def _scrubbed_json(value: Any) -> str:
    return json.dumps(_scrubbed(value), ensure_ascii=False, separators=(",", ":"))
