"""The real Claude Code CLI (2.1.328, pinned in integrations/agents) against a scripted model,
and sessionfold folding the transcript it wrote.

One headless session, run once for the module: a prompt whose scripted rounds make two parallel
Bash calls in one response, a failing command (exit 2), a large output (`seq 1 20000`) and a
final answer; then `/compact` (the summary request answered from the script); then one more
prompt. The tests fold the transcript as it stood before the compaction and at the end, and
check it against the script and against what the CLI sent the model.
Needs `npm ci` in integrations/agents (`.ci/run` does it); skipped without it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_clis import (
    CLAUDE,
    calls_of,
    claude_env,
    claude_transcript,
    context_of,
    ledger_of,
    lines_of,
    pairing_problems,
    run_claude,
    snapshot,
    text_of,
)
from scripted_models import AnthropicModel, Call, Turn, Usage

pytestmark = [
    pytest.mark.skipif(
        not CLAUDE.exists(), reason="integrations/agents has no node_modules: run npm ci there"
    ),
    pytest.mark.slow,
]

PARALLEL = (
    Call("toolu_01parallelAlpha", "Bash", {"command": "echo alpha", "description": "first"}),
    # The sleep makes the second call finish last, so its result line is written last.
    Call("toolu_01parallelBeta", "Bash", {"command": "sleep 0.3; echo beta", "description": "b"}),
)
FAILING = Call("toolu_01failing", "Bash", {"command": "echo oops >&2; exit 2"})
LARGE = Call("toolu_01large", "Bash", {"command": "seq 1 20000"})
ROUND = [
    Turn(text="Two at once.", calls=PARALLEL, usage=Usage(1000, 50, 200, 30)),
    Turn(calls=(FAILING,), usage=Usage(1100, 21, 300, 40)),
    Turn(calls=(LARGE,), usage=Usage(1200, 22, 400, 50)),
    Turn(text="All three ran.", usage=Usage(1300, 23, 500, 60)),
]
SUMMARY_TEXT = "Ran echo twice, a failing command and seq."
# Claude Code asks for an <analysis> block and a <summary> block, and asks again without them.
SUMMARY = Turn(
    text=f"<analysis>\nThe user ran commands.\n</analysis>\n\n<summary>\n{SUMMARY_TEXT}\n"
    "</summary>",
    usage=Usage(5000, 80),
)
AFTER = Turn(text="Continuing after the summary.", usage=Usage(700, 24, 0, 70))
SEQ_OUTPUT = "".join(f"{n}\n" for n in range(1, 20001)).rstrip("\n")


@dataclass
class Session:
    """What the module's run left: the transcript before /compact and at the end, the model."""

    before: Path
    after: Path
    model: AnthropicModel
    results: dict[str, Any]  # tool_use id -> the tool_result block the model was sent


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """Run the CLI through the script once (fresh files every test run)."""
    root = tmp_path_factory.mktemp("claude-code")
    home, work = root / "home", root / "work"
    home.mkdir()
    work.mkdir()
    with AnthropicModel([*ROUND, AFTER], [SUMMARY]) as model:
        env = claude_env(home, model.url)
        first = run_claude(work, env, "run the three commands")
        session_id = first["session_id"]
        transcript = claude_transcript(home, session_id)
        before = snapshot(transcript, root / "before-compact.jsonl")
        run_claude(work, env, "/compact", "--resume", session_id)
        run_claude(work, env, "go on", "--resume", session_id)
        assert model.unscripted == [], "the CLI sent requests the script did not expect"
        assert model.pending() == {"turn": 0, "compaction": 0}
        sent: dict[str, Any] = {}
        for request in model.of_kind("turn"):
            for message in request.body.get("messages", []):
                content = message.get("content")
                for block in content if isinstance(content, list) else []:
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        sent[block["tool_use_id"]] = block
        yield Session(before, snapshot(transcript, root / "end.jsonl"), model, sent)


def _result(messages: list[dict[str, Any]], call: str) -> dict[str, Any]:
    found = [m for m in messages if m.get("role") == "toolResult" and m.get("toolCallId") == call]
    assert len(found) == 1, f"{len(found)} results for {call}"
    return found[0]


def _sent_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    return content if isinstance(content, str) else text_of({"content": content})


def _cmd(call: Call) -> str:
    assert isinstance(call.input, dict)
    return str(call.input["command"])


def _command(ledger: dict[str, Any], call: str) -> dict[str, Any]:
    (found,) = [c for c in ledger["commands"] if c.get("call") == call]
    return found


