"""The real Claude Code (2.1.328) and Codex (0.169.0) CLIs with `sessionfold mcp` as an MCP
server: after tool rounds whose large outputs the fold summarized, the model calls the recall
tool with the ref `sessionfold context` shows for one of them, and its next request carries
that original output as the tool's result.

Claude Code gets the server from `--mcp-config` and names its session in the server's
environment (`CLAUDE_CODE_SESSION_ID`); Codex gets it from `[mcp_servers.sessionfold]` in
config.toml and names its session in each call's `_meta`. In the first two no serve runs
(nothing listens at SESSIONFOLD_SERVE_URL): the server folds the transcript itself. In the
other two, each agent goes through serve's gateway, the model recalls the ref of a stub the
gateway sent it, and serve answers the recall. Needs `npm ci` in integrations/agents; skipped
without it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agent_clis import (
    CLAUDE,
    CODEX,
    REPO,
    claude_env,
    claude_transcript,
    codex_config,
    codex_env,
    codex_rollout,
    run_claude,
    run_codex,
    sessionfold,
)
from scripted_models import AnthropicModel, Call, ResponsesModel, Turn, Usage
from serve_process import serving

from sessionfold.streams.tools.install.plans import CLAUDE_ALLOWED_TOOLS

pytestmark = [
    pytest.mark.skipif(
        not (CLAUDE.exists() and CODEX.exists()),
        reason="integrations/agents has no node_modules: run npm ci there",
    ),
    pytest.mark.slow,
]

#: The fold's settings, the same for `sessionfold context` and the server: no grace turns, so
#: the first rounds' batches are summarized by the third prompt.
SETTINGS = ["--set", "recoveryGraceTurns=0"]
SERVER_ENV = {"PYTHONPATH": str(REPO), "SESSIONFOLD_SERVE_URL": "http://127.0.0.1:9"}
STUB = re.compile(r"\[Summarized in pruner summary, ref `(t\d+)`")
ROUNDS = 3


def _seq(n: int) -> str:
    """What `seq N 3000` prints (the large output of round N)."""
    return "\n".join(str(i) for i in range(n, 3001))


def _stubbed_ref(transcript: Path, settings: list[str] = SETTINGS) -> tuple[str, str]:
    """A ref `sessionfold context` stubs in the transcript so far, and the call id it names."""
    view = sessionfold("context", str(transcript), "--format", "json", *settings)
    for message in view["messages"]:
        if message.get("role") != "toolResult":
            continue
        text = "".join(b.get("text", "") for b in message.get("content") or [])
        found = STUB.search(text)
        if found:
            return found.group(1), str(message["toolCallId"])
    raise AssertionError("the fold summarized no result")


def _rounds(agent: str, rounds: int) -> list[Turn]:
    """The model's script for `rounds` prompts: each a shell call printing `seq n 3000` (call
    ids `toolu_0{n}big` for Claude Code, `call_{n}big` for Codex), then a short answer."""
    script = []
    for n in range(1, rounds + 1):
        if agent == "claude-code":
            call = Call(f"toolu_0{n}big", "Bash", {"command": f"seq {n} 3000"})
        else:
            call = Call(f"call_{n}big", "exec_command", {"cmd": f"seq {n} 3000"})
        script += [Turn(calls=(call,), usage=Usage(100, 5)), Turn(text="read", usage=Usage(9, 2))]
    return script


def _codex_recall(ref: str) -> Call:
    """The model's call of the recall tool, as Codex names MCP tools (a namespace)."""
    return Call(
        "call_recall", "context_tree_query", {"toolCallIds": [ref]}, namespace="mcp__sessionfold"
    )


def _server_args(agent: str) -> list[str]:
    return ["-m", "sessionfold.streams.cli", "mcp", agent, *SETTINGS]


def _run_claude(
    work: Path, env: dict[str, str], config: Path | None, prompt: str, *extra: str
) -> str:
    """`claude -p PROMPT`: with `config`, the server from it and its tools allowed; without,
    what the settings say (as `sessionfold install` wrote them)."""
    if config is None:
        return str(run_claude(work, env, prompt, *extra)["session_id"])
    tools = ["Bash", *CLAUDE_ALLOWED_TOOLS]
    answer = run_claude(work, env, prompt, "--mcp-config", str(config), *extra, tools=tools)
    return str(answer["session_id"])


def _tool_result(request: Any, call_id: str) -> str:
    """The text of the tool_result for `call_id` in one Anthropic request."""
    for message in request.body.get("messages", []):
        for block in message.get("content") if isinstance(message.get("content"), list) else []:
            if block.get("type") == "tool_result" and block.get("tool_use_id") == call_id:
                body = block.get("content")
                if isinstance(body, str):
                    return body
                return "".join(b.get("text", "") for b in body if b.get("type") == "text")
    raise AssertionError(f"no result for {call_id}")


