"""The real Claude Code and Codex CLIs pointed at serve's gateway, which relays them to scripted
model servers: every prompt finishes, every request reaches the upstream with the agent's own
bytes and key, each session's usage is counted under its id, and neither key reaches serve's
log.

Claude Code carries serve's token in `ANTHROPIC_CUSTOM_HEADERS`, Codex in its provider's
`http_headers`: the way docs/live.md tells a user to. Needs `npm ci` in integrations/agents.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
from context_oracles import views_at_turns
from scripted_models import AnthropicModel, Call, Request, ResponsesModel, Turn, Usage
from serve_process import serving

from sessionfold.projections.pruning.config import build_config
from sessionfold.projections.views.rewrite import chain_plan, rewrite_plan

pytestmark = [
    pytest.mark.skipif(
        not (CLAUDE.exists() and CODEX.exists()),
        reason="integrations/agents has no node_modules: run npm ci there",
    ),
    pytest.mark.slow,
]

TOKEN = secrets.token_urlsafe(24)


def _codex_through(home: Path, serve_url: str) -> None:
    """Codex's provider at serve's gateway, serve's token in the provider's `http_headers`."""
    codex_config(home / ".codex", f"{serve_url}/v1")
    config = home / ".codex" / "config.toml"
    header = f'http_headers = {{ "X-Sessionfold-Token" = "{TOKEN}" }}\n'
    key = 'env_key = "LOCAL_KEY"\n'
    config.write_text(config.read_text().replace(key, key + header))


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
            _codex_through(home, serve.url)
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


def _results_sent(request: Any) -> dict[str, str]:
    """tool_use id -> the text of its tool_result, as one request carried it."""
    return _results_in(request.body.get("messages", []))


def _results_in(messages: list[Any]) -> dict[str, str]:
    """tool_use id -> the text of its tool_result, in these messages."""
    found: dict[str, str] = {}
    for message in messages:
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                body = block.get("content")
                found[block["tool_use_id"]] = body if isinstance(body, str) else json.dumps(body)
    return found


def test_claude_code_gets_the_folds_stubs_through_the_gateway(tmp_path: Path) -> None:
    """Three prompts, each reading a large output: once the first turns' batches are flushed,
    the model gets their results as the fold's stubs (with the summaries in them), the text
    `sessionfold context` computes for the file; the other results pass as the agent sent them;
    every prompt finishes."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    projects = home / ".claude" / "projects"
    projects.mkdir(parents=True)
    calls = [Call(f"toolu_0{n}big", "Bash", {"command": f"seq {n} 3000"}) for n in range(1, 4)]
    settings = ["--set", "recoveryGraceTurns=0", "--min-freed-tokens", "0"]
    with AnthropicModel(_reading_script(calls)) as model:
        args = ["--anthropic-upstream", model.url, *settings]
        with serving(projects, TOKEN, args=args) as serve:
            env = claude_env(home, serve.url)
            env["ANTHROPIC_CUSTOM_HEADERS"] = f"X-Sessionfold-Token: {TOKEN}"
            session = run_claude(work, env, "read the first")["session_id"]
            for prompt in ("read the second", "read the third"):
                serve.folded(next(projects.glob(f"*/{session}.jsonl")))
                run_claude(work, env, prompt, "--resume", session)
            err = serve.stop()
        assert model.unscripted == [] and model.pending()["turn"] == 0
        turns = model.of_kind("turn")
    transcript = next(projects.glob(f"*/{session}.jsonl"))
    stubbed = _assert_stubbed_as_planned(transcript, turns, calls, _results_sent)
    assert any("**Summarized tool refs**" in text for text in stubbed.values())  # the summary
    assert b"sk-scripted" not in err


def _call(calls: list[Call], call_id: str) -> Call:
    (found,) = [c for c in calls if c.id == call_id]
    return found


