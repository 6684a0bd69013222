"""Anthropic's Messages API as Claude Code calls it (`POST /v1/messages?beta=true`, streamed,
and `POST /v1/messages/count_tokens`): the gateway's reading of it (model_api.py)."""

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


def _blocks(message: Any) -> list[Any]:
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, list) else []


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else None


def _calls(message: Any) -> tuple[list[Any], list[Any]]:
    """The tool_use ids of an assistant message and the tool_result ids of a user message."""
    role = _role(message)
    made: list[Any] = []
    answered: list[Any] = []
    for block in _blocks(message):  # one pass over the blocks for both kinds
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use" and role == "assistant":
            made.append(block.get("id"))
        elif kind == "tool_result" and role == "user":
            answered.append(block.get("tool_use_id"))
    return made, answered


def _turns(body: Any) -> tuple[list[Any], dict[str, int]]:
    """The request's messages and the index of the user message holding each tool result."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return [], {}
    holding = {call: n for n, m in enumerate(messages) for call in _calls(m)[1]}
    return messages, holding


def _chain_spans(body: Any, chains: Mapping[str, Sequence[str]]) -> dict[str, ChainSpan]:
    """Where each chain lies (chain id -> its calls), for the chains the request holds whole:
    from the first message naming one of its calls (after its prompt) to the last, each one an
    assistant message of its calls only or a user message of its results (its other blocks
    stay); then an answer with no call. The messages are read once for all chains."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not chains:
        return {}
    roles = [_role(m) for m in messages]
    pairs = [_calls(m) for m in messages]
    uses = [made for made, _answered in pairs]
    results = [answered for _made, answered in pairs]
    positions = call_positions([made + answered for made, answered in pairs])
    spans: dict[str, ChainSpan] = {}
    for key, calls in chains.items():
        first, end = named_range(positions, calls)
        if first < 0:
            continue
        # the prompt: the user message before the range, past messages of other roles (Claude
        # Code sends its environment as a `system` message after the first prompt)
        start = first - 1
        while start >= 0 and roles[start] not in ("user", "assistant"):
            start -= 1
        if start < 0 or roles[start] != "user" or results[start]:
            continue
        if end + 1 >= len(messages) or roles[end + 1] != "assistant" or uses[end + 1]:
            continue  # no answer closes it in this request (it holds more rounds than the plan)
        inside = range(first, end + 1)
        if any(not (uses[n] or results[n]) for n in inside):
            continue  # a message of another role, or neither calls nor results
        made = [call for n in inside for call in uses[n]]
        answered = [call for n in inside for call in results[n]]
        if not pairs_exactly(made, answered, calls):
            continue
        other = sum(len(orjson.dumps(messages[n])) for n in inside if roles[n] == "assistant")
        spans[key] = ChainSpan(start, first, end, other)
    return spans


def _drop_chain(body: Any, span: ChainSpan, text: str) -> None:
    """The range goes; the prompt gets the chain's text as one more text block, then the other
    blocks the range's user messages held. A cache marker of a dropped block moves to the
    chain's block (the request keeps at most the breakpoints it had)."""
    messages = body["messages"]
    prompt = messages[span.start]
    content = prompt["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    chain: dict[str, Any] = {"type": "text", "text": text}
    kept: list[Any] = []
    for message in messages[span.first : span.end + 1]:
        user = _role(message) == "user"
        for block in _blocks(message):
            if user and not (isinstance(block, dict) and block.get("type") == "tool_result"):
                kept.append(block)
            elif isinstance(block, dict) and "cache_control" in block:
                chain["cache_control"] = block["cache_control"]
    prompt["content"] = [*blocks, chain, *kept]
    del messages[span.first : span.end + 1]


def _problem(body: Any) -> str | None:
    """Each tool_use answered by a tool_result in the next message, each tool_result answering
    a tool_use of the message before, no tool_use id twice."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return None
    seen: set[Any] = set()
    open_calls: list[Any] = []
    for message in messages:
        uses, results = _calls(message)
        if not set(results) <= set(open_calls):
            return "result-without-call"
        if open_calls and not set(open_calls) <= set(results):
            return "call-without-result"
        if seen.intersection(uses) or len(set(uses)) != len(uses):
            return "call-twice"
        seen.update(uses)
        open_calls = uses
    return None


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
    chain_spans=_chain_spans,
    drop_chain=_drop_chain,
    problem=_problem,
    turns=_turns,
)
