"""Claude Code transcripts through the reader: the mapping, its groups and dead letters (damage
and resuming anywhere: test_format_damage.py and test_format_resume.py, over both formats).

Every transcript is the generator's (synthetic_claude.py); the expected counts come from its
lines (tests/claude_sessions.py), never from the translator.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from claude_sessions import lines_of, source_counts, write_transcript
from format_sessions import tail_in_pieces, wire
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sessionfold.events.envelope import EntryEnvelope, PlaceholderEnvelope
from sessionfold.events.formats import detect, translator_for
from sessionfold.events.formats.claude_code import ATTACHMENT_TYPE, ClaudeCodeTranslator
from sessionfold.projections.ledger.text import message_text
from sessionfold.streams.cli import app
from sessionfold.streams.publishing.session_file import (
    DeadLetter,
    SessionFileReader,
    header_of,
    read_session_file,
)
from sessionfold.streams.runtime.embedded import fold_files
from sessionfold.streams.tools.synthetic_claude import transcript_bytes

SETTINGS = settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def entries_of(records: list[Any]) -> list[dict[str, Any]]:
    return [r.payload.entry for r in records if isinstance(r, EntryEnvelope)]


def messages(entries: list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    return [
        e["message"] for e in entries if e["type"] == "message" and e["message"]["role"] == role
    ]


@pytest.fixture(scope="module")
def transcript(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_transcript(tmp_path_factory.mktemp("cc"), seed=7, turns=40)


def test_detect_names_each_format_from_its_first_object() -> None:
    assert detect({"type": "session", "id": "x"}) == "pi"
    assert detect({"type": "user", "uuid": "u", "sessionId": "s"}) == "claude-code"
    assert detect({"type": "file-history-snapshot", "messageId": "m", "snapshot": {}}) == (
        "claude-code"
    )
    assert detect({"type": "session_meta", "payload": {"id": "s"}}) == "codex"
    assert detect({"type": "message", "id": "x"}) is None
    assert translator_for("pi") is None
    assert isinstance(translator_for("claude-code"), ClaudeCodeTranslator)


def test_the_generated_transcript_reads_with_no_dead_letter(transcript: list[Path]) -> None:
    main, *subagents = transcript
    records = list(read_session_file(main))
    assert not [r for r in records if isinstance(r, DeadLetter)]
    seqs = [r.seq for r in records if isinstance(r, EntryEnvelope | PlaceholderEnvelope)]
    assert seqs == list(range(1, len(seqs) + 1))
    header = entries_of(records)[0]
    assert header["type"] == "session" and header["format"] == "claude-code"
    assert header == header_of(main)
    assert subagents, "the generator writes a subagent transcript"
    sub_header = header_of(subagents[0])
    assert sub_header is not None and sub_header["parentSession"] == header["id"]
    assert sub_header["id"].startswith(header["id"] + ".agent-")


@SETTINGS
@given(seed=st.integers(0, 2**32), turns=st.integers(1, 30))
def test_mapping_keeps_messages_pairs_and_result_bytes(
    tmp_path_factory: pytest.TempPathFactory, seed: int, turns: int
) -> None:
    """Responses, results, prompts and compactions as the lines count them; each result after
    its call, named as the call; the results' text byte for byte."""
    for path in write_transcript(tmp_path_factory.mktemp("cc"), seed, turns):
        source = source_counts(lines_of(path))
        entries = entries_of(list(read_session_file(path)))
        assert len(messages(entries, "assistant")) == source.responses
        assert len(messages(entries, "user")) == source.prompts
        customs = [e for e in entries if e["type"] == "custom_message"]
        assert len(customs) == source.meta + source.attachments
        assert sum(e["customType"] == ATTACHMENT_TYPE for e in customs) == source.attachments
        assert sum(e["type"] == "compaction" for e in entries) == source.compactions
        results = messages(entries, "toolResult")
        assert len(results) == source.results
        called: dict[str, str] = {}
        for entry in entries:
            message = entry.get("message") or {}
            if message.get("role") == "assistant":
                for block in message["content"]:
                    if block["type"] == "toolCall":
                        called[block["id"]] = block["name"]
            elif message.get("role") == "toolResult":
                assert called[message["toolCallId"]] == message["toolName"]
        assert called == source.calls
        assert sum(len(message_text(m).encode()) for m in results) == source.result_bytes


