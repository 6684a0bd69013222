"""The real Claude Code and Codex CLIs pointed at serve's gateway, which relays them to scripted
model servers: every prompt finishes, every request reaches the upstream with the agent's own
bytes and key, each session's usage is counted under its id, and neither key reaches serve's
log.

Claude Code carries serve's token in `ANTHROPIC_CUSTOM_HEADERS`, Codex in its provider's
`http_headers`: the way docs/live.md tells a user to. Needs `npm ci` in integrations/agents.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx
import pytest
from agent_clis import (
    CLAUDE,
    CODEX,
    claude_env,
    codex_config,
    codex_env,
    run_claude,
    run_codex,
)
from scripted_models import AnthropicModel, Call, ResponsesModel, Turn, Usage
from serve_process import serving

pytestmark = [
    pytest.mark.skipif(
        not (CLAUDE.exists() and CODEX.exists()),
        reason="integrations/agents has no node_modules: run npm ci there",
    ),
    pytest.mark.slow,
]

TOKEN = secrets.token_urlsafe(24)


def _usage(url: str, session: str) -> dict[str, int]:
    answer = httpx.get(
        f"{url}/gateway/sessions/{session}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert answer.status_code == 200, answer.text
    found: dict[str, int] = answer.json()
    return found


def test_claude_code_through_the_gateway(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (tmp_path / "sessions").mkdir()
    script = [
        Turn(calls=(Call("toolu_01a", "Bash", {"command": "echo gateway"}),), usage=Usage(10, 5)),
        Turn(text="done", usage=Usage(20, 6, 300, 40)),
    ]
    with AnthropicModel(script) as model:
        args = ["--anthropic-upstream", model.url]
        with serving(tmp_path / "sessions", TOKEN, args=args) as serve:
            env = claude_env(home, serve.url)
            env["ANTHROPIC_CUSTOM_HEADERS"] = f"X-Sessionfold-Token: {TOKEN}"
            result = run_claude(work, env, "say it through the gateway")
            session = result["session_id"]
            usage = _usage(serve.url, session)
            err = serve.stop()
        turns = model.of_kind("turn")
        assert model.unscripted == [] and model.pending()["turn"] == 0
    assert len(turns) == 2 and all(t.headers["x-api-key"] == "sk-scripted" for t in turns)
    assert all("x-sessionfold-token" not in t.headers for t in turns)
    assert all(t.headers["x-claude-code-session-id"] == session for t in turns)
    assert usage["calls"] >= 2 and usage["cache_read"] == 300 and usage["cache_write"] == 40
    assert b"sk-scripted" not in err


def test_codex_through_the_gateway(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (tmp_path / "sessions").mkdir()
    script = [
        Turn(calls=(Call("call_a", "exec_command", {"cmd": "echo gateway"}),), usage=Usage(9, 4)),
        Turn(text="done", usage=Usage(30, 7, 12)),
    ]
    with ResponsesModel(script) as model:
        args = ["--openai-upstream", model.url]
        with serving(tmp_path / "sessions", TOKEN, args=args) as serve:
            codex_config(home / ".codex", f"{serve.url}/v1")
            config = home / ".codex" / "config.toml"
            text = config.read_text().replace(
                'env_key = "LOCAL_KEY"\n',
                f'env_key = "LOCAL_KEY"\nhttp_headers = {{ "X-Sessionfold-Token" = "{TOKEN}" }}\n',
            )
            config.write_text(text)
            run_codex(work, codex_env(home), "say it through the gateway")
            turns = model.of_kind("turn")
            session = turns[0].body["prompt_cache_key"]
            usage = _usage(serve.url, session)
            err = serve.stop()
        assert model.unscripted == [] and model.pending()["turn"] == 0
    assert len(turns) == 2 and all(t.headers["authorization"] == "Bearer scripted" for t in turns)
    assert all("x-sessionfold-token" not in t.headers for t in turns)
    assert usage["calls"] == 2 and usage["cache_read"] == 12 and usage["output"] == 11
    assert b"Bearer scripted" not in err