def test_claude_code_recalls_a_summarized_output_over_mcp(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".claude").mkdir(parents=True)
    work.mkdir()
    config = tmp_path / "mcp.json"
    server = {"command": sys.executable, "args": _server_args("claude-code"), "env": SERVER_ENV}
    config.write_text(json.dumps({"mcpServers": {"sessionfold": server}}))
    script = _rounds("claude-code", ROUNDS)
    with AnthropicModel(script) as model:
        env = claude_env(home, model.url)
        session = _run_claude(work, env, config, "read the first")
        for n in range(2, ROUNDS + 1):
            _run_claude(work, env, config, f"read number {n}", "--resume", session)
        ref, call_id = _stubbed_ref(claude_transcript(home, session))
        recall = Call(
            "toolu_recall", "mcp__sessionfold__context_tree_query", {"toolCallIds": [ref]}
        )
        ledger = Call("toolu_ledger", "mcp__sessionfold__ledger", {})
        model.add(Turn(calls=(recall,)), Turn(calls=(ledger,)), Turn(text="recalled"))
        _run_claude(work, env, config, "recall it", "--resume", session)
        assert model.unscripted == [] and model.pending()["turn"] == 0
        turns = model.of_kind("turn")
    # The ledger tool: the commands with their ids, and what the user asked last.
    ledger_text = _tool_result(turns[-1], "toolu_ledger")
    for n in range(1, ROUNDS + 1):
        assert f"- C{n} exit 0: `seq {n} 3000`" in ledger_text
    assert "recall it" in ledger_text
    answer = _tool_result(turns[-2], "toolu_recall")
    n = int(call_id.removeprefix("toolu_0").removesuffix("big"))
    assert answer.startswith(f"## toolRef: {ref}\nTool: Bash\n")
    # The original output whole, as Claude Code sent it the first time.
    assert _seq(n) in answer and _tool_result(turns[2 * n - 1], call_id) in answer
    assert "[Page:" not in answer and "[Output truncated" not in answer


def _function_output(request: Any, call_id: str) -> str:
    """The text of the function_call_output for `call_id` in one Responses request."""
    for item in request.body.get("input", []):
        if item.get("type") == "function_call_output" and item.get("call_id") == call_id:
            output = item["output"]
            if isinstance(output, str):
                return output
            return "\n".join(part.get("text", "") for part in output)
    raise AssertionError(f"no output for {call_id}")


def test_codex_recalls_a_summarized_output_over_mcp(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    script = _rounds("codex", ROUNDS)
    with ResponsesModel(script) as model:
        codex_config(home / ".codex", f"{model.url}/v1")
        config = home / ".codex" / "config.toml"
        args = ", ".join(json.dumps(a) for a in _server_args("codex"))
        server_env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in SERVER_ENV.items())
        config.write_text(
            config.read_text() + "\n[mcp_servers.sessionfold]\n"
            f"command = {json.dumps(sys.executable)}\nargs = [{args}]\nenv = {{ {server_env} }}\n"
            # `codex exec` waits about a second for a server's tools, then asks the model
            # without them; the SDK's import alone takes longer on a loaded machine.
            "required = true\n"
        )
        env = codex_env(home)
        run_codex(work, env, "read the first")
        for n in range(2, ROUNDS + 1):
            run_codex(work, env, "resume", "--last", f"read number {n}")
        ref, call_id = _stubbed_ref(codex_rollout(home))
        recall = _codex_recall(ref)
        model.add(Turn(calls=(recall,)), Turn(text="recalled"))
        run_codex(work, env, "resume", "--last", "recall it")
        assert model.unscripted == [] and model.pending()["turn"] == 0
        turns = model.of_kind("turn")
    answer = _function_output(turns[-1], "call_recall")
    n = int(call_id.removeprefix("call_").removesuffix("big"))
    # The original as the log holds it: what Codex sent the model the first time (Codex cuts
    # a long exec output itself, in the middle).
    original = _function_output(turns[2 * n - 1], call_id)
    assert f"## toolRef: {ref}\nTool: exec_command\n" in answer
    assert original in answer and "Total output lines: 3000" in original
    assert "[Page:" not in answer and "[Output truncated" not in answer