def _outputs_sent(request: Any) -> dict[str, str]:
    """call_id -> the output of its function_call_output, as one request carried it."""
    return {
        item["call_id"]: item["output"] if isinstance(item["output"], str) else str(item["output"])
        for item in request.body.get("input", [])
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


def _reading_script(calls: list[Call]) -> list[Turn]:
    """The model's script: each call's round (a large output to read), then a short answer."""
    script = []
    for call in calls:
        script += [Turn(calls=(call,), usage=Usage(100, 5)), Turn(text="read", usage=Usage(9, 2))]
    return script


def _assert_stubbed_as_planned(
    transcript: Path,
    turns: list[Request],
    calls: list[Call],
    sent: Callable[[Request], dict[str, str]],
) -> dict[str, str]:
    """The last request: the results the fold summarized carry its plan's text for the file
    (what `sessionfold context` computes), one at least; every other result as the agent sent
    it the first time (the request after its call ran). The stubbed ones, by call id."""
    config = build_config({"recoveryGraceTurns": 0})
    plan = rewrite_plan(list(views_at_turns(transcript, config, lambda _turn: False))[-1].view)
    last = sent(turns[-1])
    stubbed = {call: text for call, text in last.items() if text.startswith("[Summarized")}
    assert stubbed, "no result reached the model as a stub"
    assert all(plan.get(call) == text for call, text in stubbed.items())
    for call, text in last.items():
        if call not in stubbed:
            first = turns[2 * calls.index(_call(calls, call)) + 1]
            assert text == sent(first)[call]
    return stubbed


def test_codex_gets_the_folds_stubs_through_the_gateway(tmp_path: Path) -> None:
    """As for Claude Code: three prompts of one session (`codex exec resume --last`), each
    reading a large output; the last request carries the fold's stubs for the summarized
    results and the others as Codex sent them."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    sessions = home / ".codex" / "sessions"
    sessions.mkdir(parents=True)
    calls = [Call(f"call_{n}big", "exec_command", {"cmd": f"seq {n} 3000"}) for n in range(1, 4)]
    settings = ["--set", "recoveryGraceTurns=0", "--min-freed-tokens", "0"]
    with ResponsesModel(_reading_script(calls)) as model:
        args = ["--openai-upstream", model.url, *settings]
        with serving(sessions, TOKEN, args=args) as serve:
            _codex_through(home, serve.url)
            env = codex_env(home)
            run_codex(work, env, "read the first")
            for prompt in ("read the second", "read the third"):
                serve.folded(next(sessions.glob("*/*/*/rollout-*.jsonl")))
                run_codex(work, env, "resume", "--last", prompt)
            err = serve.stop()
        assert model.unscripted == [] and model.pending()["turn"] == 0
        turns = model.of_kind("turn")
    (rollout,) = sessions.glob("*/*/*/rollout-*.jsonl")
    _assert_stubbed_as_planned(rollout, turns, calls, _outputs_sent)
    assert b"Bearer scripted" not in err


# --- compressed chains: dropped whole ---------------------------------------------------------

#: Chains compress once a turn is older than the newest one (rollingWindow 1).
CHAIN_SETTINGS = [
    "--set",
    "recoveryGraceTurns=0",
    "--set",
    "chainCompression.rollingWindow=1",
    "--min-freed-tokens",
    "0",
]


def _chains_of_the_last_request(path: Path) -> list[dict[str, Any]]:
    """The compressed chains of the fold's plan when the script's last request went: at the
    end the fold has compressed turns 1-4; the last request, before turn 5's answer, had the
    plan of turns 1-3 (turn 4 was the one window turn then)."""
    config = build_config({"recoveryGraceTurns": 0, "chainCompression": {"rollingWindow": 1}})
    chains = chain_plan(list(views_at_turns(path, config, lambda _turn: False))[-1].view)[:-1]
    assert len(chains) == 3, "the fold compressed no chain"
    return chains


def _texts(value: Any) -> list[str]:
    """Every string inside a JSON value (the texts a request carries, wherever they sit)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _texts(v)]
    return []