def test_parallel_calls_are_each_answered_once_after_their_response(session: Session) -> None:
    messages = context_of(session.before)
    assert pairing_problems(messages) == []
    calls = [c["id"] for m in messages if m.get("role") == "assistant" for c in calls_of(m)]
    assert calls == [c.id for turn in ROUND for c in turn.calls]
    assert text_of(_result(messages, PARALLEL[0].id)) == "alpha"
    assert text_of(_result(messages, PARALLEL[1].id)) == "beta"
    ledger = ledger_of(session.before)
    for call in PARALLEL:
        row = _command(ledger, call.id)
        assert (row["command"], row["status"], row["exit"]) == (_cmd(call), "ok", 0)


def test_the_failing_command_is_an_error_with_its_exit_code(session: Session) -> None:
    messages = context_of(session.before)
    result = _result(messages, FAILING.id)
    sent = session.results[FAILING.id]
    assert sent["is_error"] is True
    assert result["isError"] is True
    assert text_of(result) == _sent_text(sent)
    assert re.match(r"Exit code 2\b", text_of(result))
    row = _command(ledger_of(session.before), FAILING.id)
    assert row["command"] == _cmd(FAILING)
    assert (row["status"], row["exit"]) == ("failed", 2)
    assert row["error"] is not None


def test_a_large_output_is_the_stub_the_model_saw_and_the_file_holds_it_all(
    session: Session,
) -> None:
    messages = context_of(session.before)
    result = _result(messages, LARGE.id)
    seen = _sent_text(session.results[LARGE.id])
    assert text_of(result) == seen
    assert result["isError"] is False
    # Claude Code moved the output to a file beside the transcript and sent a preview.
    match = re.search(r"Full output saved to: (\S+)", seen)
    assert match, "no persisted-output stub"
    saved = Path(match.group(1))
    assert saved.parent.name == "tool-results"
    assert saved.read_text().rstrip("\n") == SEQ_OUTPUT
    row = _command(ledger_of(session.before), LARGE.id)
    assert (row["status"], row["exit"]) == ("ok", 0)


def test_usage_per_response_is_what_the_model_reported(session: Session) -> None:
    messages = context_of(session.before)
    got = [m.get("usage") for m in messages if m.get("role") == "assistant"]
    want = [
        {
            "input": t.usage.input,
            "output": t.usage.output,
            "cacheRead": t.usage.cache_read,
            "cacheWrite": t.usage.cache_write,
            "totalTokens": t.usage.input
            + t.usage.output
            + t.usage.cache_read
            + t.usage.cache_write,
        }
        for t in ROUND
    ]
    assert [{k: u[k] for k in want[0]} if u else None for u in got] == want


def test_the_compaction_is_folded_with_the_scripted_summary(session: Session) -> None:
    (request,) = session.model.of_kind("compaction")
    assert request.turn is SUMMARY
    boundary = [
        line
        for line in lines_of(session.after)
        if line.get("type") == "system" and line.get("subtype") == "compact_boundary"
    ]
    assert len(boundary) == 1 and boundary[0]["compactMetadata"]["trigger"] == "manual"
    messages = context_of(session.after)
    assert messages[0]["role"] == "compactionSummary"
    assert SUMMARY_TEXT in messages[0]["summary"]
    # Nothing the compaction replaced is in the context after it.
    assert not any(m.get("role") == "toolResult" for m in messages)
    last = [m for m in messages if m.get("role") == "assistant"][-1]
    assert text_of(last) == AFTER.text
    assert last["usage"]["input"] == AFTER.usage.input
    assert last["usage"]["output"] == AFTER.usage.output
    assert last["usage"]["cacheWrite"] == AFTER.usage.cache_write
    prompts = [text_of(m) for m in messages if m.get("role") == "user"]
    assert prompts[-1] == "go on"


def test_the_messages_the_compaction_kept_follow_its_summary(session: Session) -> None:
    """The model's first request after /compact had the summary, then the last answer kept
    (compactMetadata.preservedSegment), then the new prompt: the fold renders the same."""
    after = session.model.of_kind("turn")[-1].body["messages"]
    kept = [m for m in after if m.get("role") == "assistant"]
    assert [text_of(m) for m in kept] == [ROUND[-1].text]
    messages = context_of(session.after)
    answers = [text_of(m) for m in messages if m.get("role") == "assistant"]
    assert answers == [ROUND[-1].text, AFTER.text]
    kept_at = [text_of(m) for m in messages].index(ROUND[-1].text)
    prompt_at = [text_of(m) for m in messages].index("go on")
    assert messages[0]["role"] == "compactionSummary" and 0 < kept_at < prompt_at