def test_claude_code_recalls_the_stub_the_gateway_sent_from_serve(tmp_path: Path) -> None:
    """The whole loop: serve's gateway sends the model the fold's stubs; the model calls the
    recall tool with the ref of a stub in the request it got; the MCP server takes serve's
    answer (serve folds the same transcript), and the next request carries the original."""
    token = "mcp-e2e-token-0123456789abcdef"
    home, work = tmp_path / "home", tmp_path / "work"
    projects = home / ".claude" / "projects"
    projects.mkdir(parents=True)
    work.mkdir()
    script = _rounds("claude-code", ROUNDS)
    stubbed: dict[str, str] = {}  # the ref the model recalls -> the call its stub stands for

    def recall_a_stub(request: Any) -> dict[str, Any]:
        for message in request.body.get("messages", []):
            content = message.get("content")
            for block in content if isinstance(content, list) else []:
                if block.get("type") != "tool_result":
                    continue
                body = block.get("content")
                text = body if isinstance(body, str) else json.dumps(body)
                found = STUB.search(text)
                if found:
                    stubbed[found.group(1)] = block["tool_use_id"]
                    return {"toolCallIds": [found.group(1)]}
        raise AssertionError("the model got no stub")

    recall = Call("toolu_recall", "mcp__sessionfold__context_tree_query", recall_a_stub)
    script += [Turn(calls=(recall,)), Turn(text="recalled")]
    settings = [*SETTINGS, "--min-freed-tokens", "0"]
    with AnthropicModel(script) as model:
        with serving(projects, token, args=["--anthropic-upstream", model.url, *settings]) as serve:
            config = tmp_path / "mcp.json"
            server_env = {**SERVER_ENV, "SESSIONFOLD_SERVE_URL": serve.url}
            server_env["SESSIONFOLD_API_TOKEN"] = token
            # A setting the server's own fold refuses: the recall can only be serve's answer.
            args = [*_server_args("claude-code"), "--set", "noSuchSetting=1"]
            server = {"command": sys.executable, "args": args}
            server["env"] = server_env
            config.write_text(json.dumps({"mcpServers": {"sessionfold": server}}))
            env = claude_env(home, serve.url)
            env["ANTHROPIC_CUSTOM_HEADERS"] = f"X-Sessionfold-Token: {token}"
            session = _run_claude(work, env, config, "read the first")
            for prompt in ("read the second", "read the third", "recall it"):
                serve.folded(next(projects.glob(f"*/{session}.jsonl")))
                _run_claude(work, env, config, prompt, "--resume", session)
            err = serve.stop()
        assert model.unscripted == [] and model.pending()["turn"] == 0
        turns = model.of_kind("turn")
    ((ref, call_id),) = stubbed.items()
    answer = _tool_result(turns[-1], "toolu_recall")
    n = int(call_id.removeprefix("toolu_0").removesuffix("big"))
    assert answer.startswith(f"## toolRef: {ref}\nTool: Bash\n")
    assert _seq(n) in answer and _tool_result(turns[2 * n - 1], call_id) in answer
    assert b"Traceback" not in err


def test_codex_recalls_the_stub_the_gateway_sent_from_serve(tmp_path: Path) -> None:
    """As for Claude Code: Codex through serve's gateway, the model recalls the ref of a stub
    in the request it got, the MCP server (which names no session: Codex's `_meta` does)
    takes serve's answer, and the next request carries the original."""
    token = "mcp-e2e-token-0123456789abcdef"
    home, work = tmp_path / "home", tmp_path / "work"
    sessions = home / ".codex" / "sessions"
    sessions.mkdir(parents=True)
    work.mkdir()
    script = _rounds("codex", ROUNDS)
    stubbed: dict[str, str] = {}

    def recall_a_stub(request: Any) -> dict[str, Any]:
        for item in request.body.get("input", []):
            if item.get("type") != "function_call_output":
                continue
            output = item["output"]
            found = STUB.search(output if isinstance(output, str) else json.dumps(output))
            if found:
                stubbed[found.group(1)] = item["call_id"]
                return {"toolCallIds": [found.group(1)]}
        raise AssertionError("the model got no stub")

    recall = Call("call_recall", "context_tree_query", recall_a_stub, namespace="mcp__sessionfold")
    script += [Turn(calls=(recall,)), Turn(text="recalled")]
    settings = [*SETTINGS, "--min-freed-tokens", "0"]
    with ResponsesModel(script) as model:
        with serving(sessions, token, args=["--openai-upstream", model.url, *settings]) as serve:
            codex_config(home / ".codex", f"{serve.url}/v1")
            config = home / ".codex" / "config.toml"
            key = 'env_key = "LOCAL_KEY"\n'
            header = f'http_headers = {{ "X-Sessionfold-Token" = "{token}" }}\n'
            # A setting the server's own fold refuses: the recall can only be serve's answer.
            args = [*_server_args("codex"), "--set", "noSuchSetting=1"]
            server_env = {**SERVER_ENV, "SESSIONFOLD_SERVE_URL": serve.url}
            server_env["SESSIONFOLD_API_TOKEN"] = token
            pairs = ", ".join(f"{k} = {json.dumps(v)}" for k, v in server_env.items())
            config.write_text(
                config.read_text().replace(key, key + header) + "\n[mcp_servers.sessionfold]\n"
                f"command = {json.dumps(sys.executable)}\n"
                f"args = [{', '.join(json.dumps(a) for a in args)}]\n"
                f"env = {{ {pairs} }}\nrequired = true\n"
            )
            env = codex_env(home)
            run_codex(work, env, "read the first")
            for prompt in ("read the second", "read the third", "recall it"):
                serve.folded(next(sessions.glob("*/*/*/rollout-*.jsonl")))
                run_codex(work, env, "resume", "--last", prompt)
            err = serve.stop()
        assert model.unscripted == [] and model.pending()["turn"] == 0
        turns = model.of_kind("turn")
    ((ref, call_id),) = stubbed.items()
    answer = _function_output(turns[-1], "call_recall")
    n = int(call_id.removeprefix("call_").removesuffix("big"))
    assert f"## toolRef: {ref}\nTool: exec_command\n" in answer
    assert _function_output(turns[2 * n - 1], call_id) in answer
    assert b"Traceback" not in err


