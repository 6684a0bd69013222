"""`sessionfold hook`: what it prints after a compaction, what it never prints, how it fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sessionfold.projections.ledger.hook import hook_context
from sessionfold.streams.cli import COMMANDS, load_command
from sessionfold.streams.cli.hook import AgentCompactions, agent_summary, hook_output

REPO = Path(__file__).resolve().parents[2]
SESSION = "5e55a5e5-0000-4000-8000-000000000042"
KEPT = "never edit generated files"
WITHDRAWN = "always run the tests with -x"
SECRET = "the tests with -x"  # words that must not reach stderr


def _line(uuid: str, parent: str | None, kind: str, body: Any, **extra: Any) -> dict[str, Any]:
    line = {"parentUuid": parent, "isSidechain": False, "type": kind, "uuid": uuid}
    line.update(sessionId=SESSION, cwd="/work", timestamp=f"2026-12-06T06:00:{len(uuid):02d}Z")
    if kind in ("user", "assistant"):
        message: dict[str, Any] = {"role": kind, "content": body}
        if kind == "assistant":
            message.update(id=f"msg_{uuid}", type="message", model="m", stop_reason="end_turn")
        line["message"] = message
    return {**line, **extra}


def _transcript(tmp_path: Path, summary: str, compacted: bool = True) -> Path:
    """Two rules stated, one withdrawn, a command run, then (`compacted`) Claude Code's
    compaction: the boundary and the summary line."""
    prompts = [WITHDRAWN, KEPT, "forget the rule about -x", "run the tests"]
    lines, parent = [], None
    for n, prompt in enumerate(prompts):
        lines.append(_line(f"u{n}", parent, "user", prompt))
        answer: list[dict[str, Any]] = [{"type": "text", "text": "ok"}]
        if n == 3:
            call = {"command": "pytest -q"}
            answer = [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": call}]
        lines.append(_line(f"a{n}", f"u{n}", "assistant", answer))
        parent = f"a{n}"
    result = [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3 passed"}]
    lines.append(_line("r3", parent, "user", result))
    lines.append(_line("a4", "r3", "assistant", [{"type": "text", "text": "Tests pass."}]))
    if compacted:
        meta = {"trigger": "manual", "preTokens": 100}
        lines.append(
            _line(
                "b1", None, "system", None, subtype="compact_boundary", logicalParentUuid="a4",
                content="Conversation compacted", compactMetadata=meta,
            )
        )  # fmt: skip
        lines.append(_line("s1", "b1", "user", summary, isCompactSummary=True))
    path = tmp_path / f"{SESSION}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _input(path: Path, source: str = "compact", event: str = "SessionStart") -> bytes:
    data = {"session_id": SESSION, "transcript_path": str(path), "cwd": "/work"}
    data.update(hook_event_name=event, source=source, model="m")
    return json.dumps(data).encode()


@pytest.fixture(autouse=True)
def _no_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """No serve on this port: every test folds the transcript itself."""
    monkeypatch.setenv("SESSIONFOLD_SERVE_URL", "http://127.0.0.1:9")


def _context(output: str | None) -> str:
    assert output is not None
    data = json.loads(output)
    assert data["hookSpecificOutput"]["hookEventName"] == "SessionStart"
    context: str = data["hookSpecificOutput"]["additionalContext"]
    return context


def test_after_a_compaction_the_rule_in_force_is_given_verbatim_with_its_id(
    tmp_path: Path,
) -> None:
    context = _context(hook_output("claude-code", _input(_transcript(tmp_path, "Ran tests."))))
    assert f'R2 (u2, entry u1): "{KEPT}"' in context
    assert "Last user request (u4): run the tests" in context
    assert "`pytest -q`" in context


def test_a_withdrawn_rule_is_never_given(tmp_path: Path) -> None:
    context = _context(hook_output("claude-code", _input(_transcript(tmp_path, "Ran tests."))))
    assert "-x" not in context
    assert "R1" not in context


def test_a_rule_the_agents_summary_quotes_word_for_word_is_named_by_id_only(
    tmp_path: Path,
) -> None:
    summary = "Summary:\nThe user said:   never edit\ngenerated files. Tests ran."
    path = _transcript(tmp_path, summary)
    assert agent_summary(path, "claude-code") == AgentCompactions(1, summary, False, "s1")
    context = _context(hook_output("claude-code", _input(path)))
    assert KEPT not in context
    assert "quoted word for word in the summary above: R2." in context


def test_resume_without_a_compaction_and_other_events_print_nothing(tmp_path: Path) -> None:
    path = _transcript(tmp_path, "", compacted=False)
    assert hook_output("claude-code", _input(path, source="resume")) is None
    assert hook_output("claude-code", _input(path, source="startup")) is None
    assert hook_output("claude-code", _input(path, event="UserPromptSubmit")) is None
    compacted = _transcript(tmp_path, "Ran tests.")
    assert KEPT in _context(hook_output("claude-code", _input(compacted, source="resume")))


def test_codex_compacted_message_is_the_agents_summary(tmp_path: Path) -> None:
    path = tmp_path / "rollout.jsonl"
    line = {"timestamp": "t", "type": "compacted", "payload": {"message": KEPT}}
    path.write_text(json.dumps({"type": "session_meta", "payload": {}}) + "\n" + json.dumps(line))
    assert agent_summary(path, "codex") == AgentCompactions(1, KEPT, False)
    assert agent_summary(path, "claude-code") == AgentCompactions()


def test_a_view_with_nothing_to_say_gives_no_context() -> None:
    assert hook_context(None) == ""
    assert hook_context({"rules": [], "commands": [], "spans": []}) == ""


def test_an_error_a_later_run_cleared_is_left_out() -> None:
    commands = [
        {"id": "C1", "command": "make", "exit": 2, "status": "failed", "error": "E1"},
        {"id": "C2", "command": "make  ", "exit": 0, "status": "ok"},
        {"id": "C3", "command": "lint", "exit": 1, "status": "failed", "error": "E2"},
    ]
    errors = [
        {"id": "E1", "tool": "bash", "command": "C1", "head": "make failed"},
        {"id": "E2", "tool": "bash", "command": "C3", "head": "lint failed"},
    ]
    context = hook_context({"rules": [], "commands": commands, "errors": errors})
    assert "E2 (bash, C3): lint failed" in context
    assert "E1" not in context and "C1" not in context
    assert "C2 exit 0: `make`" in context


def _run(stdin: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SESSIONFOLD_SERVE_URL": "http://127.0.0.1:9"}
    command = [sys.executable, "-m", "sessionfold.streams.cli", "hook", *args]
    return subprocess.run(command, input=stdin, capture_output=True, env=env, timeout=60)


@pytest.mark.parametrize(
    ("stdin", "agent", "error"),
    [
        (b"not json", "claude-code", "JSONDecodeError"),
        (b"[1, 2]", "codex", "HookInputError"),
        (b'{"hook_event_name": "SessionStart", "source": "compact"}', "codex", "HookInputError"),
        (None, "claude-code", "FileNotFoundError"),
        (None, "pi", "HookInputError"),
    ],
)
def test_a_failure_prints_nothing_exits_0_and_names_only_the_error_class(
    tmp_path: Path, stdin: bytes | None, agent: str, error: str
) -> None:
    if stdin is None:  # a transcript that is not there, whose path holds rule words
        stdin = _input(tmp_path / f"{SECRET}.jsonl")
    done = _run(stdin, agent)
    assert (done.returncode, done.stdout) == (0, b"")
    assert done.stderr.decode() == f"sessionfold hook: {error}\n"


def test_the_cli_prints_the_hook_output_and_nothing_on_stderr(tmp_path: Path) -> None:
    done = _run(_input(_transcript(tmp_path, "Ran tests.")), "claude-code")
    assert (done.returncode, done.stderr) == (0, b"")
    assert KEPT in _context(done.stdout.decode())


def test_help_lines_are_the_commands_own() -> None:
    for name, (_module, line) in COMMANDS.items():
        command = load_command(name)
        assert command.name == name
        assert command.get_short_help_str(limit=300) == line, name


def test_help_imports_no_kafka_aiohttp_faust_or_matplotlib() -> None:
    """`sessionfold --help` (and so every subcommand's start) stays free of heavy clients."""
    script = (
        "import sys\n"
        "sys.argv = ['sessionfold', '--help']\n"
        "from sessionfold.streams.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = {'faust', 'kafka', 'aiokafka', 'aiohttp', 'matplotlib', 'httpx', 'mcp'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy), file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, env=env, timeout=60, check=True
    )
    assert done.stderr.decode().strip() == "[]"


def test_a_compaction_not_written_yet_is_folded_to_the_transcripts_end(tmp_path: Path) -> None:
    """Claude Code 2.1.328 runs the hook before it writes the compaction's lines."""
    path = _transcript(tmp_path, "", compacted=False)
    context = _context(hook_output("claude-code", _input(path)))
    assert f'"{KEPT}"' in context and "-x" not in context
