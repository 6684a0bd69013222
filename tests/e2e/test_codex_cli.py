"""The real Codex CLI (0.169.0, pinned in integrations/agents) against a scripted Responses
model, and sessionfold folding the rollout it wrote.

One session, run once for the module: `codex exec` whose scripted rounds make two parallel
`exec_command` calls in one response, a failing command (exit 2), a large output
(`seq 1 20000`), a command still running when its call returns (polled with `write_stdin`
until it exits 3) and a final answer reporting more input tokens than
`model_auto_compact_token_limit`; then `codex exec resume --last`, which compacts first (the
request Codex marks `request_kind: "compaction"`, answered from the script) and then answers.
The tests fold the rollout as it stood before the resume and at the end, and check it against
the script and against what Codex sent the model.
Needs `npm ci` in integrations/agents (`.ci/run` does it); skipped without it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_clis import (
    CODEX,
    calls_of,
    codex_config,
    codex_env,
    codex_rollout,
    context_of,
    ledger_of,
    lines_of,
    pairing_problems,
    run_codex,
    snapshot,
    text_of,
)
from scripted_models import Call, Request, ResponsesModel, Turn, Usage

pytestmark = [
    pytest.mark.skipif(
        not CODEX.exists(), reason="integrations/agents has no node_modules: run npm ci there"
    ),
    pytest.mark.slow,
]


def _poll(request: Request) -> dict[str, Any]:
    """write_stdin's input: the session id the last exec output named (known only then)."""
    outputs = [i for i in request.body["input"] if i.get("type") == "function_call_output"]
    found = re.search(r"Process running with session ID (\d+)", str(outputs[-1]["output"]))
    assert found, "the running command's output names no session"
    return {"session_id": int(found.group(1)), "chars": "", "yield_time_ms": 10000}


PARALLEL = (
    Call("call_parallel_alpha", "exec_command", {"cmd": "echo alpha"}),
    Call("call_parallel_beta", "exec_command", {"cmd": "sleep 0.3; echo beta"}),
)
FAILING = Call("call_failing", "exec_command", {"cmd": "echo oops >&2; exit 2"})
LARGE = Call("call_large", "exec_command", {"cmd": "seq 1 20000"})
# Still running when its call returns (yield after 250 ms): the poll gets its exit code.
RUNNING = Call(
    "call_running", "exec_command", {"cmd": "sleep 1.5; echo late; exit 3", "yield_time_ms": 250}
)
POLL = Call("call_poll", "write_stdin", _poll)
AUTO_COMPACT = 50_000
ROUND = [
    Turn(text="Two at once.", calls=PARALLEL, usage=Usage(1000, 50, 200)),
    Turn(calls=(FAILING,), usage=Usage(1100, 21, 300)),
    Turn(calls=(LARGE,), usage=Usage(1200, 22, 400)),
    Turn(calls=(RUNNING,), usage=Usage(1250, 25, 400)),
    Turn(calls=(POLL,), usage=Usage(1280, 26, 400)),
    # More input than the auto-compaction limit: the next turn compacts first.
    Turn(text="All ran.", usage=Usage(AUTO_COMPACT + 10_000, 23, 500)),
]
SUMMARY = Turn(text="Ran echo twice, a failing command, seq and a slow one.", usage=Usage(5000, 80))
AFTER = Turn(text="Continuing after the summary.", usage=Usage(700, 24))


@dataclass
class Session:
    """What the module's run left: the rollout before the resume and at the end, the model."""

    before: Path
    after: Path
    model: ResponsesModel
    outputs: dict[str, str]  # call_id -> the function_call_output the model was sent


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """Run the CLI through the script once (fresh files every test run)."""
    root = tmp_path_factory.mktemp("codex")
    home, work = root / "home", root / "work"
    work.mkdir()
    with ResponsesModel([*ROUND, AFTER], [SUMMARY]) as model:
        codex_config(home / ".codex", f"{model.url}/v1", auto_compact=AUTO_COMPACT)
        env = codex_env(home)
        run_codex(work, env, "run the commands")
        rollout = codex_rollout(home)
        before = snapshot(rollout, root / "before-resume.jsonl")
        run_codex(work, env, "resume", "--last", "go on")
        assert model.unscripted == [], "the CLI sent requests the script did not expect"
        assert model.pending() == {"turn": 0, "compaction": 0}
        sent: dict[str, str] = {}
        for request in model.requests:
            for item in request.body.get("input", []):
                if item.get("type") == "function_call_output":
                    output = item["output"]
                    sent[item["call_id"]] = (
                        output if isinstance(output, str) else json.dumps(output)
                    )
        yield Session(before, snapshot(rollout, root / "end.jsonl"), model, sent)


def _result(messages: list[dict[str, Any]], call: str) -> dict[str, Any]:
    found = [m for m in messages if m.get("role") == "toolResult" and m.get("toolCallId") == call]
    assert len(found) == 1, f"{len(found)} results for {call}"
    return found[0]