def test_codex_installed_by_sessionfold_install_recalls_over_mcp(tmp_path: Path) -> None:
    """`sessionfold install codex` and nothing by hand: Codex starts the server install wrote
    (waiting for it: `required`), in the CODEX_HOME install passed it, with the default
    settings, and the model's recall gets the original output."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    rounds = 6  # the default grace turns: the first rounds are summarized by the sixth
    script = _rounds("codex", rounds)
    with ResponsesModel(script) as model:
        codex_config(home / ".codex", f"{model.url}/v1")
        env = {**codex_env(home), "SESSIONFOLD_SERVE_URL": SERVER_ENV["SESSIONFOLD_SERVE_URL"]}
        installed = subprocess.run(
            [sys.executable, "-m", "sessionfold.streams.cli", "install", "codex", "--no-trust"],
            env={**env, "PYTHONPATH": str(REPO)},
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert installed.returncode == 0, installed.stderr
        run_codex(work, env, "read the first")
        for n in range(2, rounds + 1):
            run_codex(work, env, "resume", "--last", f"read number {n}")
        ref, call_id = _stubbed_ref(codex_rollout(home), [])
        recall = _codex_recall(ref)
        model.add(Turn(calls=(recall,)), Turn(text="recalled"))
        run_codex(work, env, "resume", "--last", "recall it")
        assert model.unscripted == [] and model.pending()["turn"] == 0
        turns = model.of_kind("turn")
    answer = _function_output(turns[-1], "call_recall")
    n = int(call_id.removeprefix("call_").removesuffix("big"))
    assert f"## toolRef: {ref}\nTool: exec_command\n" in answer
    assert _function_output(turns[2 * n - 1], call_id) in answer


def test_claude_code_installed_by_sessionfold_install_recalls_over_mcp(tmp_path: Path) -> None:
    """`sessionfold install claude-code` and nothing by hand: Claude Code starts the server
    from the user's `.claude.json`, may call its read-only tools (install allowed them), and
    the model's recall gets the original output, with the default settings."""
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".claude").mkdir(parents=True)
    work.mkdir()
    rounds = 6
    script = _rounds("claude-code", rounds)
    with AnthropicModel(script) as model:
        env = {**claude_env(home, model.url), **SERVER_ENV}
        installed = subprocess.run(
            [sys.executable, "-m", "sessionfold.streams.cli", "install", "claude-code"],
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert installed.returncode == 0, installed.stderr
        session = _run_claude(work, env, None, "read the first")
        for n in range(2, rounds + 1):
            _run_claude(work, env, None, f"read number {n}", "--resume", session)
        ref, call_id = _stubbed_ref(claude_transcript(home, session), [])
        recall = Call(
            "toolu_recall", "mcp__sessionfold__context_tree_query", {"toolCallIds": [ref]}
        )
        model.add(Turn(calls=(recall,)), Turn(text="recalled"))
        _run_claude(work, env, None, "recall it", "--resume", session)
        assert model.unscripted == [] and model.pending()["turn"] == 0
        turns = model.of_kind("turn")
    answer = _tool_result(turns[-1], "toolu_recall")
    n = int(call_id.removeprefix("toolu_0").removesuffix("big"))
    assert answer.startswith(f"## toolRef: {ref}\nTool: Bash\n")
    assert _seq(n) in answer
