"""OpenAI's Responses API as Codex calls it (`POST /v1/responses`, streamed; `/v1/responses/
compact` and `GET /v1/models` passed through): the gateway's reading of it (model_api.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from sessionfold.streams.web.model_api import ModelApi, count, json_object, nonempty


def _codex_session(headers: Mapping[str, str], body: bytes) -> str | None:
    """`x-codex-turn-metadata`'s `session_id`, else the `session_id` header, else the body's
    `prompt_cache_key` (Codex sets it to the session id; the body is parsed only then)."""
    found = nonempty(json_object(headers.get("x-codex-turn-metadata")).get("session_id"))
    found = found or nonempty(headers.get("session_id"))
    if found is None:
        found = nonempty(json_object(body).get("prompt_cache_key"))
    return found


def _responses_usage(event: str, data: Any) -> dict[str, int] | None:
    """response.completed's `usage`: OpenAI counts the cached part inside `input_tokens`."""
    response = data.get("response") if isinstance(data, dict) else None
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return None
    details = usage.get("input_tokens_details")
    given = count(usage, "input_tokens")
    cached = count(details, "cached_tokens") or 0
    output = count(usage, "output_tokens")
    parts = {
        "input": None if given is None else max(given - cached, 0),
        "cache_read": cached,
        "output": output,
    }
    return {k: v for k, v in parts.items() if v is not None}


def _openai_error(kind: str, message: str) -> bytes:
    return orjson.dumps({"error": {"type": kind, "message": message, "code": None}})


_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})


def _tool_outputs(body: Any) -> list[tuple[str, dict[str, Any]]]:
    """The tool output items of the request's `input`, with their `call_id`."""
    items = body.get("input") if isinstance(body, dict) else None
    return [
        (item["call_id"], item)
        for item in (items if isinstance(items, list) else [])
        if isinstance(item, dict)
        and item.get("type") in _OUTPUTS
        and isinstance(item.get("call_id"), str)
    ]


def _replace(item: dict[str, Any], text: str) -> None:
    item["output"] = text


OPENAI = ModelApi(
    name="openai",
    routes=(
        ("POST", "/v1/responses"),
        ("POST", "/v1/responses/compact"),
        ("GET", "/v1/models"),
    ),
    default_upstream="https://api.openai.com",
    session_of=_codex_session,
    usage_of=_responses_usage,
    usage_events=frozenset({"response.completed"}),
    error_body=_openai_error,
    results=_tool_outputs,
    replace=_replace,
)
