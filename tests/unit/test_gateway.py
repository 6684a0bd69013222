"""serve's gateway, a real serve in front of scripted model servers: each call goes upstream
with the agent's bytes and headers (but the hop-by-hop ones and serve's token), the answer comes
back byte for byte as it streams, the usage it reports is counted per session, and the agent's
key is in no log. An upstream it cannot reach is a 502 in the API's own error shape."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from scripted_models import AnthropicModel, Call, ResponsesModel, Turn, Usage
from serve_process import Serve, serving

from sessionfold.streams.tools.broker import free_port_pair

TOKEN = secrets.token_urlsafe(24)
KEY = "sk-ant-secret-" + secrets.token_hex(8)
SESSION = "5f0e1c52-0000-4000-8000-00000000beef"


@pytest.fixture()
def models() -> Iterator[tuple[AnthropicModel, ResponsesModel]]:
    with AnthropicModel() as anthropic, ResponsesModel() as responses:
        yield anthropic, responses


@pytest.fixture()
def serve(tmp_path: Path, models: tuple[AnthropicModel, ResponsesModel]) -> Iterator[Serve]:
    anthropic, responses = models
    (tmp_path / "sessions").mkdir()
    args = ["--anthropic-upstream", anthropic.url, "--openai-upstream", responses.url]
    with serving(tmp_path / "sessions", TOKEN, args=args) as running:
        yield running


def _anthropic_body() -> bytes:
    body = {
        "model": "claude-x",
        "max_tokens": 100,
        "stream": True,
        "metadata": {"user_id": json.dumps({"session_id": SESSION})},
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello  there"}]}],
    }
    return json.dumps(body, indent=1).encode()  # odd spacing: relayed as it came, not re-encoded


def test_a_claude_code_call_passes_byte_for_byte_and_its_usage_is_counted(
    serve: Serve, models: tuple[AnthropicModel, ResponsesModel]
) -> None:
    anthropic, _responses = models
    anthropic.add(
        Turn(
            text="hi",
            calls=(Call("toolu_1", "Bash", {"command": "ls"}),),
            usage=Usage(120, 30, 4000, 50),
        )
    )
    body = _anthropic_body()
    headers = {
        "x-api-key": KEY,
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "context-management-2025-06-27",
        "X-Claude-Code-Session-Id": SESSION,
        "X-Sessionfold-Token": TOKEN,
        "Content-Type": "application/json",
    }
    with httpx.Client(timeout=30) as client:
        with client.stream(
            "POST", f"{serve.url}/v1/messages?beta=true", content=body, headers=headers
        ) as answer:
            assert answer.status_code == 200
            assert answer.headers["content-type"].startswith("text/event-stream")
            streamed = b"".join(answer.iter_raw())
        usage = client.get(
            f"{serve.url}/gateway/sessions/{SESSION}",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ).json()
        metrics = client.get(f"{serve.url}/metrics").text
    (seen,) = anthropic.requests
    assert seen.path == "/v1/messages?beta=true"
    assert seen.raw == body
    assert seen.headers["x-api-key"] == KEY
    assert seen.headers["anthropic-beta"] == "context-management-2025-06-27"
    assert "x-sessionfold-token" not in seen.headers
    assert b"event: message_start" in streamed and b'"toolu_1"' in streamed
    assert usage == {"calls": 1, "input": 120, "cache_read": 4000, "cache_write": 50, "output": 30}
    assert 'sessionfold_gateway_calls_total{api="anthropic",outcome="answered"} 1.0' in metrics
    assert 'sessionfold_gateway_tokens_total{api="anthropic",part="cache_read"} 4000.0' in metrics
    err = serve.stop()
    assert KEY.encode() not in err and b"hello" not in err


def test_a_codex_call_is_relayed_and_named_by_its_turn_metadata(
    serve: Serve, models: tuple[AnthropicModel, ResponsesModel]
) -> None:
    _anthropic, responses = models
    responses.add(Turn(text="done", usage=Usage(900, 20, 300)))
    body = json.dumps({"model": "m", "stream": True, "input": [], "prompt_cache_key": "x"})
    turn = json.dumps({"session_id": SESSION, "turn_id": "t1", "request_kind": "turn"})
    headers = {
        "Authorization": f"Bearer {KEY}",
        "x-codex-turn-metadata": turn,
        "X-Sessionfold-Token": TOKEN,
        "Content-Type": "application/json",
    }
    with httpx.Client(timeout=30) as client:
        answer = client.post(f"{serve.url}/v1/responses", content=body, headers=headers)
        assert answer.status_code == 200 and b"response.completed" in answer.content
        models_answer = client.get(f"{serve.url}/v1/models", headers=headers)
        usage = client.get(
            f"{serve.url}/gateway/sessions/{SESSION}",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ).json()
    assert models_answer.status_code == 200
    first = responses.requests[0]
    assert first.path == "/v1/responses" and first.raw == body.encode()
    assert first.headers["authorization"] == f"Bearer {KEY}"
    assert usage == {"calls": 2, "input": 600, "cache_read": 300, "cache_write": 0, "output": 20}
    assert KEY.encode() not in serve.stop()


def test_without_serves_token_a_call_is_refused_and_never_sent(
    serve: Serve, models: tuple[AnthropicModel, ResponsesModel]
) -> None:
    anthropic, _responses = models
    with httpx.Client(timeout=30) as client:
        answer = client.post(
            f"{serve.url}/v1/messages", content=_anthropic_body(), headers={"x-api-key": KEY}
        )
    assert answer.status_code == 401
    assert answer.json()["type"] == "error"
    assert anthropic.requests == []


def test_an_upstream_that_does_not_answer_is_a_502_in_the_apis_shape(tmp_path: Path) -> None:
    (tmp_path / "sessions").mkdir()
    nowhere = f"http://127.0.0.1:{free_port_pair()}"
    args = ["--anthropic-upstream", nowhere, "--openai-upstream", nowhere]
    with serving(tmp_path / "sessions", TOKEN, args=args) as serve, httpx.Client() as client:
        headers = {"X-Sessionfold-Token": TOKEN, "x-api-key": KEY}
        anthropic = client.post(f"{serve.url}/v1/messages", content=b"{}", headers=headers)
        openai = client.post(f"{serve.url}/v1/responses", content=b"{}", headers=headers)
        err = serve.stop()
    assert anthropic.status_code == 502 and anthropic.json()["type"] == "error"
    assert openai.status_code == 502 and "error" in openai.json()
    assert KEY.encode() not in err