def test_one_response_of_several_lines_is_one_assistant_message() -> None:
    """Thinking, text and two parallel calls, one line each, sharing message.id; the results
    in two user lines; a progress line between them."""
    base = {"sessionId": "s1", "cwd": "/w", "timestamp": "2025-07-01T10:00:00.000Z"}
    usage = {"input_tokens": 3, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 40,
             "output_tokens": 12}  # fmt: skip

    def chunk(uuid: str, parent: str, block: dict[str, Any]) -> dict[str, Any]:
        message = {"id": "msg_1", "role": "assistant", "model": "m", "content": [block],
                   "usage": usage}  # fmt: skip
        return {**base, "type": "assistant", "uuid": uuid, "parentUuid": parent,
                "requestId": "r1", "message": message}  # fmt: skip

    def result(uuid: str, parent: str, call: str, error: bool) -> dict[str, Any]:
        block = {"type": "tool_result", "tool_use_id": call, "content": "out", "is_error": error}
        return {**base, "type": "user", "uuid": uuid, "parentUuid": parent,
                "message": {"role": "user", "content": [block]}}  # fmt: skip

    lines = [
        {**base, "type": "user", "uuid": "u1", "parentUuid": None,
         "message": {"role": "user", "content": "go"}},
        chunk("a1", "u1", {"type": "thinking", "thinking": "hm", "signature": "sig"}),
        chunk("a2", "a1", {"type": "text", "text": "two calls"}),
        chunk("a3", "a2", {"type": "tool_use", "id": "t1", "name": "Bash",
                           "input": {"command": "false"}}),
        chunk("a4", "a3", {"type": "tool_use", "id": "t2", "name": "Read",
                           "input": {"file_path": "/w/x.py"}}),
        {**base, "type": "progress", "uuid": "p1", "parentUuid": "a4", "data": {}},
        result("r1", "p1", "t1", True),
        result("r2", "r1", "t2", False),
        {**base, "type": "user", "uuid": "u2", "parentUuid": "r2",
         "message": {"role": "user", "content": "thanks"}},
    ]  # fmt: skip
    translator = ClaudeCodeTranslator()
    out: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        out += translator.feed(line, number)
        if 2 <= number <= 8:
            assert translator.open_since == 2  # the response's lines and its results are held
    out += translator.close()
    kinds = [(e["type"], e.get("message", {}).get("role")) for e in out]
    assert kinds == [
        ("session", None),
        ("message", "user"),
        ("message", "assistant"),
        ("message", "toolResult"),
        ("message", "toolResult"),
        ("x-claude-code.progress", None),  # the results follow their response at once
        ("message", "user"),
    ]
    assistant = out[2]
    assert assistant["id"] == "a4" and assistant["parentId"] == "u1"
    assert [b["type"] for b in assistant["message"]["content"]] == [
        "thinking", "text", "toolCall", "toolCall"
    ]  # fmt: skip
    assert assistant["message"]["stopReason"] == "toolUse"
    assert assistant["message"]["usage"]["totalTokens"] == 3 + 900 + 40 + 12
    assert [e["parentId"] for e in out[3:]] == ["a4", "r1", "r2", "p1"]  # one chain
    assert out[3]["message"]["toolName"] == "Bash" and out[3]["message"]["isError"] is True
    assert out[4]["message"]["toolName"] == "Read"


def test_a_checkpoint_inside_a_group_stands_at_its_first_line(transcript: list[Path]) -> None:
    main = transcript[0]
    raw = main.read_bytes().split(b"\n")
    at = next(n for n, line in enumerate(raw, start=1) if b'"type":"assistant"' in line)
    reader = SessionFileReader(main)
    for _batch in reader.lines(final=False):
        if reader._cursor.line == at + 1:
            break
    position = reader.position
    assert position.line == at - 1 and position.held == 2
    assert position.offset == sum(len(x) + 1 for x in raw[: at - 1])


