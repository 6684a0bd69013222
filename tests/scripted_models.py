"""Scripted model servers for the real agent CLIs: Anthropic Messages and OpenAI Responses.

Not a test module: tests import it (`from scripted_models import ...`). Each server binds
127.0.0.1:0 in a thread and answers every POST from a script of `Turn`s, in order, streaming
server-sent events the way the real API does (Anthropic: message_start, content_block_start /
delta / stop, message_delta with the usage and stop_reason, message_stop; Responses:
response.created, response.output_item.added / done, response.output_text.delta,
response.function_call_arguments.delta, response.completed with the usage). A request's kind
(`"turn"` or `"compaction"`, see `anthropic_kind` and `responses_kind`) picks its queue, so a
compaction's summary request is answered from the summaries and never eats a turn. Every request
is recorded (path, headers, body) with the turn that answered it; a request with nothing left
to answer gets a short text and is counted in `unscripted`, which tests check is empty.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Call:
    """One tool call the model makes: its id, tool name and input object.

    `input` may be a function of the request being answered, for an input the script cannot
    know in advance (the session id a unified exec output names, to poll it).
    """

    id: str
    name: str
    input: dict[str, Any] | Callable[[Request], dict[str, Any]]
    #: The Responses API's namespace of the function (Codex lists an MCP server's tools in
    #: one: `mcp__<server>`); Anthropic's calls name the tool whole.
    namespace: str | None = None

    def arguments(self, request: Request) -> dict[str, Any]:
        """The input object this call sends in answer to `request`."""
        return self.input(request) if callable(self.input) else self.input


@dataclass(frozen=True)
class Usage:
    """The token counts a response reports (Anthropic's cache counts beside the input)."""

    input: int
    output: int
    cache_read: int = 0
    cache_write: int = 0


@dataclass(frozen=True)
class Turn:
    """One model response: text (may be empty), tool calls in order, the usage it reports."""

    text: str = ""
    calls: tuple[Call, ...] = ()
    usage: Usage = field(default_factory=lambda: Usage(100, 10))


@dataclass
class Request:
    """One request the server got, and what answered it (None: nothing was scripted)."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    kind: str
    turn: Turn | None = None
    raw: bytes = b""  # the body's bytes as they came


Classifier = Callable[[str, dict[str, str], dict[str, Any]], str]


class ScriptedModel:
    """The common server: queues per request kind, the record, the thread. Subclasses stream."""

    #: The path suffix this API answers; other POSTs get a 404 (and are recorded).
    endpoint = ""

    def __init__(
        self,
        turns: Iterable[Turn] = (),
        summaries: Iterable[Turn] = (),
        classify: Classifier | None = None,
    ) -> None:
        self.queues: dict[str, deque[Turn]] = {
            "turn": deque(turns),
            "compaction": deque(summaries),
        }
        self.classify = classify or self.kind_of
        self.requests: list[Request] = []
        self.unscripted: list[Request] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> ScriptedModel:
        """Listen on 127.0.0.1 (a free port) and serve in a thread."""
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        server.block_on_close = False
        server.model = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ScriptedModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port it listens on."""
        assert self._server is not None, "not started"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT` (no path)."""
        return f"http://127.0.0.1:{self.port}"

    # -- script ----------------------------------------------------------------------------

    def add(self, *turns: Turn, kind: str = "turn") -> None:
        """Queue more answers for requests of `kind` (between CLI runs)."""
        with self._lock:
            self.queues.setdefault(kind, deque()).extend(turns)

    def pending(self) -> dict[str, int]:
        """How many scripted answers are left, per kind."""
        with self._lock:
            return {kind: len(queue) for kind, queue in self.queues.items()}

    def of_kind(self, kind: str) -> list[Request]:
        """The requests of one kind, in order."""
        return [r for r in self.requests if r.kind == kind]

    def next_id(self, prefix: str) -> str:
        """A fresh id for a message or an item (unique within this server)."""
        return f"{prefix}_{next(self._ids):024d}"

    def take(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Request:
        """Record one request and pick its answer."""
        kind = self.classify(path, headers, body)
        with self._lock:
            request = Request(path, headers, body, kind)
            queue = self.queues.get(kind)
            if queue:
                request.turn = queue.popleft()
            else:
                self.unscripted.append(request)
            self.requests.append(request)
        return request

    @staticmethod
    def kind_of(path: str, headers: dict[str, str], body: dict[str, Any]) -> str:
        """A request's kind; subclasses know their CLI's compaction request."""
        return "turn"

    def events(self, request: Request, turn: Turn) -> Iterator[tuple[str, dict[str, Any]]]:
        """The (event name, data) pairs of one streamed answer."""
        raise NotImplementedError


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ThreadingHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read `requests`; request lines would be noise in the CLI's output."""

    @property
    def model(self) -> ScriptedModel:
        return self.server.model  # type: ignore[attr-defined]

    def do_HEAD(self) -> None:
        """A reachability probe: answered, carries nothing."""
        self._send(200, b"")

    def do_GET(self) -> None:
        """Model lists and the like: none is scripted; an empty list keeps clients going."""
        self._send(200, json.dumps({"data": [], "models": []}).encode())

    def do_POST(self) -> None:
        """Answer one request from the script, streamed."""
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            body = {"unreadable": len(raw)}
        headers = {k.lower(): v for k, v in self.headers.items()}
        request = self.model.take(self.path, headers, body)
        request.raw = raw
        self.close_connection = True
        if not self.path.split("?")[0].rstrip("/").endswith(self.model.endpoint):
            self._send(404, json.dumps({"error": {"message": "no such path"}}).encode())
            return
        turn = request.turn or Turn(text="(unscripted request)", usage=Usage(1, 1))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for name, data in self.model.events(request, turn):
            chunk = f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"
            self.wfile.write(chunk.encode())
        self.wfile.flush()

    def _send(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()


def _pieces(text: str, size: int) -> list[str]:
    """`text` cut in pieces of `size` characters, as a stream delivers it (never none)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


# -- Anthropic Messages -----------------------------------------------------------------------

#: Claude Code's /compact asks for a summary in a request whose last user message opens so.
_CLAUDE_COMPACT = "Your task is to create a detailed summary of the conversation"


def anthropic_kind(path: str, headers: dict[str, str], body: dict[str, Any]) -> str:
    """`compaction` for Claude Code's summary request (/compact), else `turn`."""
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else {}
    content = last.get("content") if isinstance(last, dict) else None
    texts = [content] if isinstance(content, str) else []
    if isinstance(content, list):
        texts = [b.get("text", "") for b in content if isinstance(b, dict)]
    if any(_CLAUDE_COMPACT in text for text in texts if isinstance(text, str)):
        return "compaction"
    return "turn"


class AnthropicModel(ScriptedModel):
    """`POST /v1/messages` streamed as the Messages API streams."""

    endpoint = "/v1/messages"

    @staticmethod
    def kind_of(path: str, headers: dict[str, str], body: dict[str, Any]) -> str:
        """See `anthropic_kind`."""
        return anthropic_kind(path, headers, body)

    def events(self, request: Request, turn: Turn) -> Iterator[tuple[str, dict[str, Any]]]:
        """message_start (input and cache counts), the blocks, message_delta (the full usage
        and stop_reason), message_stop."""
        usage = turn.usage
        counts = {
            "input_tokens": usage.input,
            "cache_creation_input_tokens": usage.cache_write,
            "cache_read_input_tokens": usage.cache_read,
        }
        message = {
            "id": self.next_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": request.body.get("model", "scripted"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # The API reports the input side up front and a first output count of 1.
            "usage": {**counts, "output_tokens": 1},
        }
        yield "message_start", {"type": "message_start", "message": message}
        index = 0
        if turn.text:
            block = {"type": "text", "text": ""}
            yield "content_block_start", _block_start(index, block)
            yield "ping", {"type": "ping"}
            for piece in _pieces(turn.text, 40):
                delta = {"type": "text_delta", "text": piece}
                yield "content_block_delta", _block_delta(index, delta)
            yield "content_block_stop", {"type": "content_block_stop", "index": index}
            index += 1
        for call in turn.calls:
            block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            yield "content_block_start", _block_start(index, block)
            for piece in _pieces(json.dumps(call.arguments(request)), 12):
                delta = {"type": "input_json_delta", "partial_json": piece}
                yield "content_block_delta", _block_delta(index, delta)
            yield "content_block_stop", {"type": "content_block_stop", "index": index}
            index += 1
        stop = "tool_use" if turn.calls else "end_turn"
        final = {**counts, "output_tokens": usage.output}
        yield (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": final,
            },
        )
        yield "message_stop", {"type": "message_stop"}


def _block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _block_delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


# -- OpenAI Responses -------------------------------------------------------------------------


def responses_kind(path: str, headers: dict[str, str], body: dict[str, Any]) -> str:
    """Codex names each request's kind in `x-codex-turn-metadata` (`request_kind`)."""
    try:
        meta = json.loads(headers.get("x-codex-turn-metadata", "{}"))
    except json.JSONDecodeError:
        return "turn"
    kind = meta.get("request_kind") if isinstance(meta, dict) else None
    return "compaction" if kind == "compaction" else "turn"


class ResponsesModel(ScriptedModel):
    """`POST /v1/responses` streamed as the Responses API streams."""

    endpoint = "/v1/responses"

    @staticmethod
    def kind_of(path: str, headers: dict[str, str], body: dict[str, Any]) -> str:
        """See `responses_kind`."""
        return responses_kind(path, headers, body)

    def events(self, request: Request, turn: Turn) -> Iterator[tuple[str, dict[str, Any]]]:
        """response.created, each item added / streamed / done, response.completed (usage)."""
        sequence = itertools.count()
        response: dict[str, Any] = {
            "id": self.next_id("resp"),
            "object": "response",
            "created_at": 1767225600,
            "status": "in_progress",
            "model": request.body.get("model", "scripted"),
            "output": [],
            "usage": None,
        }

        def event(kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
            return kind, {"type": kind, "sequence_number": next(sequence), **data}

        yield event("response.created", response=response)
        yield event("response.in_progress", response=response)
        output: list[dict[str, Any]] = []
        if turn.text:
            index = len(output)
            item_id = self.next_id("msg")
            item: dict[str, Any] = {
                "id": item_id,
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            yield event("response.output_item.added", output_index=index, item=item)
            part = {"type": "output_text", "text": "", "annotations": []}
            where = {"item_id": item_id, "output_index": index, "content_index": 0}
            yield event("response.content_part.added", **where, part=part)
            for piece in _pieces(turn.text, 40):
                yield event("response.output_text.delta", **where, delta=piece)
            yield event("response.output_text.done", **where, text=turn.text)
            part = {**part, "text": turn.text}
            yield event("response.content_part.done", **where, part=part)
            item = {**item, "status": "completed", "content": [part]}
            yield event("response.output_item.done", output_index=index, item=item)
            output.append(item)
        for call in turn.calls:
            index = len(output)
            arguments = json.dumps(call.arguments(request))
            item = {
                "id": self.next_id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "call_id": call.id,
                "name": call.name,
                "arguments": "",
            }
            if call.namespace is not None:
                item["namespace"] = call.namespace
            yield event("response.output_item.added", output_index=index, item=item)
            for piece in _pieces(arguments, 12):
                yield event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=piece,
                )
            yield event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=arguments,
            )
            item = {**item, "status": "completed", "arguments": arguments}
            yield event("response.output_item.done", output_index=index, item=item)
            output.append(item)
        usage = turn.usage
        done = {
            **response,
            "status": "completed",
            "output": output,
            "usage": {
                "input_tokens": usage.input,
                "input_tokens_details": {"cached_tokens": usage.cache_read},
                "output_tokens": usage.output,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage.input + usage.output,
            },
        }
        yield event("response.completed", response=done)
