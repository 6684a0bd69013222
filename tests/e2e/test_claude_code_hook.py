"""The real Claude Code CLI (2.1.328) with `sessionfold hook claude-code` as its SessionStart
hook: after `/compact` the model is sent the rule in force verbatim, never the withdrawn one.

The session states two standing rules, withdraws one, runs a command, compacts (the scripted
summary holds no rule), and is prompted once more. No serve runs: the hook folds the
transcript itself. Needs `npm ci` in integrations/agents; skipped without it.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from agent_clis import CLAUDE, REPO, claude_env, claude_transcript, lines_of, run_claude
from scripted_models import AnthropicModel, Call, Turn, Usage

pytestmark = [
    pytest.mark.skipif(
        not CLAUDE.exists(), reason="integrations/agents has no node_modules: run npm ci there"
    ),
    pytest.mark.slow,
]

KEPT = "never edit generated files"
WITHDRAWN = "always run the tests with -x"
TURNS = [
    Turn(text="Noted."),
    Turn(text="Noted too."),
    Turn(text="Dropped."),
    Turn(calls=(Call("toolu_01tests", "Bash", {"command": "echo 3 passed"}),)),
    Turn(text="Tests pass."),
    Turn(text="Continuing."),
]
SUMMARY = Turn(
    text="<analysis>\nRan the tests.\n</analysis>\n\n<summary>\nThe user ran the tests; they "
    "passed.\n</summary>",
    usage=Usage(5000, 80),
)


def _strings(value: object) -> list[str]:
    """Every string in a request body (the system prompt's texts, the messages' texts)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_after_compact_the_model_gets_the_rule_in_force_and_not_the_withdrawn_one(
    tmp_path: Path,
) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".claude").mkdir(parents=True)
    work.mkdir()
    hook = f"{shlex.quote(sys.executable)} -m sessionfold.streams.cli hook claude-code"
    command = {"type": "command", "command": f"PYTHONPATH={shlex.quote(str(REPO))} {hook}"}
    settings = {"hooks": {"SessionStart": [{"matcher": "compact", "hooks": [command]}]}}
    (home / ".claude" / "settings.json").write_text(json.dumps(settings))
    with AnthropicModel(TURNS, [SUMMARY]) as model:
        env = claude_env(home, model.url)
        env["SESSIONFOLD_SERVE_URL"] = "http://127.0.0.1:9"  # no serve: the hook folds
        session = run_claude(work, env, WITHDRAWN)["session_id"]
        for prompt in (KEPT, "forget the rule about -x", "run the tests", "/compact"):
            run_claude(work, env, prompt, "--resume", session)
        run_claude(work, env, "go on", "--resume", session)
        assert model.unscripted == []
        assert model.pending() == {"turn": 0, "compaction": 0}
        before = model.of_kind("turn")[:-1]
        after = model.of_kind("turn")[-1]
    # The summary request and every turn before the compaction were sent no hook context.
    assert not any("sessionfold rule ledger" in r.raw.decode() for r in before)
    sent = "\n".join(_strings(after.body))
    assert "sessionfold rule ledger" in sent
    # The rule in force, the user's words verbatim (JSON-quoted) with its id.
    assert re.search(r'^- R2 \(u2, entry [0-9a-f-]+\): "never edit generated files"$', sent, re.M)
    assert WITHDRAWN not in sent and "with -x" not in sent
    # Claude Code recorded that the hook ran and what it added (attachment lines).
    lines = lines_of(claude_transcript(home, session))
    added = [
        line["attachment"]
        for line in lines
        if line.get("type") == "attachment"
        and line["attachment"].get("type") == "hook_additional_context"
    ]
    assert len(added) == 1 and KEPT in added[0]["content"][0]
