"""Anthropic Messages on the wire: the request the model port sends, and the answer read back.

The HTTP core (`model_http`) owns the connection, the URL (`{base}/v1/messages`), the timeouts,
the retries and the fallback for every provider; for an endpoint whose provider is `anthropic`
it asks this module for the headers (`x-api-key`, `anthropic-version`), the body (a
`MessageCreateParams`: system messages become the `system` field) and for the reading of the
answer, a `Message` or its stream of events, both validated against the `anthropic` SDK's types.

The answer comes back in the port's own terms (`MessagesAnswer`): the text of the text blocks,
the stop reason in the chat-completions words the callers test (`max_tokens` is `length`,
`refusal` is `content_filter`, with its text dropped: a refusal is no summary), and the usage
with cache reads and writes apart. A body that is no Messages answer raises `MessagesFormat`;
an `error` object or event in a 200 raises `MessagesApiError` with the status its error type
stands for. Neither exception carries text from the answer.

The SDK is imported here only, and this module only when an Anthropic endpoint is used: the
offline and OpenAI-compatible paths never load it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic
from anthropic.types import (
    Message,
    MessageParam,
    RawContentBlockDeltaEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
    RawMessageStreamEvent,
)
from anthropic.types.message_create_params import MessageCreateParamsBase

#: The API version every request names (the Messages API's stable one).
API_VERSION = "2023-06-01"
#: Where the Messages API lives when neither a setting nor `ANTHROPIC_BASE_URL` says.
DEFAULT_BASE_URL = "https://api.anthropic.com"

#: Anthropic's stop reasons in the chat-completions words the port's callers test.
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}
#: The HTTP status an error object's type stands for (an error event in a 200 stream).
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}

_EVENT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RawMessageStreamEvent)


class MessagesFormat(Exception):
    """The answer is no Messages answer; `detail` is a code (`not-json`, `bad-event`, ...)."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class MessagesApiError(Exception):
    """An error object in a 200 answer; `status` is what its type stands for (None: unknown)."""

    def __init__(self, status: int | None) -> None:
        self.status = status
        super().__init__(f"error-in-answer:{status}")


@dataclass(slots=True)
class MessagesAnswer:
    """One answer in the port's terms. `input_tokens` is the whole input, cached or not."""

    text: str = ""
    finish_reason: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reported: bool = False


def request_headers(api_key: str | None) -> dict[str, str]:
    """The key (as `x-api-key`, never as a bearer token) and the API version."""
    headers = {"anthropic-version": API_VERSION}
    if api_key:
        headers["x-api-key"] = api_key
    return headers


def request_body(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    max_tokens: int,
    *,
    stream: bool,
    temperature: float | None = None,
) -> MessageCreateParamsBase:
    """The request for chat-style `messages`: system messages joined into `system`, the others
    sent in order. No `response_format` or reasoning effort: the Messages API has neither
    (the ledger's prompt asks for JSON, and its reader tolerates prose around it)."""
    system = [str(m.get("content") or "") for m in messages if m.get("role") == "system"]
    turns: list[MessageParam] = [
        {"role": "assistant" if m.get("role") == "assistant" else "user", "content": m["content"]}
        for m in messages
        if m.get("role") != "system"
    ]
    body: MessageCreateParamsBase = {"model": model, "max_tokens": max_tokens, "messages": turns}
    if system:
        body["system"] = "\n\n".join(system)
    if temperature is not None:
        body["temperature"] = temperature
    # `stream` is not in the base params (its two subclasses differ by it alone).
    return {**body, "stream": stream}  # type: ignore[typeddict-unknown-key]


def read_message(raw: bytes) -> MessagesAnswer:
    """A whole (not streamed) answer."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise MessagesFormat("not-json") from None
    if not isinstance(data, dict):
        raise MessagesFormat("not-an-object")
    if data.get("type") == "error":
        raise _api_error(data)
    try:
        message = Message.model_validate(data)
    except (pydantic.ValidationError, RecursionError):
        raise MessagesFormat("not-a-message") from None
    answer = MessagesAnswer()
    _add_usage(answer, message.usage.model_dump())
    answer.text = "".join(block.text for block in message.content if block.type == "text")
    _finish(answer, message.stop_reason)
    return answer


def read_events(events: Iterable[str], tick: Callable[[], None]) -> MessagesAnswer:
    """A streamed answer from its events' data: text deltas, the stop reason, the usage of
    `message_start` and `message_delta`. `tick` runs before each event (the caller's clock).
    A stream that ends before `message_stop` (or a stop reason) is cut: `MessagesFormat`
    with `stream-cut`."""
    answer = MessagesAnswer()
    parts: list[str] = []
    stopped = False
    for data in events:
        tick()
        if not data:
            continue
        try:
            raw = json.loads(data)
        except (json.JSONDecodeError, RecursionError):
            raise MessagesFormat("bad-event") from None
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind == "ping":
            continue
        if kind == "error":
            raise _api_error(raw)
        try:
            event = _EVENT.validate_python(raw)
        except (pydantic.ValidationError, RecursionError):
            if isinstance(kind, str) and kind not in _KNOWN_EVENTS:
                continue  # an event type newer than the SDK: the API may add them
            raise MessagesFormat("bad-event") from None
        if isinstance(event, RawMessageStartEvent):
            _add_usage(answer, event.message.usage.model_dump())
        elif isinstance(event, RawContentBlockDeltaEvent):
            if event.delta.type == "text_delta":
                parts.append(event.delta.text)
        elif isinstance(event, RawMessageDeltaEvent):
            _add_usage(answer, event.usage.model_dump())
            _finish(answer, event.delta.stop_reason)
        elif isinstance(event, RawMessageStopEvent):
            stopped = True
            break
    if not stopped and answer.finish_reason is None:
        raise MessagesFormat("stream-cut")
    answer.text = "".join(parts)
    if answer.finish_reason == "content_filter":
        answer.text = ""
    return answer


_KNOWN_EVENTS = frozenset(
    {
        "message_start",
        "message_delta",
        "message_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    }
)


def _finish(answer: MessagesAnswer, stop_reason: str | None) -> None:
    if stop_reason is None:
        return
    answer.finish_reason = _FINISH.get(stop_reason, stop_reason)
    if answer.finish_reason == "content_filter":
        answer.text = ""  # what came before a refusal is no answer


def _add_usage(answer: MessagesAnswer, usage: Mapping[str, Any]) -> None:
    """Fold one usage object in: `message_delta`'s counts are cumulative, so each present count
    replaces the one before; the input is the sum of the uncached, read and written tokens."""
    fresh = _count(usage.get("input_tokens"))
    read = _count(usage.get("cache_read_input_tokens"))
    written = _count(usage.get("cache_creation_input_tokens"))
    output = _count(usage.get("output_tokens"))
    if read is not None:
        answer.cache_read_tokens = read
    if written is not None:
        answer.cache_write_tokens = written
    if fresh is not None:
        answer.input_tokens = fresh + answer.cache_read_tokens + answer.cache_write_tokens
        answer.reported = True
    elif read is not None or written is not None:
        answer.input_tokens = max(
            answer.input_tokens, answer.cache_read_tokens + answer.cache_write_tokens
        )
    if output is not None:
        answer.output_tokens = output
        answer.reported = True


def _count(value: Any) -> int | None:
    """A token count: a non-negative integer (not a bool), else None (not reported)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _api_error(data: Mapping[str, Any]) -> MessagesApiError:
    error = data.get("error")
    kind = error.get("type") if isinstance(error, dict) else None
    return MessagesApiError(_ERROR_STATUS.get(kind) if isinstance(kind, str) else None)
