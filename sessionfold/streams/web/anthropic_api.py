"""Anthropic's Messages API as Claude Code calls it (`POST /v1/messages?beta=true`, streamed,
and `POST /v1/messages/count_tokens`): the gateway's reading of it (model_api.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from sessionfold.streams.web.model_api import ModelApi, count, json_object, nonempty


def _claude_session(headers: Mapping[str, str], body: bytes) -> str | None:
    """`X-Claude-Code-Session-Id`, else the `session_id` in the body's `metadata.user_id` (a
    JSON string Claude Code writes there; the body is parsed only then)."""
    found = nonempty(headers.get("x-claude-code-session-id"))
    if found is not None:
        return found
    parsed = json_object(body)
    metadata = parsed.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    return nonempty(json_object(user).get("session_id"))


def _anthropic_usage(event: str, data: Any) -> dict[str, int] | None:
    """message_start carries the input side (and a first output count), message_delta the
    final counts; each part taken from the last event that states it."""
    if not isinstance(data, dict):
        return None
    if event == "message_start":
        message = data.get("message")
        usage = message.get("usage") if isinstance(message, dict) else None
    else:
        usage = data.get("usage")
    if not isinstance(usage, dict):
        return None
    parts = {
        "input": count(usage, "input_tokens"),
        "cache_read": count(usage, "cache_read_input_tokens"),
        "cache_write": count(usage, "cache_creation_input_tokens"),
        "output": count(usage, "output_tokens"),
    }
    return {k: v for k, v in parts.items() if v is not None}


def _anthropic_error(kind: str, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def _tool_results(body: Any) -> list[tuple[str, dict[str, Any]]]:
    """The `tool_result` blocks of the request's user messages, with their `tool_use_id`."""
    messages = body.get("messages") if isinstance(body, dict) else None
    found: list[tuple[str, dict[str, Any]]] = []
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list) or message.get("role") != "user":
            continue
        for block in content:
            if (
                isinstance(block, dict)
                and block.get("type") == "tool_result"
                and isinstance(block.get("tool_use_id"), str)
            ):
                found.append((block["tool_use_id"], block))
    return found


def _replace(block: dict[str, Any], text: str) -> None:
    """The result's content becomes `text`; `cache_control` stays; `is_error` goes (a summary
    is no error, as pi-condense's stub says)."""
    block["content"] = text
    block.pop("is_error", None)


ANTHROPIC = ModelApi(
    name="anthropic",
    routes=(("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens")),
    default_upstream="https://api.anthropic.com",
    session_of=_claude_session,
    usage_of=_anthropic_usage,
    usage_events=frozenset({"message_start", "message_delta"}),
    error_body=_anthropic_error,
    results=_tool_results,
    replace=_replace,
)
