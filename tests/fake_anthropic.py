"""A fake Anthropic Messages server on a real socket, for the model port's `anthropic` provider.

Not a test module: tests import it (`from fake_anthropic import FakeMessages, Reply`). The server
binds 127.0.0.1:0 in a thread and answers `POST /v1/messages` as the Messages API does: a whole
`message` object, or (when the request asks) its stream of server-sent events (`message_start`,
`content_block_*`, `message_delta`, `message_stop`, with a `ping` among them). Replies come from a
script, first in first out, then `default`; every request is recorded with its headers.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """What the server does with one request.

    `text` is the answer (one text block, streamed in `chunk_chars` pieces); `blocks` replaces
    the content blocks whole (a `thinking` or `tool_use` block and no text). `status` >= 400
    answers an Anthropic error body of `error_type`; `body` replaces the answer with raw bytes;
    `error_event` streams an `error` event of that type after the first delta. `stall_s`
    sleeps after the headers (an idle model). `usage` is (input, output, cache read, cache
    write) tokens. `event_delay_s` sleeps between stream events (a model that trickles).
    """

    text: str = "ok"
    stop_reason: str = "end_turn"
    blocks: list[dict[str, Any]] | None = None
    status: int = 200
    error_type: str = "api_error"
    body: str | None = None
    error_event: str | None = None
    stall_s: float = 0.0
    event_delay_s: float = 0.0
    chunk_chars: int = 7
    usage: tuple[int, int, int, int] = (120, 30, 0, 0)
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Request:
    """One request the server got."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def prompt(self) -> str:
        """The user messages' text, joined."""
        texts = []
        for message in self.body.get("messages", []):
            content = message.get("content")
            if isinstance(content, str):
                texts.append(content)
            else:
                texts.extend(part.get("text", "") for part in content or [])
        return "\n".join(texts)


Responder = Callable[[Request], Reply]


class FakeMessages:
    """The server; use as a context manager. `script` queues replies; `requests` records."""

    def __init__(self, default: Reply | Responder | None = None) -> None:
        self.default = default or Reply()
        self.replies: deque[Reply] = deque()
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.fake = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    def __enter__(self) -> FakeMessages:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def base_url(self) -> str:
        """The base URL as `ANTHROPIC_BASE_URL` takes it (no `/v1`)."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def script(self, *replies: Reply) -> None:
        """Queue replies for the next requests, in order."""
        with self._lock:
            self.replies.extend(replies)

    def _next(self, request: Request) -> Reply:
        with self._lock:
            self.requests.append(request)
            if self.replies:
                return self.replies.popleft()
        return self.default(request) if callable(self.default) else self.default


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read the recorded requests instead."""

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        headers = {k.lower(): v for k, v in self.headers.items()}
        fake: FakeMessages = self.server.fake  # type: ignore[attr-defined]
        reply = fake._next(Request(self.path, headers, body))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._answer(reply, body)

    def _answer(self, reply: Reply, body: dict[str, Any]) -> None:
        if reply.status >= 400:
            error = {"type": "error", "error": {"type": reply.error_type, "message": "no"}}
            self._whole(reply.status, json.dumps(error).encode(), reply.headers)
            return
        if reply.body is not None:
            self._whole(200, reply.body.encode(), reply.headers)
            return
        message = _message(reply, body)
        if not body.get("stream"):
            if reply.stall_s:
                time.sleep(reply.stall_s)
            self._whole(200, json.dumps(message).encode(), reply.headers)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        if reply.stall_s:
            self.wfile.flush()
            time.sleep(reply.stall_s)
        for name, data in _events(reply, message):
            self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()
            if reply.event_delay_s:
                time.sleep(reply.event_delay_s)

    def _whole(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)


def _message(reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
    fresh, output, read, written = reply.usage
    blocks = reply.blocks if reply.blocks is not None else [{"type": "text", "text": reply.text}]
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "?"),
        "content": blocks,
        "stop_reason": reply.stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": fresh,
            "output_tokens": output,
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": written,
        },
    }


def _events(reply: Reply, message: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The message as the API streams it."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    yield "message_start", {"type": "message_start", "message": start}
    yield "ping", {"type": "ping"}
    for index, block in enumerate(message["content"]):
        if block["type"] != "text":
            yield "content_block_start", _block(index, block)
            yield "content_block_stop", {"type": "content_block_stop", "index": index}
            continue
        yield "content_block_start", _block(index, {"type": "text", "text": ""})
        text = block["text"]
        for at in range(0, max(len(text), 1), reply.chunk_chars):
            delta = {"type": "text_delta", "text": text[at : at + reply.chunk_chars]}
            yield (
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
            if reply.error_event:
                error = {"type": reply.error_event, "message": "no"}
                yield "error", {"type": "error", "error": error}
                return
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": delta,
            "usage": {"output_tokens": usage["output_tokens"]},
        },
    )
    yield "message_stop", {"type": "message_stop"}


def _block(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}
