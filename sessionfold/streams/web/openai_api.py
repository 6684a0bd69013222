"""OpenAI's Responses API as Codex calls it (`POST /v1/responses`, streamed; `/v1/responses/
compact` and `GET /v1/models` passed through): the gateway's reading of it (model_api.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from sessionfold.streams.web.model_api import ChainSpan, ModelApi, count, json_object, nonempty


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
_CALLS = frozenset({"function_call", "custom_tool_call"})


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


def _kind(item: Any) -> tuple[Any, Any]:
    """An input item's type and, for a message, its role."""
    if not isinstance(item, dict):
        return None, None
    return item.get("type"), item.get("role")


def _call_of(item: Any) -> Any:
    return item.get("call_id") if isinstance(item, dict) else None


def _chain_span(body: Any, calls: Sequence[str]) -> ChainSpan | None:
    """The chain's range: from its first call's response (the reasoning and text before the
    call; after the chain's prompt, the last user message before it) to the last item naming
    one of its calls, each one reasoning, an assistant message, or a call or output of the
    chain; then an answer with no call."""
    items = body.get("input") if isinstance(body, dict) else None
    wanted = set(calls)
    if not isinstance(items, list) or not wanted:
        return None
    named = [n for n, item in enumerate(items) if _call_of(item) in wanted]
    if not named:
        return None
    first, end = named[0], named[-1]
    # the first call's response: the reasoning and text before it go with it
    while first > 0 and (
        _kind(items[first - 1])[0] == "reasoning"
        or _kind(items[first - 1]) == ("message", "assistant")
    ):
        first -= 1
    prompts = [n for n in range(first) if _kind(items[n]) == ("message", "user")]
    if not prompts or any(_kind(i)[1] == "assistant" for i in items[prompts[-1] : first]):
        return None
    start = prompts[-1]
    uses: list[Any] = []
    results: list[Any] = []
    other = 0
    for item in items[first : end + 1]:
        kind, role = _kind(item)
        if kind in _OUTPUTS and item.get("call_id") in wanted:
            results.append(item["call_id"])
            continue
        if kind in _CALLS and item.get("call_id") in wanted:
            uses.append(item["call_id"])
        elif kind != "reasoning" and (kind, role) != ("message", "assistant"):
            return None
        other += len(orjson.dumps(item))
    if len(uses) != len(wanted) or set(uses) != wanted or sorted(results) != sorted(uses):
        return None
    answer = next((_kind(i) for i in items[end + 1 :] if _kind(i)[0] != "reasoning"), None)
    if answer != ("message", "assistant"):
        return None  # no answer closes it in this request (it holds more rounds than the plan)
    return ChainSpan(start, first, end, other)


def _drop_chain(body: Any, span: ChainSpan, text: str) -> None:
    """The range goes; a user message of the chain's text stands in its place."""
    chain = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    body["input"][span.first : span.end + 1] = [chain]


def _problem(body: Any) -> str | None:
    """Each call answered by one output after it, each output answering a call before it."""
    items = body.get("input") if isinstance(body, dict) else None
    if not isinstance(items, list):
        return None
    called: set[Any] = set()
    answered: set[Any] = set()
    for item in items:
        kind, _role = _kind(item)
        if kind in _CALLS:
            if item.get("call_id") in called:
                return "call-twice"
            called.add(item.get("call_id"))
        elif kind in _OUTPUTS:
            if item.get("call_id") not in called or item.get("call_id") in answered:
                return "output-without-call"
            answered.add(item.get("call_id"))
    return None if called <= answered else "call-without-output"


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
    chain_span=_chain_span,
    drop_chain=_drop_chain,
    problem=_problem,
)
