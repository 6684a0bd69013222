"""OpenAI's Responses API as Codex calls it (`POST /v1/responses`, streamed; `/v1/responses/
compact` and `GET /v1/models` passed through): the gateway's reading of it (model_api.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from sessionfold.streams.web.model_api import (
    ChainSpan,
    ModelApi,
    call_positions,
    count,
    json_object,
    named_range,
    nonempty,
    pairs_exactly,
)


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
_PROMPT = ("message", "user")
_ANSWER = ("message", "assistant")
#: The roles of a turn's prompt and answer (other roles' messages are instructions).
_TALK = ("user", "assistant")


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


def _turns(body: Any) -> tuple[list[Any], dict[str, int]]:
    """The request's input items and the index of each tool output item."""
    items = body.get("input") if isinstance(body, dict) else None
    if not isinstance(items, list):
        return [], {}
    holding = {_call_of(i): n for n, i in enumerate(items) if _kind(i)[0] in _OUTPUTS}
    return items, holding


def _chain_spans(body: Any, chains: Mapping[str, Sequence[str]]) -> dict[str, ChainSpan]:
    """Where each chain lies (chain id -> its calls), for the chains the request holds whole:
    from its first call's response (the reasoning and text before the call; after the chain's
    prompt, the last user message before it) to the last item naming one of its calls, each
    one reasoning, an assistant message, or a call or output of the chain; then an answer with
    no call. The items are read once for all chains."""
    items = body.get("input") if isinstance(body, dict) else None
    if not isinstance(items, list) or not chains:
        return {}
    kinds = [_kind(item) for item in items]
    positions = call_positions([[call] if (call := _call_of(i)) is not None else [] for i in items])
    spans: dict[str, ChainSpan] = {}
    for key, calls in chains.items():
        first, end = named_range(positions, calls)
        if first < 0:
            continue
        # the first call's response: the reasoning and text before it go with it
        while first > 0 and (kinds[first - 1][0] == "reasoning" or kinds[first - 1] == _ANSWER):
            first -= 1
        # the prompt: the last user message before, only messages of other roles between (an
        # instruction); another call or output there is a round the plan does not name
        start = first - 1
        while start >= 0 and kinds[start][0] == "message" and kinds[start][1] not in _TALK:
            start -= 1
        if start < 0 or kinds[start] != _PROMPT:
            continue
        answer = next((k for k in kinds[end + 1 :] if k[0] != "reasoning"), None)
        if answer != _ANSWER:
            continue  # no answer closes it in this request (it holds more rounds than the plan)
        other = _range_other(items[first : end + 1], calls)
        if other is not None:
            spans[key] = ChainSpan(start, first, end, other)
    return spans


def _range_other(items: list[Any], calls: Sequence[str]) -> int | None:
    """The chars a chain's range holds besides its outputs, or None unless it holds exactly
    the chain's calls and their outputs, with reasoning and assistant text only besides."""
    wanted = set(calls)
    made: list[Any] = []
    answered: list[Any] = []
    other = 0
    for item in items:
        kind, call = _kind(item), _call_of(item)
        if kind[0] in _OUTPUTS and call in wanted:
            answered.append(call)
            continue
        if kind[0] in _CALLS and call in wanted:
            made.append(call)
        elif kind[0] != "reasoning" and kind != _ANSWER:
            return None
        other += len(orjson.dumps(item))
    return other if pairs_exactly(made, answered, calls) else None


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
    chain_spans=_chain_spans,
    drop_chain=_drop_chain,
    problem=_problem,
    turns=_turns,
)
