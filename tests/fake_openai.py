"""A fake OpenAI-compatible chat-completions server on a real socket, for the model port tests.

Not a test module: tests import it (`from fake_openai import FakeOpenAI, answer`), which works
because pytest puts `tests/` on sys.path for its rootdir conftest. The server binds 127.0.0.1:0
in a thread, answers `POST .../chat/completions` from a script of `Reply` objects (per model or
global, first in first out, then `default`), streams (SSE) when the request asks and records
every request it got. Stop and start again to play a server that is down for a while: the port
is kept.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """What the server does with one request.

    `text` is the answer; `body` replaces the whole answer with raw bytes (malformed answers;
    sent as an event stream when `stream` is True);
    `status` >= 400 answers an error; `drop` closes the connection without a word. Delays:
    `delay_s` before the status line, `stall_s` after the headers, `chunk_delay_s` between
    stream chunks. `stream` None follows the request. `usage` is (prompt, completion) tokens,
    None for no usage, "auto" for sizes derived from the texts.
    `filler` > 0 makes the answer that many `x` characters, written in 64 KiB pieces and never
    held whole (a runaway model); streamed, they travel as one event. `length_header` False
    leaves Content-Length out (the body ends when the connection closes). `body_delay_s`
    sends a non-streamed body `body_chunk_bytes` at a time, that long apart (a dribble).
    """

    text: str = "ok"
    finish_reason: str | None = "stop"
    status: int = 200
    body: str | None = None
    stream: bool | None = None
    delay_s: float = 0.0
    stall_s: float = 0.0
    chunk_delay_s: float = 0.0
    chunk_chars: int = 16
    usage: tuple[int, int] | str | None = "auto"
    cost: float | None = None
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False
    filler: int = 0
    length_header: bool = True
    body_delay_s: float = 0.0
    body_chunk_bytes: int = 1


def answer(text: str, **options: Any) -> Reply:
    """A normal answer."""
    return Reply(text=text, **options)


def json_answer(value: Any, **options: Any) -> Reply:
    """An answer whose text is `value` as JSON."""
    return Reply(text=json.dumps(value), **options)


def cut_off(text: str, **options: Any) -> Reply:
    """An answer stopped at the output limit (finish_reason "length")."""
    return Reply(text=text, finish_reason="length", **options)


def malformed(body: str, **options: Any) -> Reply:
    """A 200 whose body is `body` verbatim (not a chat completion)."""
    return Reply(body=body, **options)


def http_error(status: int, retry_after: str | None = None) -> Reply:
    """An HTTP error with an OpenAI-style error body (which clients must not log)."""
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    body = json.dumps({"error": {"message": "SECRET-ERROR-BODY", "code": status}})
    return Reply(status=status, body=body, headers=headers)


def stall(seconds: float, text: str = "late") -> Reply:
    """Headers at once, then nothing for `seconds`, then the answer."""
    return Reply(text=text, stall_s=seconds)


def silent(seconds: float, text: str = "late") -> Reply:
    """Nothing at all (not even headers) for `seconds`, then the answer."""
    return Reply(text=text, delay_s=seconds)


def trickle(text: str, every_s: float, chunk_chars: int = 1) -> Reply:
    """A streamed answer sent a few characters at a time, `every_s` apart."""
    return Reply(text=text, chunk_delay_s=every_s, chunk_chars=chunk_chars, stream=True)


def huge(size: int, **options: Any) -> Reply:
    """An answer of `size` characters, sent without ever being built (a runaway model)."""
    return Reply(filler=size, usage=None, **options)


def dribble(text: str, every_s: float, chunk_bytes: int = 1) -> Reply:
    """A non-streamed answer whose body arrives `chunk_bytes` at a time, `every_s` apart."""
    return Reply(text=text, stream=False, body_delay_s=every_s, body_chunk_bytes=chunk_bytes)


def drop() -> Reply:
    """Close the connection without answering."""
    return Reply(drop=True)


@dataclass(frozen=True)
class Request:
    """One request the server got: path, headers (lower-case names) and JSON body."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def model(self) -> str:
        """The model the request named."""
        return str(self.body.get("model"))

    @property
    def max_tokens(self) -> int | None:
        """The output budget asked, under either field name."""
        value = self.body.get("max_tokens", self.body.get("max_completion_tokens"))
        return int(value) if value is not None else None

    @property
    def prompt(self) -> str:
        """Every message's content, joined."""
        return "\n".join(str(m.get("content", "")) for m in self.body.get("messages", []))