def test_a_line_that_cannot_be_mapped_is_a_dead_letter_keeping_its_place(tmp_path: Path) -> None:
    lines = [
        {"type": "user", "uuid": "u1", "parentUuid": None, "sessionId": "s",
         "message": {"role": "user", "content": "hi"}},
        {"type": "user", "uuid": "u2", "parentUuid": "u1", "sessionId": "s", "message": "oops"},
        {"type": "user", "uuid": "u3", "parentUuid": "u2", "sessionId": "s",
         "message": {"role": "user", "content": "again"}},
    ]  # fmt: skip
    path = tmp_path / "s.jsonl"
    path.write_bytes(transcript_bytes(lines))
    records = list(read_session_file(path))
    letters = [r for r in records if isinstance(r, DeadLetter)]
    assert [(d.error, d.line) for d in letters] == [("MappingError", 2)]
    assert "oops" not in letters[0].reason
    holders = [r for r in records if isinstance(r, PlaceholderEnvelope)]
    assert [(p.payload.id, p.payload.parentId) for p in holders] == [("u2", "u1")]
    assert entries_of(records)[-1]["parentId"] == "u2"


def test_a_forced_format_overrides_detection(transcript: list[Path]) -> None:
    main = transcript[0]
    forced_pi = list(read_session_file(main, format="pi"))
    assert forced_pi and all(isinstance(r, DeadLetter) for r in forced_pi)
    assert wire(list(read_session_file(main, format="claude-code"))) == wire(
        list(read_session_file(main))
    )


def test_the_ledger_reads_claude_codes_tools_and_not_its_injected_text(
    transcript: list[Path],
) -> None:
    main = transcript[0]
    source = lines_of(main)
    shell = sum(
        1
        for line in source
        if line["type"] == "assistant"
        for b in line["message"]["content"]
        if b.get("type") == "tool_use" and b["name"] == "Bash"
    )
    state = next(iter(fold_files([main])["sessions"].values()))
    ledger = state["ledger"]
    assert len(ledger["commands"]) == shell
    failed = sum(
        1
        for line in source
        if line["type"] == "user" and isinstance(line["message"]["content"], list)
        for b in line["message"]["content"]
        if b.get("type") == "tool_result" and str(b.get("content")).startswith("Exit code ")
    )
    assert sum(c["status"] == "failed" for c in ledger["commands"]) == failed
    assert ledger["files"], "Read, Edit and Write name their files"
    words = json.dumps(ledger)
    assert "<system-reminder>" not in words and "<command-name>" not in words


