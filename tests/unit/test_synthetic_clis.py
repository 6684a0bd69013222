"""The Claude Code and Codex generators write what the current CLIs write (issue 38), and what
the readers make of their files agrees with what the lines say.

Expected values come from the source lines (the generator's numbers), never from the
translator; the readers' output is taken from the commands a user runs (`context --format
json`, `ledger --json`) or from the session file reader.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from claude_sessions import lines_of, source_counts, write_transcript
from hypothesis import example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sessionfold.events.envelope import EntryEnvelope
from sessionfold.projections.views.validity import problems
from sessionfold.streams.cli import app
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.tools.synthetic_claude import VERSION
from sessionfold.streams.tools.synthetic_codex import (
    GENERATIONS,
    generate_codex_session,
    write_codex_session,
)

#: Seeds and turns: short and long sessions, with and without a compaction.
CASES = [(3, 6), (11, 14), (29, 30)]
#: Lines CLI 2.1.328 writes with no uuid (docs/formats.md).
BOOKKEEPING = {
    "api-request-shape",
    "api-request-blob",
    "api-request",
    "tools-used",
    "atis-latch",
    "cost-state",
    "last-prompt",
    "mode",
    "queue-operation",
}


def _json(args: list[str]) -> Any:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{") :].rsplit("}", 1)[0] + "}")


def _context(path: Path) -> list[dict[str, Any]]:
    """The messages `sessionfold context` renders for the file, no pruning."""
    found = _json(["context", str(path), "--format", "json", "--set", "enabled=false"])
    messages: list[dict[str, Any]] = found["messages"]
    return messages


def _ledger_exits(path: Path) -> dict[str, Any]:
    """Each command's exit code in `sessionfold ledger --json`, by its call id."""
    found = _json(["ledger", str(path), "--json"])
    return {row["call"]: row["exit"] for row in found["commands"]}


def _assistants(path: Path) -> list[dict[str, Any]]:
    """The assistant messages the reader yields, in file order."""
    return [
        r.payload.entry["message"]
        for r in read_session_file(path)
        if isinstance(r, EntryEnvelope)
        and r.payload.entry.get("type") == "message"
        and r.payload.entry["message"]["role"] == "assistant"
    ]


def _counts(usage: dict[str, Any]) -> tuple[int, int, int, int]:
    return usage["input"], usage["output"], usage["cacheRead"], usage["cacheWrite"]


# --- Claude Code 2.1.328 -------------------------------------------------------------------


@pytest.mark.parametrize(("seed", "turns"), CASES)
def test_claude_transcript_has_the_current_clis_lines(
    tmp_path: Path, seed: int, turns: int
) -> None:
    """Attachments with and without rendered text, the bookkeeping lines with no uuid, and the
    assistant lines naming their request."""
    main = write_transcript(tmp_path, seed, turns)[0]
    lines = lines_of(main)
    assert {line["version"] for line in lines if "uuid" in line} == {VERSION}
    kinds = {line["attachment"]["type"] for line in lines if line["type"] == "attachment"}
    assert {"environment", "date", "session_context", "prompt_snapshot"} <= kinds
    rendered = [line for line in lines if line["type"] == "attachment" and "rendered" in line]
    assert rendered and all(line["renderedRole"] in ("system", "user") for line in rendered)
    unrendered = {
        line["attachment"]["type"]
        for line in lines
        if line["type"] == "attachment" and "rendered" not in line
    }
    assert unrendered == {"session_context", "prompt_snapshot"}
    loose = {line["type"] for line in lines if "uuid" not in line}
    assert loose | {"mode"} >= BOOKKEEPING and "api-request" in loose
    requests = {line["id"] for line in lines if line["type"] == "api-request"}
    refs = {line["requestRef"] for line in lines if line["type"] == "assistant"}
    assert refs == requests
    prompts = [line for line in lines if line["type"] == "last-prompt" and "leafUuid" in line]
    uuids = {line["uuid"] for line in lines if "uuid" in line}
    assert prompts and all(line["leafUuid"] in uuids for line in prompts)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), turns=st.integers(1, 10))
@example(seed=186, turns=8)
def test_claude_transcript_uuids_are_unique_and_read_clean(
    tmp_path_factory: pytest.TempPathFactory, seed: int, turns: int
) -> None:
    """No two lines share a uuid (the story reuses call ids across turns: `bash_1` twice), so
    the reader takes every line with no dead letter. Seed 186 repeated an interrupted result's."""
    main = write_transcript(tmp_path_factory.mktemp("claude"), seed, turns)[0]
    uuids = [line["uuid"] for line in lines_of(main) if "uuid" in line]
    assert len(uuids) == len(set(uuids))
    assert not [r for r in read_session_file(main) if isinstance(r, DeadLetter)]


