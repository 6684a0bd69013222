"""`sessionfold install` into a fresh home, then the real Claude Code (2.1.328) and Codex
(0.169) with nothing else configured by hand: after the agent's own compaction the model is sent
the standing rule verbatim and never the withdrawn one; with `--gateway` the agent's model
calls arrive at the URL install wrote, and with serve's API token set they pass its gateway.

The test home holds only what a test home needs (Codex: the scripted provider and the keys that
keep it off the network; Claude Code: its base URL in the environment) before install merges
into it. No serve runs but in the token tests: the hook folds the transcript itself
(embedded). `PYTHONPATH` makes this checkout the sessionfold the hook runs, as the console
script would. Only the model is scripted. Needs `npm ci` in integrations/agents; skipped
without it.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest
from agent_clis import (
    CLAUDE,
    CODEX,
    REPO,
    SESSIONFOLD,
    claude_env,
    claude_transcript,
    codex_config,
    codex_env,
    codex_rollout,
    lines_of,
    run_claude,
    run_codex,
)
from scripted_models import AnthropicModel, Call, Request, ResponsesModel, Turn, Usage
from serve_process import serving

pytestmark = [
    pytest.mark.skipif(
        not (CLAUDE.exists() and CODEX.exists()),
        reason="integrations/agents has no node_modules: run npm ci there",
    ),
    pytest.mark.slow,
]

KEPT = "never edit generated files"
WITHDRAWN = "always run the tests with -x"
PROMPTS = (KEPT, "forget the rule about -x", "run the tests")
NO_SERVE = "http://127.0.0.1:9"  # nothing listens: the hook folds the transcript itself
TOKEN = secrets.token_urlsafe(24)  # serve's API token, where a test runs serve


def _install(env: dict[str, str], *args: str, cwd: Path = REPO) -> str:
    """`sessionfold install ARGS` as the user would run it, in the agent's environment."""
    done = subprocess.run(
        [*SESSIONFOLD, "install", *args],
        env={**env, "PYTHONPATH": str(REPO)},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _strings(value: object) -> list[str]:
    """Every string in a request body."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _first_after_compaction(requests: list[Request]) -> Request:
    """The first turn request after the (one) compaction request."""
    kinds = [r.kind for r in requests]
    assert kinds.count("compaction") == 1, kinds
    return next(r for r in requests[kinds.index("compaction") :] if r.kind == "turn")


def _claude_turns() -> list[Turn]:
    return [
        Turn(text="Noted."),
        Turn(text="Noted too."),
        Turn(text="Dropped."),
        Turn(calls=(Call("toolu_01tests", "Bash", {"command": "echo 3 passed"}),)),
        Turn(calls=(Call("toolu_02lint", "Bash", {"command": "echo lint clean"}),)),
        Turn(text="Tests pass."),
        Turn(text="Continuing."),
    ]


CLAUDE_SUMMARY = Turn(
    text="<analysis>\nRan the tests.\n</analysis>\n\n<summary>\nThe user ran the tests; they "
    "passed.\n</summary>",
    usage=Usage(5000, 80),
)


def _claude_session(home: Path, work: Path, model: AnthropicModel, env: dict[str, str]) -> str:
    """Rules stated, one withdrawn, two tool rounds, `/compact`, one more prompt."""
    session: str = run_claude(work, env, WITHDRAWN)["session_id"]
    for prompt in (*PROMPTS, "/compact", "go on"):
        run_claude(work, env, prompt, "--resume", session)
    assert model.unscripted == []
    assert model.pending() == {"turn": 0, "compaction": 0}
    return session


def _claude_home(tmp_path: Path, base_url: str) -> tuple[Path, Path, dict[str, str]]:
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".claude").mkdir(parents=True)
    work.mkdir()
    env = claude_env(home, base_url)
    env.update(SESSIONFOLD_SERVE_URL=NO_SERVE, PYTHONPATH=str(REPO))
    return home, work, env


@pytest.mark.parametrize("scope", ["user", "project"])
def test_claude_code_installed_gets_the_rule_in_force_after_compact(
    tmp_path: Path, scope: str
) -> None:
    with AnthropicModel(_claude_turns(), [CLAUDE_SUMMARY]) as model:
        home, work, env = _claude_home(tmp_path, model.url)
        _install(env, "claude-code", "--scope", scope, cwd=work)
        session = _claude_session(home, work, model, env)
        requests = list(model.requests)
    where = home if scope == "user" else work
    settings = json.loads((where / ".claude" / "settings.json").read_text())
    # install wrote it (the hook, the recall tools allowed): nothing was configured by hand
    assert list(settings) == ["hooks", "permissions"]
    after = _first_after_compaction(requests)
    before = requests[: requests.index(after)]
    assert not any("sessionfold rule ledger" in r.raw.decode() for r in before)
    sent = "\n".join(_strings(after.body))
    assert "sessionfold rule ledger" in sent
    assert re.search(rf'^- R2 \(u2, entry [0-9a-f-]+\): "{KEPT}"$', sent, re.M)
    assert WITHDRAWN not in sent and "with -x" not in sent
    added = [
        line["attachment"]
        for line in lines_of(claude_transcript(home, session))
        if line.get("type") == "attachment"
        and line["attachment"].get("type") == "hook_additional_context"
    ]
    assert len(added) == 1 and KEPT in added[0]["content"][0]
    # Claude Code found the MCP server where install wrote it and started it (it gives the
    # model the server's instructions); a project's .mcp.json server waits for the user's
    # approval (listed as pending).
    attachments = [
        line["attachment"]
        for line in lines_of(claude_transcript(home, session))
        if line.get("type") == "attachment"
    ]
    started = any(
        a.get("type") == "mcp_instructions_delta" and "sessionfold" in a.get("addedNames", [])
        for a in attachments
    )
    pending = any("sessionfold" in (a.get("pendingMcpServers") or []) for a in attachments)
    assert started if scope == "user" else started or pending


def test_claude_code_with_a_broken_transcript_gets_nothing_and_goes_on(tmp_path: Path) -> None:
    turns = [Turn(text="Noted."), Turn(text="Noted too."), Turn(text="Continuing.")]
    with AnthropicModel(turns, [CLAUDE_SUMMARY]) as model:
        home, work, env = _claude_home(tmp_path, model.url)
        _install(env, "claude-code")
        session = run_claude(work, env, WITHDRAWN)["session_id"]
        run_claude(work, env, KEPT, "--resume", session)
        transcript = claude_transcript(home, session)
        # Broken for the hook: a first line of another format (a pi session header), so the
        # reader takes it for a pi session and none of Claude Code's lines are entries of it.
        header = {"type": "session", "version": 3, "id": "broken", "timestamp": "x", "cwd": "/"}
        transcript.write_bytes(json.dumps(header).encode() + b"\n" + transcript.read_bytes())
        debug = tmp_path / "compact-debug.log"
        run_claude(work, env, "/compact", "--resume", session, "--debug-file", str(debug))
        run_claude(work, env, "go on", "--resume", session)
        requests = list(model.requests)
        assert model.pending() == {"turn": 0, "compaction": 0}
    after = _first_after_compaction(requests)
    assert "sessionfold rule ledger" not in after.raw.decode(errors="replace")
    # The hook did run after the compaction (Claude Code's own debug log), and printed nothing.
    ran = re.search(
        r"Hooks: SessionStart:compact \[(.+ hook claude-code)\] finished with status 0",
        debug.read_text(),
    )
    assert ran and ran.group(1) == settings_hook(home)


def settings_hook(home: Path) -> str:
    """The hook command install wrote into Claude Code's settings."""
    settings = json.loads((home / ".claude" / "settings.json").read_text())
    command: str = settings["hooks"]["SessionStart"][0]["hooks"][0]["command"]
    return command


def test_claude_code_gateway_calls_arrive_at_the_url_install_wrote(tmp_path: Path) -> None:
    with AnthropicModel([Turn(text="Through serve's URL.")]) as model:
        home, work, env = _claude_home(tmp_path, model.url)
        del env["ANTHROPIC_BASE_URL"]  # only the settings install wrote point it there
        _install(env, "claude-code", "--gateway", "--serve-url", model.url)
        result = run_claude(work, env, "hello")
        assert result["result"] == "Through serve's URL."
        assert [r.kind for r in model.requests] == ["turn"]
        url = model.url
    settings = json.loads((home / ".claude" / "settings.json").read_text())
    assert settings["env"] == {"ANTHROPIC_BASE_URL": url}


def test_claude_code_gateway_calls_carry_the_token_install_wrote(tmp_path: Path) -> None:
    """serve with an API token: install reads it as serve does, and the real Claude Code's
    calls then pass serve's gateway (which takes the header off) to the model."""
    with AnthropicModel([Turn(text="Past serve's token check.")]) as model:
        home, work, env = _claude_home(tmp_path, model.url)
        del env["ANTHROPIC_BASE_URL"]
        args = ["--anthropic-upstream", model.url]
        with serving(home / ".claude" / "projects", TOKEN, args=args) as serve:
            _install(
                {**env, "SESSIONFOLD_API_TOKEN": TOKEN},
                "claude-code",
                "--gateway",
                "--serve-url",
                serve.url,
            )
            result = run_claude(work, env, "hello")
            err = serve.stop()
        assert result["result"] == "Past serve's token check."
        assert [r.kind for r in model.requests] == ["turn"]
        assert "x-sessionfold-token" not in model.requests[0].headers
    assert TOKEN.encode() not in err


# -- Codex -----------------------------------------------------------------------------------

AUTO_COMPACT = 50_000
BYPASS = "--dangerously-bypass-hook-trust"


def _codex_turns() -> list[Turn]:
    return [
        Turn(text="Noted."),
        Turn(text="Noted too."),
        Turn(text="Dropped."),
        Turn(calls=(Call("call_tests", "exec_command", {"cmd": "echo 3 passed"}),)),
        Turn(calls=(Call("call_lint", "exec_command", {"cmd": "echo lint clean"}),)),
        Turn(text="Tests pass.", usage=Usage(AUTO_COMPACT + 10_000, 20)),
        Turn(text="Continuing."),
    ]


CODEX_SUMMARY = Turn(text="The user ran the tests; they passed.", usage=Usage(5000, 80))


def _developer_texts(request: Request) -> list[str]:
    items: list[dict[str, Any]] = request.body.get("input", [])
    return [s for i in items if i.get("role") == "developer" for s in _strings(i.get("content"))]


def test_codex_installed_gets_the_rule_in_force_after_its_compaction(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    with ResponsesModel(_codex_turns(), [CODEX_SUMMARY]) as model:
        codex_config(home / ".codex", f"{model.url}/v1", auto_compact=AUTO_COMPACT)
        env = codex_env(home)
        env.update(SESSIONFOLD_SERVE_URL=NO_SERVE, PYTHONPATH=str(REPO))
        assert "trust" in _install(env, "codex", "--no-trust")
        run_codex(work, env, BYPASS, WITHDRAWN)
        for prompt in (*PROMPTS, "go on"):
            run_codex(work, env, BYPASS, "resume", "--last", prompt)
        assert model.unscripted == []
        assert model.pending() == {"turn": 0, "compaction": 0}
        requests = list(model.requests)
    after = _first_after_compaction(requests)
    sent = "\n".join(_developer_texts(after))
    assert "sessionfold rule ledger" in sent
    assert re.search(rf'^- R2 \(u2, entry [^)]+\): "{KEPT}"$', sent, re.M)
    assert WITHDRAWN not in sent and "with -x" not in sent
    before = requests[: requests.index(after)]
    assert not any("sessionfold rule ledger" in r.raw.decode() for r in before)
    assert codex_rollout(home).exists()


def test_codex_gateway_calls_arrive_at_the_url_install_wrote(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    with ResponsesModel([Turn(text="Through serve's URL.")]) as model:
        # The test home's provider points nowhere: only install's provider reaches the model.
        codex_config(home / ".codex", "http://127.0.0.1:9/v1")
        env = {**codex_env(home), "OPENAI_API_KEY": "scripted"}
        _install(env, "codex", "--gateway", "--serve-url", model.url, "--no-trust")
        run_codex(work, env, "hello")
        assert [r.kind for r in model.requests] == ["turn"]
        assert model.requests[0].path == "/v1/responses"


def test_codex_gateway_calls_carry_the_token_install_wrote(tmp_path: Path) -> None:
    """The same for Codex: its provider's `http_headers` carry serve's token (read here from a
    token file, as serve may), and its call passes the gateway to the model."""
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    with ResponsesModel([Turn(text="Past serve's token check.")]) as model:
        codex_config(home / ".codex", "http://127.0.0.1:9/v1")
        env = {**codex_env(home), "OPENAI_API_KEY": "scripted"}
        args = ["--openai-upstream", model.url]
        with serving(home / ".codex" / "sessions", TOKEN, args=args) as serve:
            install_env = {**env, "SESSIONFOLD_API_TOKEN_FILE": str(token_file)}
            _install(install_env, "codex", "--gateway", "--serve-url", serve.url, "--no-trust")
            run_codex(work, env, "hello")
            err = serve.stop()
        assert [r.kind for r in model.requests] == ["turn"]
        assert "x-sessionfold-token" not in model.requests[0].headers
    assert TOKEN.encode() not in err


def test_codex_with_damaged_lines_in_its_rollout_goes_on_and_gets_the_rule(
    tmp_path: Path,
) -> None:
    """Codex skips lines it cannot read, and so does the hook: the rule still comes back."""
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    turns = [
        Turn(text="Noted."),
        Turn(text="Noted too."),
        Turn(text="Dropped.", usage=Usage(AUTO_COMPACT + 10_000, 20)),
        Turn(text="Continuing."),
    ]
    with ResponsesModel(turns, [CODEX_SUMMARY]) as model:
        codex_config(home / ".codex", f"{model.url}/v1", auto_compact=AUTO_COMPACT)
        env = codex_env(home)
        env.update(SESSIONFOLD_SERVE_URL=NO_SERVE, PYTHONPATH=str(REPO))
        _install(env, "codex", "--no-trust")
        run_codex(work, env, BYPASS, WITHDRAWN)
        for prompt in PROMPTS[:2]:
            run_codex(work, env, BYPASS, "resume", "--last", prompt)
        rollout = codex_rollout(home)
        # Damaged lines between Codex's own: bytes that are not UTF-8, a torn JSON object.
        lines = rollout.read_bytes().splitlines(keepends=True)
        damage = b'\xff\xfe not a line\n{"type": "respo\n'
        rollout.write_bytes(lines[0] + damage + b"".join(lines[1:]))
        run_codex(work, env, BYPASS, "resume", "--last", "go on")
        requests = list(model.requests)
        assert model.unscripted == []
        assert model.pending() == {"turn": 0, "compaction": 0}
    sent = "\n".join(_developer_texts(_first_after_compaction(requests)))
    assert re.search(rf'^- R2 \(u2, entry [^)]+\): "{KEPT}"$', sent, re.M)
    assert WITHDRAWN not in sent and "with -x" not in sent


@pytest.mark.parametrize("trust", [True, False])
def test_codex_runs_the_hook_install_recorded_its_trust_of_without_the_bypass(
    tmp_path: Path, trust: bool
) -> None:
    """install asks Codex for the hook's hash and records the trust; Codex then runs the hook
    with no `--dangerously-bypass-hook-trust`. Without the trust it skips the hook."""
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    turns = [
        Turn(text="Noted."),
        Turn(text="Noted too.", usage=Usage(AUTO_COMPACT + 10_000, 20)),
        Turn(text="Continuing."),
    ]
    with ResponsesModel(turns, [CODEX_SUMMARY]) as model:
        codex_config(home / ".codex", f"{model.url}/v1", auto_compact=AUTO_COMPACT)
        env = codex_env(home)
        env.update(SESSIONFOLD_SERVE_URL=NO_SERVE, PYTHONPATH=str(REPO))
        out = _install(env, "codex", *(["--codex", str(CODEX)] if trust else ["--no-trust"]))
        assert ("trusted_hash" in out) == trust and ("note: Codex runs" in out) != trust
        run_codex(work, env, WITHDRAWN)
        run_codex(work, env, "resume", "--last", KEPT)
        run_codex(work, env, "resume", "--last", "go on")
        requests = list(model.requests)
        assert model.pending() == {"turn": 0, "compaction": 0}
    sent = "\n".join(_developer_texts(_first_after_compaction(requests)))
    assert ("sessionfold rule ledger" in sent) == trust
    if trust:
        assert re.search(rf'^- R2 \(u2, entry [^)]+\): "{KEPT}"$', sent, re.M)


def test_codex_uninstall_takes_out_the_trust_install_recorded(tmp_path: Path) -> None:
    home = tmp_path / "home"
    codex_config(home / ".codex", "http://127.0.0.1:9/v1")
    config = home / ".codex" / "config.toml"
    before = config.read_bytes()
    env = codex_env(home)
    out = _install(env, "codex", "--codex", str(CODEX))
    assert "trusted_hash" in out and 'trusted_hash = "sha256:' in config.read_text()
    assert "nothing to change" in _install(env, "codex", "--codex", str(CODEX))
    _install(env, "codex", "--uninstall")
    assert config.read_bytes() == before
    assert not (home / ".codex" / "hooks.json").exists()


def test_codex_project_scope_runs_the_projects_hook(tmp_path: Path) -> None:
    """`--scope project` writes the project's `.codex/`; Codex reads it once the user trusts
    the project (`[projects."<dir>"] trust_level = "trusted"`, the test home's own line)."""
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    turns = [
        Turn(text="Noted."),
        Turn(text="Noted too.", usage=Usage(AUTO_COMPACT + 10_000, 20)),
        Turn(text="Continuing."),
    ]
    with ResponsesModel(turns, [CODEX_SUMMARY]) as model:
        codex_config(home / ".codex", f"{model.url}/v1", auto_compact=AUTO_COMPACT)
        config = home / ".codex" / "config.toml"
        config.write_text(config.read_text() + f'\n[projects."{work}"]\ntrust_level = "trusted"\n')
        user_config = config.read_bytes()
        env = codex_env(home)
        env.update(SESSIONFOLD_SERVE_URL=NO_SERVE, PYTHONPATH=str(REPO))
        out = _install(env, "codex", "--scope", "project", "--codex", str(CODEX), cwd=work)
        assert "trusted_hash" in out
        assert (work / ".codex" / "hooks.json").exists()
        # The trust goes to the user's config (Codex ignores a project's trust of itself).
        assert 'trusted_hash = "sha256:' in config.read_text()
        assert "trusted_hash" not in (work / ".codex" / "config.toml").read_text()
        run_codex(work, env, WITHDRAWN)
        run_codex(work, env, "resume", "--last", KEPT)
        run_codex(work, env, "resume", "--last", "go on")
        requests = list(model.requests)
        assert model.pending() == {"turn": 0, "compaction": 0}
    sent = "\n".join(_developer_texts(_first_after_compaction(requests)))
    assert re.search(rf'^- R2 \(u2, entry [^)]+\): "{KEPT}"$', sent, re.M)
    _install(env, "codex", "--scope", "project", "--uninstall", cwd=work)
    assert config.read_bytes() == user_config
    assert not (work / ".codex" / "hooks.json").exists()
