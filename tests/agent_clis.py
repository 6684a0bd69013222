"""Running the real Claude Code and Codex CLIs in tests, and folding what they wrote.

Not a test module: tests/e2e imports it. The CLIs come from integrations/agents (npm ci there;
`.ci/run` does it). Each run gets a home of its own under the test's tmp dir, with the settings
that keep the CLI's traffic on 127.0.0.1 (reference/agent-clis.md, "Keeping the CLIs quiet in
tests"). Folding goes through the sessionfold CLI, in a subprocess, as a user would run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / "integrations" / "agents" / "node_modules" / ".bin"
CLAUDE = BIN / "claude"
CODEX = BIN / "codex"
SESSIONFOLD = [sys.executable, "-m", "sessionfold.streams.cli"]
#: A CLI run against a local scripted model takes seconds; this bounds a hung one.
RUN_TIMEOUT_S = 120


def _base_env(home: Path) -> dict[str, str]:
    """A minimal environment: no proxies, keys or config of the developer's leak in."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


def claude_env(home: Path, base_url: str) -> dict[str, str]:
    """Claude Code against `base_url`, config under `home/.claude`, non-essential traffic off."""
    env = _base_env(home)
    env.update(
        CLAUDE_CONFIG_DIR=str(home / ".claude"),
        ANTHROPIC_BASE_URL=base_url,
        ANTHROPIC_API_KEY="sk-scripted",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    return env


def run_claude(
    work: Path, env: dict[str, str], prompt: str, *extra: str, tools: Sequence[str] = ("Bash",)
) -> dict[str, Any]:
    """`claude -p PROMPT --allowedTools TOOLS --output-format json` in `work`; its JSON
    result."""
    allowed = ["--allowedTools", *tools]
    args = [str(CLAUDE), "-p", prompt, *extra, *allowed, "--output-format", "json"]
    done = subprocess.run(
        args,
        cwd=work,
        env=env,
        capture_output=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    # stderr may hold tool output: only its size goes in the message.
    assert done.returncode == 0, f"claude exited {done.returncode} ({len(done.stderr)} B stderr)"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def claude_transcript(home: Path, session: str) -> Path:
    """Where Claude Code wrote the session (`projects/<cwd with "-" for "/">/<id>.jsonl`)."""
    (found,) = (home / ".claude" / "projects").glob(f"*/{session}.jsonl")
    return found


def codex_config(codex_home: Path, base_url: str, auto_compact: int | None = None) -> None:
    """config.toml: the scripted provider at `base_url` (`.../v1`), and nothing else reached."""
    limit = f"model_auto_compact_token_limit = {auto_compact}\n" if auto_compact else ""
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        'model = "scripted"\n'
        'model_provider = "local"\n'
        "check_for_update_on_startup = false\n"
        f"{limit}"
        "\n[model_providers.local]\n"
        'name = "local"\n'
        f'base_url = "{base_url}"\n'
        'wire_api = "responses"\n'
        'env_key = "LOCAL_KEY"\n'
        "\n[analytics]\nenabled = false\n"
        "\n[features]\nplugins = false\napps = false\n"
    )


def codex_env(home: Path) -> dict[str, str]:
    """Codex with its home at `home/.codex` (config written by `codex_config`)."""
    env = _base_env(home)
    env.update(CODEX_HOME=str(home / ".codex"), LOCAL_KEY="scripted")
    return env


def run_codex(work: Path, env: dict[str, str], *args: str) -> None:
    """`codex exec --skip-git-repo-check ARGS` in `work` (stdin closed: no extra input)."""
    command = [str(CODEX), "exec", "--skip-git-repo-check", *args]
    done = subprocess.run(
        command,
        cwd=work,
        env=env,
        capture_output=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"codex exited {done.returncode} ({len(done.stderr)} B stderr)"


def codex_rollout(home: Path) -> Path:
    """The one rollout Codex wrote under `home/.codex/sessions/YYYY/MM/DD/`."""
    (found,) = (home / ".codex" / "sessions").glob("*/*/*/rollout-*.jsonl")
    return found


def lines_of(path: Path) -> list[dict[str, Any]]:
    """A JSONL file's objects."""
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def sessionfold(*args: str) -> Any:
    """A sessionfold command's JSON output (it must exit 0)."""
    done = subprocess.run(
        [*SESSIONFOLD, *args], capture_output=True, timeout=120, check=False, cwd=REPO
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return json.loads(done.stdout)


def context_of(path: Path) -> list[dict[str, Any]]:
    """`sessionfold context FILE --format json`, pruning off: the messages as the file holds
    them, which is what the agent sent its model."""
    view = sessionfold("context", str(path), "--format", "json", "--set", "enabled=false")
    messages: list[dict[str, Any]] = view["messages"]
    return messages


def ledger_of(path: Path) -> dict[str, Any]:
    """`sessionfold ledger FILE --json`."""
    ledger: dict[str, Any] = sessionfold("ledger", str(path), "--json")
    return ledger


def text_of(message: dict[str, Any]) -> str:
    """A message's text blocks, joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(
        b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text"
    )


def calls_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    """An assistant message's toolCall blocks."""
    content = message.get("content")
    return [b for b in content or [] if isinstance(b, dict) and b.get("type") == "toolCall"]


def pairing_problems(messages: list[dict[str, Any]]) -> list[str]:
    """What breaks "every call is answered by exactly one result, after its assistant message
    and before the next one" in a rendered context (empty when it holds)."""
    problems: list[str] = []
    open_calls: set[str] = set()
    answered: dict[str, int] = {}
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            problems += [f"{call} unanswered" for call in sorted(open_calls)]
            open_calls = {c["id"] for c in calls_of(message)}
            answered.update((call, 0) for call in open_calls)
        elif role == "toolResult":
            call = message.get("toolCallId")
            if call not in open_calls:
                problems.append(f"{call} answered outside its response")
            open_calls.discard(call)
            answered[call] = answered.get(call, 0) + 1
        elif open_calls:
            problems.append(f"{role} message between calls {sorted(open_calls)} and results")
    problems += [f"{call} unanswered" for call in sorted(open_calls)]
    problems += [f"{call} answered {n} times" for call, n in answered.items() if n > 1]
    return problems


def snapshot(path: Path, to: Path) -> Path:
    """A copy of the file as it stands now (the CLI appends to it on the next run)."""
    to.write_bytes(path.read_bytes())
    return to