def _cmd(call: Call) -> str:
    assert isinstance(call.input, dict)
    return str(call.input["cmd"])


def _command(ledger: dict[str, Any], call: str) -> dict[str, Any]:
    (found,) = [c for c in ledger["commands"] if c.get("call") == call]
    return found


def test_parallel_calls_are_each_answered_once_after_their_response(session: Session) -> None:
    messages = context_of(session.before)
    assert pairing_problems(messages) == []
    calls = [c["id"] for m in messages if m.get("role") == "assistant" for c in calls_of(m)]
    assert calls == [c.id for turn in ROUND for c in turn.calls]
    ids = {c.id for c in PARALLEL}
    (response,) = [m for m in messages if {c["id"] for c in calls_of(m)} == ids]
    assert text_of(response) == ROUND[0].text
    for call, printed in zip(PARALLEL, ("alpha", "beta"), strict=True):
        result = _result(messages, call.id)
        assert text_of(result) == session.outputs[call.id]
        assert text_of(result).endswith(f"\nOutput:\n{printed}\n")
        assert result["isError"] is False and result["details"]["exitCode"] == 0


def test_the_failing_command_is_an_error_with_its_exit_code(session: Session) -> None:
    messages = context_of(session.before)
    result = _result(messages, FAILING.id)
    assert text_of(result) == session.outputs[FAILING.id]
    assert "Process exited with code 2\n" in text_of(result)
    assert result["isError"] is True and result["details"]["exitCode"] == 2
    row = _command(ledger_of(session.before), FAILING.id)
    assert (row["command"], row["status"], row["exit"]) == (_cmd(FAILING), "failed", 2)
    assert row["error"] is not None


def test_a_large_output_is_the_truncated_text_the_model_saw(session: Session) -> None:
    messages = context_of(session.before)
    result = _result(messages, LARGE.id)
    assert text_of(result) == session.outputs[LARGE.id]
    assert "Total output lines: 20000\n" in text_of(result)
    assert text_of(result).endswith("\n19999\n20000\n")
    assert result["isError"] is False and result["details"]["exitCode"] == 0
    row = _command(ledger_of(session.before), LARGE.id)
    assert (row["command"], row["status"], row["exit"]) == (_cmd(LARGE), "ok", 0)


def test_a_polled_command_gets_the_exit_code_its_poll_saw(session: Session) -> None:
    messages = context_of(session.before)
    started = _result(messages, RUNNING.id)
    assert "Process running with session ID" in text_of(started)
    assert "exitCode" not in started.get("details", {})  # not known when the call returned
    polled = _result(messages, POLL.id)
    assert "Process exited with code 3\n" in text_of(polled)
    assert polled["isError"] is True and polled["details"]["exitCode"] == 3
    ledger = ledger_of(session.before)
    row = _command(ledger, RUNNING.id)
    assert (row["command"], row["status"], row["exit"]) == (_cmd(RUNNING), "failed", 3)
    # One error, the command's: the poll is not a command of its own, nor an error without one.
    commands = {c["id"]: c for c in ledger["commands"]}
    errors = [commands.get(e["command"], {}).get("call") for e in ledger["errors"]]
    assert sorted(errors) == sorted([FAILING.id, RUNNING.id])


def test_usage_per_response_is_what_the_model_reported(session: Session) -> None:
    messages = context_of(session.before)
    got = [m.get("usage") for m in messages if m.get("role") == "assistant"]
    # OpenAI's input count includes the cached tokens; pi's does not.
    want = [
        {
            "input": t.usage.input - t.usage.cache_read,
            "output": t.usage.output,
            "cacheRead": t.usage.cache_read,
            "totalTokens": t.usage.input + t.usage.output,
        }
        for t in ROUND
    ]
    assert [{k: u[k] for k in want[0]} if u else None for u in got] == want


def test_the_compaction_is_folded_with_the_scripted_summary(session: Session) -> None:
    (request,) = session.model.of_kind("compaction")
    assert request.turn is SUMMARY
    meta = json.loads(request.headers["x-codex-turn-metadata"])
    assert meta["request_kind"] == "compaction"
    compacted = [line for line in lines_of(session.after) if line.get("type") == "compacted"]
    assert len(compacted) == 1 and compacted[0]["payload"]["message"].endswith(SUMMARY.text)
    messages = context_of(session.after)
    assert messages[0]["role"] == "compactionSummary"
    assert messages[0]["summary"].endswith(SUMMARY.text)
    # The compaction replaced every call and output; the prompt it kept is still there.
    assert not any(m.get("role") == "toolResult" or calls_of(m) for m in messages)
    assert any(text_of(m) == "run the commands" for m in messages)
    answers = [m for m in messages if m.get("role") == "assistant"]
    assert [text_of(m) for m in answers] == [AFTER.text]
    assert answers[0]["usage"]["output"] == AFTER.usage.output
    assert [text_of(m) for m in messages if m.get("role") == "user"][-1] == "go on"