def test_claude_compaction_keeps_the_last_answer_after_its_summary(tmp_path: Path) -> None:
    """The boundary's preserved segment names the last assistant line before it; the render
    sends that message right after the summary."""
    main = write_transcript(tmp_path, 29, 30)[0]
    lines = lines_of(main)
    at = next(n for n, line in enumerate(lines) if line.get("subtype") == "compact_boundary")
    segment = lines[at]["compactMetadata"]["preservedSegment"]
    before = [line for line in lines[:at] if line["type"] == "assistant"]
    assert segment["headUuid"] == segment["tailUuid"] == before[-1]["uuid"]
    assert segment["anchorUuid"] == lines[at + 1]["uuid"] and lines[at + 1]["isCompactSummary"]
    kept = before[-1]["message"]
    context = _context(main)
    assert context[0]["role"] == "compactionSummary"
    assert context[1]["role"] == "assistant"
    blocks = [b for b in context[1]["content"] if b["type"] in ("text", "toolCall")]
    last = kept["content"][0]
    if last["type"] == "tool_use":
        assert last["id"] in {b.get("id") for b in blocks}
    else:
        assert blocks[-1]["text"] == last["text"]


@pytest.mark.parametrize(("seed", "turns"), CASES)
def test_claude_render_pairs_calls_and_usage_is_the_generators(
    tmp_path: Path, seed: int, turns: int
) -> None:
    """Every call answered once right after its response; each response's usage as its lines
    state it; rendered attachments reach the context, hidden."""
    for path in write_transcript(tmp_path, seed, turns):
        context = _context(path)
        assert problems(context) == []
        source = source_counts(lines_of(path))
        assert source.usages is not None
        expected = [
            (u["input_tokens"], u["output_tokens"], u["cache_read_input_tokens"],
             u["cache_creation_input_tokens"])
            for u in source.usages.values()
        ]  # fmt: skip
        assert [_counts(m["usage"]) for m in _assistants(path)] == expected
        if "subagents" not in path.parts:
            assert source.attachments > 0
            hidden = [m for m in context if m.get("customType") == "x-claude-code.attachment"]
            assert hidden and all(m["display"] is False for m in hidden)


def test_claude_bash_exit_codes_in_the_ledger_are_the_generators(tmp_path: Path) -> None:
    """A failing Bash result states `Exit code N` first; the ledger reads that code."""
    main = write_transcript(tmp_path, 11, 14)[0]
    expected: dict[str, int] = {}
    calls = {
        b["id"]
        for line in lines_of(main)
        if line["type"] == "assistant"
        for b in line["message"]["content"]
        if b["type"] == "tool_use" and b["name"] == "Bash"
    }
    for line in lines_of(main):
        content = line.get("message", {}).get("content")
        for block in content if line["type"] == "user" and isinstance(content, list) else []:
            failed = str(block.get("content", "")).startswith("Exit code ")
            if block.get("tool_use_id") in calls and block.get("is_error") and failed:
                expected[block["tool_use_id"]] = int(block["content"].split()[2])
    exits = _ledger_exits(main)
    assert expected and {call: exits[call] for call in expected} == expected


# --- Codex ---------------------------------------------------------------------------------