def test_claude_code_gets_compressed_chains_dropped_through_the_gateway(tmp_path: Path) -> None:
    """Five prompts, each one round reading a large output: once the fold has compressed the
    older turns, the model's last request holds none of their calls or results, each chain's
    text (as `sessionfold context` renders it) follows its prompt, and every tool_use still has
    its tool_result in the next message; every prompt finished."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    projects = home / ".claude" / "projects"
    projects.mkdir(parents=True)
    calls = [Call(f"toolu_0{n}chain", "Bash", {"command": f"seq {n} 3000"}) for n in range(1, 6)]
    with AnthropicModel(_reading_script(calls)) as model:
        args = ["--anthropic-upstream", model.url, *CHAIN_SETTINGS]
        with serving(projects, TOKEN, args=args) as serve:
            env = claude_env(home, serve.url)
            env["ANTHROPIC_CUSTOM_HEADERS"] = f"X-Sessionfold-Token: {TOKEN}"
            session = run_claude(work, env, "read 1")["session_id"]
            for n in range(2, 6):
                serve.folded(next(projects.glob(f"*/{session}.jsonl")))
                run_claude(work, env, f"read {n}", "--resume", session)
            err = serve.stop()
        assert model.unscripted == [] and model.pending()["turn"] == 0
        last = model.of_kind("turn")[-1].body
    assert b"went upstream unchanged" not in err, err.decode()[-3000:]  # no fail-open
    chains = _chains_of_the_last_request(next(projects.glob(f"*/{session}.jsonl")))
    dropped = {call for chain in chains for call in chain["calls"]}
    uses = [
        b["id"]
        for m in last["messages"]
        for b in (m["content"] if isinstance(m["content"], list) else [])
        if b.get("type") == "tool_use"
    ]
    assert uses and not dropped & set(uses)
    assert not dropped & set(_results_in(last["messages"]))
    texts = _texts(last["messages"])
    assert all(chain["text"] in texts for chain in chains)
    for n, message in enumerate(last["messages"]):  # the API's pairing
        if message["role"] == "assistant" and isinstance(message["content"], list):
            ids = {b["id"] for b in message["content"] if b.get("type") == "tool_use"}
            answered = set(_results_in(last["messages"][n + 1 : n + 2]))
            assert ids == answered or (not ids and not answered)


def test_codex_gets_compressed_chains_dropped_through_the_gateway(tmp_path: Path) -> None:
    """As for Claude Code, with `codex exec resume --last`: the last request holds no call or
    output of a compressed chain, the chain's text is a user message after its prompt, and each
    call left has its output."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    sessions = home / ".codex" / "sessions"
    sessions.mkdir(parents=True)
    calls = [Call(f"call_{n}chain", "exec_command", {"cmd": f"seq {n} 3000"}) for n in range(1, 6)]
    with ResponsesModel(_reading_script(calls)) as model:
        args = ["--openai-upstream", model.url, *CHAIN_SETTINGS]
        with serving(sessions, TOKEN, args=args) as serve:
            _codex_through(home, serve.url)
            env = codex_env(home)
            run_codex(work, env, "read 1")
            for n in range(2, 6):
                serve.folded(next(sessions.glob("*/*/*/rollout-*.jsonl")))
                run_codex(work, env, "resume", "--last", f"read {n}")
            err = serve.stop()
        assert model.unscripted == [] and model.pending()["turn"] == 0
        last = model.of_kind("turn")[-1].body
    (rollout,) = sessions.glob("*/*/*/rollout-*.jsonl")
    assert b"went upstream unchanged" not in err, err.decode()[-3000:]  # no fail-open
    chains = _chains_of_the_last_request(rollout)
    dropped = {call for chain in chains for call in chain["calls"]}
    items = last["input"]
    named = {i.get("call_id") for i in items if isinstance(i, dict)}
    assert not dropped & named
    for chain in chains:
        (at,) = [n for n, i in enumerate(items) if chain["text"] in _texts(i)]
        assert items[at]["role"] == "user" and items[at - 1]["role"] == "user"
    made = [i["call_id"] for i in items if i.get("type") == "function_call"]
    answered = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    assert made and sorted(made) == sorted(answered)