def test_a_dead_letter_inside_a_held_group_is_not_sent_again_on_resume(tmp_path: Path) -> None:
    """A line that cannot be mapped while a response waits for its results: its dead letter
    and placeholder go out once, though resuming reads the held lines again."""
    base = {"sessionId": "s", "timestamp": "2025-07-01T10:00:00.000Z"}
    call = {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "a"}
    lines = [
        {**base, "type": "user", "uuid": "u1", "parentUuid": None,
         "message": {"role": "user", "content": "hi"}},
        {**base, "type": "assistant", "uuid": "a1", "parentUuid": "u1",
         "message": {"id": "m1", "role": "assistant", "content": [call]}},
        {**base, "type": "user", "uuid": "bad", "parentUuid": "a1", "message": 5},
        {**base, "type": "user", "uuid": "r1", "parentUuid": "a1",
         "message": {"role": "user", "content": [result]}},
    ]  # fmt: skip
    data = transcript_bytes(lines)
    whole = list(read_session_file(_write(tmp_path / "whole.jsonl", data)))
    assert [type(r).__name__ for r in whole].count("DeadLetter") == 1
    third = data.split(b"\n")[:3]
    cut = sum(len(line) + 1 for line in third)
    assert wire(tail_in_pieces(tmp_path / "cut.jsonl", data, [cut])) == wire(whole)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _path_messages(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages on the path from the last entry back to the root, in order."""
    by_id = {e["id"]: e for e in entries if e["type"] != "session"}
    path: list[dict[str, Any]] = []
    at: str | None = entries[-1]["id"]
    while at is not None and at in by_id:
        path.append(by_id[at])
        at = by_id[at]["parentId"]
    return [e["message"] for e in reversed(path) if e["type"] == "message"]


@SETTINGS
@given(
    calls=st.integers(min_value=2, max_value=5),
    order=st.randoms(use_true_random=False),
    attachment=st.booleans(),
)
def test_parallel_results_hang_under_their_calls_and_all_stay_on_the_path(
    calls: int, order: Any, attachment: bool
) -> None:
    """Claude Code 2.1 writes a response of N parallel calls as N lines of one message.id, and
    each result line under its own call's line, in the order the tools finished; the next line
    hangs off the last result written. Every result is on the leaf's path, right after the
    response, in the order written, and the context is one a provider accepts."""
    from sessionfold.projections.views.validity import problems

    base = {"sessionId": "s1", "cwd": "/w", "timestamp": "2026-12-01T10:00:00.000Z"}
    lines: list[dict[str, Any]] = [
        {**base, "type": "user", "uuid": "u1", "parentUuid": None,
         "message": {"role": "user", "content": "go"}},
    ]  # fmt: skip
    parent = "u1"
    for n in range(calls):
        block = {"type": "tool_use", "id": f"t{n}", "name": "Bash", "input": {"command": "ls"}}
        message = {"id": "msg_1", "role": "assistant", "model": "m", "content": [block]}
        lines.append({**base, "type": "assistant", "uuid": f"a{n}", "parentUuid": parent,
                      "message": message})  # fmt: skip
        parent = f"a{n}"
    finished = list(range(calls))
    order.shuffle(finished)
    for n in finished:
        block = {"type": "tool_result", "tool_use_id": f"t{n}", "content": f"out {n}"}
        lines.append({**base, "type": "user", "uuid": f"r{n}", "parentUuid": f"a{n}",
                      "message": {"role": "user", "content": [block]}})  # fmt: skip
    last = f"r{finished[-1]}"
    if attachment:
        lines.append({**base, "type": "attachment", "uuid": "x1", "parentUuid": last,
                      "attachment": {"type": "prompt_snapshot"}})  # fmt: skip
        last = "x1"
    lines.append({**base, "type": "user", "uuid": "u2", "parentUuid": last,
                  "message": {"role": "user", "content": "thanks"}})  # fmt: skip
    translator = ClaudeCodeTranslator()
    out: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        out += translator.feed(line, number)
    out += translator.close()
    path = _path_messages(out)
    assert [m["role"] for m in path] == ["user", "assistant", *["toolResult"] * calls, "user"]
    assert [m["toolCallId"] for m in path[2:-1]] == [f"t{n}" for n in finished]
    assert problems(path) == []


def test_rendered_attachments_reach_the_context_and_bookkeeping_lines_do_not(
    tmp_path: Path,
) -> None:
    """CLI 2.1.328: an attachment with `rendered` text is what the model is sent (a hidden
    custom message, counted in the context); one without it and the bookkeeping lines
    (api-request, cost-state, ...) are kept as x-claude-code entries, out of the context."""
    base = {"sessionId": "s1", "cwd": "/w", "timestamp": "2026-12-01T10:00:00.000Z"}
    lines = [
        {**base, "type": "user", "uuid": "u1", "parentUuid": None,
         "message": {"role": "user", "content": "go"}},
        {**base, "type": "attachment", "uuid": "x1", "parentUuid": "u1",
         "attachment": {"type": "date", "date": "2026-12-01"},
         "rendered": [{"content": "Today is 2026-12-01."}], "renderedRole": "user"},
        {**base, "type": "attachment", "uuid": "x2", "parentUuid": "x1",
         "attachment": {"type": "prompt_snapshot", "systemPrompt": ["..."]}},
        {"type": "api-request", "id": "r1", "shapeHash": "h", "params": {}},
        {"type": "cost-state", "totalCostUSD": 0.01},
        {**base, "type": "assistant", "uuid": "a1", "parentUuid": "x2",
         "message": {"id": "m1", "role": "assistant", "model": "m",
                     "content": [{"type": "text", "text": "ok"}]}},
    ]  # fmt: skip
    path = tmp_path / "s1.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    records = list(read_session_file(path))
    assert not any(isinstance(r, DeadLetter) for r in records)
    kinds = [e["type"] for e in entries_of(records)]
    assert kinds.count("custom_message") == 1
    assert {"x-claude-code.attachment", "x-claude-code.api-request"} <= set(kinds)
    result = CliRunner().invoke(app, ["context", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    messages = json.loads(result.stdout)["messages"]
    assert [m["role"] for m in messages] == ["user", "custom", "assistant"]
    assert messages[1]["content"] == [{"type": "text", "text": "Today is 2026-12-01."}]