def _records(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [line["payload"] for line in lines if line["type"] == kind]


def _events(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [p for p in _records(lines, "event_msg") if p.get("type") == kind]


def _commands(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """0.169's `item_completed` CommandExecution items, by the call that started each."""
    return {
        p["item"]["id"]: p["item"]
        for p in _events(lines, "item_completed")
        if p["item"]["type"] == "CommandExecution"
    }


@pytest.mark.parametrize(("seed", "turns"), [(3, 2), (11, 5), (29, 8)])
def test_codex_0169_rollout_has_the_current_clis_lines(seed: int, turns: int) -> None:
    """Ordinals from 0; per response its items, its usage record, the outputs (each command's
    item_completed before its output), then its token_count with the same numbers; unified
    exec outputs only; each running command polled by write_stdin to its exit."""
    lines = generate_codex_session(seed, turns)
    assert [line["ordinal"] for line in lines] == list(range(len(lines)))
    assert lines[0]["payload"]["cli_version"] == "0.169.0"
    names = {p.get("name") for p in _records(lines, "response_item")} - {None}
    assert "shell" not in names and "exec_command" in names
    completed = {p["item"]["type"] for p in _events(lines, "item_completed")}
    assert {"UserMessage", "AgentMessage", "CommandExecution"} <= completed
    records = [n for n, line in enumerate(lines) if line["type"] == "token_usage_record"]
    counts = [n for n, line in enumerate(lines) if line["payload"].get("type") == "token_count"]
    assert len(records) == len(counts)
    for record, count in zip(records, counts, strict=True):
        assert record < count
        assert set(lines[record]["payload"]["usage"]) == {
            "input_tokens", "cached_input_tokens", "cache_write_input_tokens", "output_tokens",
            "reasoning_output_tokens", "total_tokens",
        }  # fmt: skip
        usage = lines[count]["payload"]["info"]["last_token_usage"]
        assert usage == lines[record]["payload"]["usage"]
        between = [line["payload"].get("type") for line in lines[record + 1 : count]]
        assert not {"reasoning", "function_call", "message"} & set(between)
    commands = _commands(lines)
    for n, line in enumerate(lines):
        payload = line["payload"]
        if (
            payload.get("type") != "function_call_output"
            or "Process exited" not in (payload["output"])
        ):
            continue
        assert payload["output"].startswith("Chunk ID: ")
        previous = lines[n - 1]["payload"]
        assert previous["type"] == "item_completed"
        assert f"exited with code {previous['item']['exit_code']}\n" in payload["output"]
    for call in _records(lines, "response_item"):
        if call.get("name") == "exec_command":
            assert call["call_id"] in commands


def test_codex_running_commands_are_polled_to_their_exit() -> None:
    """Some seed runs a command past its yield time; the poll's arguments name its session."""
    polled = 0
    for seed in range(40):
        lines = generate_codex_session(seed, 4)
        items = _records(lines, "response_item")
        for n, payload in enumerate(items):
            output = payload.get("output", "")
            if "Process running with session ID" not in output:
                continue
            session = int(output.split("session ID ")[1].split()[0])
            poll = next(
                p for p in items[n:] if p.get("name") == "write_stdin"
                and json.loads(p["arguments"])["session_id"] == session
            )  # fmt: skip
            assert json.loads(poll["arguments"])["chars"] == ""
            answer = next(p for p in items if p.get("call_id") == poll["call_id"] and "output" in p)
            code = _commands(lines)[payload["call_id"]]["exit_code"]
            assert f"Process exited with code {code}\n" in answer["output"]
            polled += 1
    assert polled >= 3


def _usages(lines: list[dict[str, Any]]) -> list[tuple[int, int, int, int]]:
    """The usage of each response as its generation states it, in pi's terms."""
    if lines[0]["payload"]["cli_version"] == "0.169.0":
        stated = [p["usage"] for p in _records(lines, "token_usage_record")]
    else:
        stated = [p["info"]["last_token_usage"] for p in _events(lines, "token_count")]
    out = []
    for u in stated:
        written = u.get("cache_write_input_tokens", 0)
        given, cached = u["input_tokens"], u["cached_input_tokens"]
        out.append((given - cached - written, u["output_tokens"], cached, written))
    return out


@pytest.mark.parametrize("cli", GENERATIONS)
@pytest.mark.parametrize(("seed", "turns"), [(3, 2), (11, 5), (29, 8)])
def test_codex_render_pairs_calls_and_numbers_are_the_generators(
    tmp_path: Path, cli: str, seed: int, turns: int
) -> None:
    """In every generation: every call answered once right after its response, each
    response's usage as its lines state it, each command's exit code in the ledger the one
    the generator chose (the same story in every generation: 0.169's item_completed)."""
    lines = generate_codex_session(seed, turns, cli=cli)
    path = write_codex_session(tmp_path, lines)
    assert problems(_context(path)) == []
    assert [_counts(m["usage"]) for m in _assistants(path)] == _usages(lines)
    story = _commands(generate_codex_session(seed, turns))
    shells = {
        p["call_id"]
        for p in _records(lines, "response_item")
        if p.get("name") in ("shell", "exec_command")
    }
    exits = _ledger_exits(path)
    assert set(exits) == shells
    assert {call: exits[call] for call in shells} == {c: story[c]["exit_code"] for c in shells}


def test_codex_0_40_counts_precede_their_responses() -> None:
    """0.40: a token_count before each response, shell outputs as the JSON wrapper."""
    lines = generate_codex_session(11, 5, cli="0.40")
    assert lines[0]["payload"]["cli_version"] == "0.40.0" and "ordinal" not in lines[0]
    kinds = [
        line["payload"].get("type")
        for line in lines
        if line["type"] in ("response_item", "event_msg")
    ]
    first_count = kinds.index("token_count")
    assert first_count < kinds.index("reasoning")
    for payload in _records(lines, "response_item"):
        if payload.get("type") == "function_call":
            assert payload["name"] == "shell"
        if payload.get("type") == "function_call_output":
            assert set(json.loads(payload["output"])["metadata"]) == {
                "exit_code", "duration_seconds"
            }  # fmt: skip


def test_an_unpruned_render_answers_a_call_the_log_has_no_result_of(tmp_path: Path) -> None:
    """A Claude Code call with no result line, then the next prompt: `context --set
    enabled=false` still renders a context a provider accepts."""
    base = {"sessionId": "s1", "cwd": "/w", "timestamp": "2026-12-01T10:00:00.000Z"}
    block = {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}
    message = {"id": "msg_1", "role": "assistant", "model": "m", "content": [block]}
    lines = [
        {**base, "type": "user", "uuid": "u1", "parentUuid": None,
         "message": {"role": "user", "content": "go"}},
        {**base, "type": "assistant", "uuid": "a1", "parentUuid": "u1", "message": message},
        {**base, "type": "user", "uuid": "u2", "parentUuid": "a1",
         "message": {"role": "user", "content": "stop"}},
    ]  # fmt: skip
    path = tmp_path / "s1.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert problems(_context(path)) == []