Responder = Callable[[Request], Reply]


class FakeOpenAI:
    """The fake server. Use as a context manager, or `start()` / `stop()`."""

    def __init__(self, default: Reply | Responder | None = None) -> None:
        self.default: Reply | Responder = default or Reply(text="ok")
        self.requests: list[Request] = []
        self._script: deque[Reply] = deque()
        self._by_model: dict[str, deque[Reply]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeOpenAI:
        """Listen (on the same port as before, after a stop) and serve in a thread."""
        self._stopping.clear()
        server = ThreadingHTTPServer(("127.0.0.1", self.port), _Handler)
        server.daemon_threads = True
        server.block_on_close = False  # stalled handlers must not hold up a stop
        server.fake = self  # type: ignore[attr-defined]
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening; stalled answers wake and give up. The port is kept for `start`."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """The base URL a client is pointed at (`.../v1`)."""
        return f"http://127.0.0.1:{self.port}/v1"

    # -- script ----------------------------------------------------------------------------

    def script(self, *replies: Reply, model: str | None = None) -> None:
        """Queue replies, for one model or for any request."""
        with self._lock:
            if model is None:
                self._script.extend(replies)
            else:
                self._by_model.setdefault(model, deque()).extend(replies)

    def pending(self) -> int:
        """Scripted replies not used yet."""
        with self._lock:
            return len(self._script) + sum(len(q) for q in self._by_model.values())

    def models(self) -> list[str]:
        """The model of every request, in order."""
        return [r.model for r in self.requests]

    def _next(self, request: Request) -> Reply:
        with self._lock:
            self.requests.append(request)
            queue = self._by_model.get(request.model)
            if queue:
                return queue.popleft()
            if self._script:
                return self._script.popleft()
        return self.default(request) if callable(self.default) else self.default

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless stopped; False when the server is stopping."""
        return not self._stopping.wait(seconds) if seconds > 0 else not self._stopping.is_set()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ThreadingHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read `requests`, not the log."""

    @property
    def fake(self) -> FakeOpenAI:
        return self.server.fake  # type: ignore[attr-defined]

    def do_POST(self) -> None:
        """Answer one chat-completions request from the script."""
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            body = {"unreadable": True}
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = self.fake._next(Request(self.path, headers, body))
        self.close_connection = True
        # A client that gave up (a timeout test) closed its end: nothing left to do.
        with contextlib.suppress(OSError):
            self._answer(reply, body)

    def _answer(self, reply: Reply, body: dict[str, Any]) -> None:
        if reply.drop:
            return
        if not self.fake._sleep(reply.delay_s):
            return
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, json.dumps({"error": {"message": "no such path"}}).encode())
            return
        if reply.body is not None and reply.stream:
            self._send(reply.status, reply.body.encode(), reply.headers, "text/event-stream")
            return
        if reply.status >= 400 or reply.body is not None:
            payload = (reply.body if reply.body is not None else "").encode()
            self._send(reply.status, payload, reply.headers)
            return
        stream = body.get("stream", False) if reply.stream is None else reply.stream
        if reply.filler > 0 or (not stream and reply.body_delay_s > 0):
            # Bodies written piece by piece: a runaway answer, a dribbled one.
            (self._filler if reply.filler > 0 else self._dribble)(reply, body, stream)
            return
        usage = self._usage(reply, body)
        if not stream:
            message = {"role": "assistant", "content": reply.text}
            answer = {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
            }
            if usage is not None:
                answer["usage"] = usage
            if not self.fake._sleep(reply.stall_s):
                return
            self._send(200, json.dumps(answer).encode(), reply.headers)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.flush()
        if not self.fake._sleep(reply.stall_s):
            return
        model = body.get("model")
        self._event({"choices": [{"index": 0, "delta": {"role": "assistant"}}], "model": model})
        step = max(1, reply.chunk_chars)
        for start in range(0, len(reply.text), step):
            if start and not self.fake._sleep(reply.chunk_delay_s):
                return
            delta = {"content": reply.text[start : start + step]}
            self._event({"choices": [{"index": 0, "delta": delta}], "model": model})
        final = {"index": 0, "delta": {}, "finish_reason": reply.finish_reason}
        self._event({"choices": [final], "model": model})
        options = body.get("stream_options") or {}
        if usage is not None and options.get("include_usage"):
            self._event({"choices": [], "usage": usage, "model": model})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _dribble(self, reply: Reply, body: dict[str, Any], stream: bool) -> None:
        """A non-streamed answer written a few bytes at a time."""
        message = {"role": "assistant", "content": reply.text}
        choice = {"index": 0, "message": message, "finish_reason": reply.finish_reason}
        payload = json.dumps({"choices": [choice], "model": body.get("model")}).encode()
        self._start(200, "application/json", len(payload), reply.headers)
        step = max(1, reply.body_chunk_bytes)
        for start in range(0, len(payload), step):
            if start and not self.fake._sleep(reply.body_delay_s):
                return
            self.wfile.write(payload[start : start + step])
            self.wfile.flush()

    _MARK = "@@FILLER@@"

    def _filler(self, reply: Reply, body: dict[str, Any], stream: bool) -> None:
        """An answer of `reply.filler` characters, written piece by piece."""
        model = body.get("model")
        if stream:
            delta = {"choices": [{"index": 0, "delta": {"content": self._MARK}}], "model": model}
            head, tail = ("data: " + json.dumps(delta) + "\n\n").split(self._MARK)
            final = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            tail += "data: " + json.dumps(final) + "\n\ndata: [DONE]\n\n"
            content_type = "text/event-stream"
        else:
            message = {"role": "assistant", "content": self._MARK}
            choice = {"index": 0, "message": message, "finish_reason": reply.finish_reason}
            answer = {"object": "chat.completion", "model": model, "choices": [choice]}
            head, tail = json.dumps(answer).split(self._MARK)
            content_type = "application/json"
        size = len(head) + reply.filler + len(tail)
        self._start(200, content_type, size if reply.length_header else None, reply.headers)
        self.wfile.write(head.encode())
        piece = b"x" * 65536
        left = reply.filler
        while left > 0 and not self.fake._stopping.is_set():
            self.wfile.write(piece[: min(left, len(piece))])
            left -= len(piece)
        self.wfile.write(tail.encode())
        self.wfile.flush()

    def _start(
        self, status: int, content_type: str, length: int | None, headers: dict[str, str]
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.send_header("Connection", "close")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    @staticmethod
    def _usage(reply: Reply, body: dict[str, Any]) -> dict[str, Any] | None:
        if reply.usage is None:
            return None
        if reply.usage == "auto":
            prompt = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
            pair = (max(1, prompt // 4), max(1, len(reply.text) // 4))
        else:
            pair = reply.usage  # type: ignore[assignment]
        usage: dict[str, Any] = {
            "prompt_tokens": pair[0],
            "completion_tokens": pair[1],
            "total_tokens": pair[0] + pair[1],
        }
        if reply.cost is not None:
            usage["cost"] = reply.cost
        return usage

    def _event(self, chunk: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        self.wfile.flush()

    def _send(
        self,
        status: int,
        payload: bytes,
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()
