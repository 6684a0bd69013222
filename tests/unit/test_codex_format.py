"""The Codex rollout mapping: hand-written lines per item kind, properties over the generator's
rollouts, refusals by name, and the ledger reading Codex shell calls by their tool names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionfold.events.entries import parse_entry
from sessionfold.events.envelope import EntryEnvelope, EntryPayload
from sessionfold.events.formats.base import MappingError, Translator
from sessionfold.events.formats.codex import CodexTranslator
from sessionfold.projections.ledger import commands
from sessionfold.projections.ledger.fold import LedgerFold
from sessionfold.projections.ledger.state import all_rows, load_head, snapshot
from sessionfold.projections.store import DictStore
from sessionfold.streams.tools.synthetic_codex import (
    GENERATIONS,
    generate_codex_session,
    write_codex_session,
)

SID = "019b64e5-57fa-7463-b644-fba7e456f905"
T0 = "2026-01-02T03:04:05.000Z"
META = {
    "timestamp": T0,
    "type": "session_meta",
    "payload": {"id": SID, "timestamp": T0, "cwd": "/w", "model_provider": "openai"},
}
_ASSISTANT_SIDE = {"reasoning", "function_call", "custom_tool_call", "local_shell_call"}


def item(payload: dict[str, Any], stamp: str = T0) -> dict[str, Any]:
    return {"timestamp": stamp, "type": "response_item", "payload": payload}


def event(payload: dict[str, Any]) -> dict[str, Any]:
    return {"timestamp": T0, "type": "event_msg", "payload": payload}


def message(role: str, text: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return item({"type": "message", "role": role, "content": [{"type": kind, "text": text}]})


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return item({"type": "function_call", "name": name, "arguments": arguments, "call_id": call_id})


def output(call_id: str, out: Any, kind: str = "function_call_output") -> dict[str, Any]:
    return item({"type": kind, "call_id": call_id, "output": out})


def translate(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every entry the lines give, the open group closed at the end."""
    translator = CodexTranslator()
    out: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        out += translator.feed(line, number)
    return out + translator.close()


def messages(entries: list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    return [
        e["message"] for e in entries if e["type"] == "message" and e["message"]["role"] == role
    ]


# --- item kinds ------------------------------------------------------------------------------


def test_session_meta_is_the_header_and_turn_context_the_model() -> None:
    """The header comes first, once; a turn_context's model and effort are pi changes."""
    context = {"model": "gpt-5.2-codex", "effort": "high", "cwd": "/w"}
    entries = translate([META, {"timestamp": T0, "type": "turn_context", "payload": context}])
    header, model, level = entries
    assert header == {
        "type": "session",
        "version": 3,
        "id": SID,
        "timestamp": T0,
        "cwd": "/w",
        "format": "codex",
        "provider": "openai",
    }
    assert (model["type"], model["provider"], model["modelId"]) == (
        "model_change",
        "openai",
        "gpt-5.2-codex",
    )
    assert (level["type"], level["thinkingLevel"]) == ("thinking_level_change", "high")
    # the same model again changes nothing: the line is kept as an unknown entry
    again = translate([META, *[{"timestamp": T0, "type": "turn_context", "payload": context}] * 2])
    assert [e["type"] for e in again] == [
        "session",
        "model_change",
        "thinking_level_change",
        "x-codex.turn_context",
    ]


def test_one_response_is_one_assistant_message_closed_by_its_token_count() -> None:
    """Reasoning + text + parallel calls are one message; token_count gives its usage."""
    usage = {"input_tokens": 9000, "cached_input_tokens": 8000, "output_tokens": 300}
    lines = [
        META,
        message("user", "fix the parser"),
        item(
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "Look first."}],
                "encrypted_content": "SECRET" * 50,
            }
        ),
        event({"type": "agent_reasoning", "text": "Look first."}),
        message("assistant", "Reading."),
        call("c1", "shell", '{"command": ["bash", "-lc", "ls"]}'),
        call("c2", "exec_command", '{"cmd": "cat a.py"}'),
        event({"type": "token_count", "info": {"last_token_usage": usage}}),
        output("c1", "a.py"),
        output("c2", "print(1)"),
    ]
    translator = CodexTranslator()
    fed = [translator.feed(line, n) for n, line in enumerate(lines[:7], 1)]
    assert fed[2:] == [[], [], [], [], []]  # the response is still open
    assert translator.open_since == 3
    fed += [translator.feed(line, n) for n, line in enumerate(lines[7:], 8)]
    assert translator.open_since is None
    entries = [e for out in fed for e in out] + translator.close()
    (assistant,) = messages(entries, "assistant")
    assert [b["type"] for b in assistant["content"]] == ["thinking", "text", "toolCall", "toolCall"]
    thinking = assistant["content"][0]
    assert thinking == {"type": "thinking", "thinking": "Look first.", "encryptedChars": 300}
    assert "SECRET" not in json.dumps(entries)
    assert assistant["content"][2]["arguments"] == {"command": ["bash", "-lc", "ls"]}
    assert assistant["stopReason"] == "toolUse"
    assert assistant["usage"]["totalTokens"] == 9300
    assert (assistant["usage"]["input"], assistant["usage"]["cacheRead"]) == (1000, 8000)
    # the reasoning event read while the response was open comes right after its message
    kinds = [e["type"] for e in entries]
    at = next(i for i, e in enumerate(entries) if e.get("message", {}).get("role") == "assistant")
    assert kinds[at + 1 : at + 3] == ["x-codex.agent_reasoning", "x-codex.token_count"]
    results = messages(entries, "toolResult")
    assert [(r["toolCallId"], r["toolName"]) for r in results] == [
        ("c1", "shell"),
        ("c2", "exec_command"),
    ]


def test_outputs_carry_exit_codes_and_errors() -> None:
    """Codex's shell JSON, freeform and unified-exec outputs give exitCode and isError."""
    shell_json = json.dumps({"output": "boom", "metadata": {"exit_code": 2}})
    lines = [
        META,
        call("a", "shell", '{"command": ["bash", "-lc", "make"]}'),
        call("b", "shell", '{"command": ["ls"]}'),
        call("c", "exec_command", '{"cmd": "pytest"}'),
        item(
            {
                "type": "custom_tool_call",
                "name": "apply_patch",
                "input": "*** Begin",
                "call_id": "d",
            }
        ),
        call("e", "mcp__x__y", "not json"),
        output("a", shell_json),
        output("b", "Exit code: 0\nWall time: 0.1 seconds\nOutput:\nx"),
        output("c", "Chunk ID: 1\nProcess exited with code 1\nOutput:\nF"),
        output("d", [{"type": "output_text", "text": "Done!"}], "custom_tool_call_output"),
        output("e", {"content": "denied", "success": False}),
    ]
    entries = translate(lines)
    (assistant,) = messages(entries, "assistant")
    assert assistant["content"][3]["arguments"] == {"input": "*** Begin"}
    assert assistant["content"][4]["arguments"] == {"arguments": "not json"}
    got = [
        (r["toolCallId"], r.get("details"), r["isError"], r["content"][0]["text"])
        for r in messages(entries, "toolResult")
    ]
    assert got == [
        ("a", {"exitCode": 2}, True, shell_json),
        ("b", {"exitCode": 0}, False, "Exit code: 0\nWall time: 0.1 seconds\nOutput:\nx"),
        ("c", {"exitCode": 1}, True, "Chunk ID: 1\nProcess exited with code 1\nOutput:\nF"),
        ("d", None, False, "Done!"),
        ("e", None, True, "denied"),
    ]


def test_local_shell_call_is_a_tool_call_with_its_action() -> None:
    action = {"type": "exec", "command": ["bash", "-lc", "ls"], "timeout_ms": 1000}
    lines = [META, item({"type": "local_shell_call", "call_id": "L", "action": action})]
    lines.append(output("L", json.dumps({"output": "", "metadata": {"exit_code": 0}})))
    entries = translate(lines)
    block = messages(entries, "assistant")[0]["content"][0]
    assert block == {
        "type": "toolCall",
        "id": "L",
        "name": "local_shell",
        "arguments": {"command": ["bash", "-lc", "ls"], "timeout_ms": 1000},
    }
    assert messages(entries, "toolResult")[0]["toolName"] == "local_shell"


def test_injected_turns_are_hidden_custom_messages_not_user_words() -> None:
    """Developer text, AGENTS.md and the environment context are not the user's turns."""
    lines = [
        META,
        message("developer", "<permissions instructions>x</permissions>"),
        message("user", "# AGENTS.md instructions for /w\n\n<INSTRUCTIONS>always x</INSTRUCTIONS>"),
        message("user", "<environment_context>\n<cwd>/w</cwd>\n</environment_context>"),
        message("user", "now the real ask"),
    ]
    entries = translate(lines)
    hidden = [(e["customType"], e["display"]) for e in entries if e["type"] == "custom_message"]
    assert hidden == [
        ("codex.developer", False),
        ("codex.instructions", False),
        ("codex.environment_context", False),
    ]
    assert [m["content"][0]["text"] for m in messages(entries, "user")] == ["now the real ask"]


@pytest.mark.parametrize("remote", [False, True])
def test_compacted_is_a_compaction_keeping_its_replacement_history(remote: bool) -> None:
    """The replacement history is the kept context; a remote summary is opaque and says so."""
    summary = "" if remote else "We fixed the parser."
    last: dict[str, Any] = (
        {"type": "compaction", "encrypted_content": "E" * 40}
        if remote
        else {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Summary follows:\n" + summary}
        ]}
    )  # fmt: skip
    kept_user = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "q"}],
    }
    usage = {"input_tokens": 5000, "output_tokens": 10}
    lines = [
        META,
        message("user", "q"),
        message("assistant", "a"),
        event({"type": "token_count", "info": {"last_token_usage": usage}}),
        {
            "timestamp": T0,
            "type": "compacted",
            "payload": {"message": summary, "replacement_history": [kept_user, last]},
        },
    ]
    entries = translate(lines)
    compaction = entries[-1]
    kept = entries[-2]
    assert compaction["type"] == "compaction"
    assert compaction["summary"] == summary
    assert compaction["tokensBefore"] == 5010
    assert compaction["firstKeptEntryId"] == kept["id"]
    assert (kept["type"], kept["customType"]) == ("custom_message", "codex.replacement_history")
    assert kept["content"] == [{"type": "text", "text": "q"}]
    assert len(messages(entries, "user")) == 1  # the kept copy is not a new user turn
    if remote:
        assert compaction["details"] == {"codex": {"opaque": True, "encryptedChars": 40}}
        assert "EEEE" not in json.dumps(entries)
    else:
        assert "details" not in compaction


def test_unknown_kinds_are_kept_and_encrypted_parts_counted_only() -> None:
    lines = [
        META,
        event({"type": "future_event", "x": 1}),
        {"timestamp": T0, "type": "future_record", "payload": {"y": 2}},
        item({"type": "web_search_call", "encrypted_content": "Z" * 9, "action": {}}),
    ]
    entries = translate(lines)
    assert [(e["type"], e["raw"]) for e in entries[1:]] == [
        ("x-codex.future_event", {"type": "future_event", "x": 1}),
        ("x-codex.future_record", {"y": 2}),
        ("x-codex.web_search_call", {"type": "web_search_call", "encrypted_content_chars": 9,
                                     "action": {}}),
    ]  # fmt: skip


def test_the_direct_generation_is_read_and_state_lines_kept() -> None:
    """Old rollouts: a bare header, bare response items, `record_type: state` lines."""
    lines = [
        {"id": SID, "timestamp": T0, "instructions": None},
        {"record_type": "state"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "yo"}],
        },
    ]
    entries = translate(lines)
    assert [e["type"] for e in entries] == ["session", "x-codex.state", "message", "message"]
    assert entries[0]["id"] == SID
    assert messages(entries, "assistant")[0]["content"] == [{"type": "text", "text": "yo"}]


@pytest.mark.parametrize(
    ("lines", "reason"),
    [
        ([message("user", "x")], "no session_meta before this line"),
        ([{"type": "session_meta", "payload": {"cwd": "/w"}}], "session_meta.id is not a string"),
        ([META, {"type": "response_item", "payload": "x"}], "response_item.payload is not"),
        ([META, call("", "shell", "{}")], "function_call.call_id is not a string"),
        ([META, output(None, "x")], "function_call_output.call_id is not a string"),
        ([META, message("tool", "x")], "message.role is not user"),
        ([META, event({"type": 3})], "event_msg.type is not a string"),
        ([{"record_type": "state"}], "record_type line before the session header"),
    ],
)
def test_unmappable_lines_are_refused_by_name(lines: list[dict[str, Any]], reason: str) -> None:
    """A MappingError names the field, never the line's text."""
    with pytest.raises(MappingError, match=reason) as refused:
        translate(lines)
    assert "x" not in str(refused.value).replace("codex", "").replace("text", "")


def test_a_refused_line_keeps_its_place_and_the_open_response() -> None:
    """The error names the line's place in the chain; the next entry hangs from it, and a
    response open before the refused line is neither lost nor closed by it."""
    translator = CodexTranslator()
    first = translator.feed(META, 1) + translator.feed(message("user", "q"), 2)
    assert translator.feed(call("a", "shell", '{"command": "ls"}'), 3) == []
    with pytest.raises(MappingError) as refused:
        translator.feed(output(None, "x"), 4)
    assert refused.value.parent_id == first[-1]["id"]
    assert translator.open_since == 3
    # the output joins its response, which waits for its usage (or the end) to close
    assert translator.feed(output("a", "ok"), 5) == []
    assert translator.open_since == 3
    assistant, result = translator.close()
    assert assistant["parentId"] == refused.value.id
    assert assistant["message"]["content"][0]["id"] == "a"
    assert result["parentId"] == assistant["id"]
    assert refused.value.id not in {first[-1]["id"], assistant["id"], result["id"]}


def test_the_translator_follows_the_protocol() -> None:
    translator: Translator = CodexTranslator()
    assert translator.format == "codex"


# --- properties over the generator -----------------------------------------------------------


def responses(lines: list[dict[str, Any]]) -> int:
    """Model responses in a rollout: runs of assistant-side items, cut by anything else
    model-visible or by a token_count (the oracle the mapping's grouping must agree with)."""
    count, inside = 0, False
    for line in lines:
        payload = line.get("payload", {})
        kind = payload.get("type")
        assistant = line["type"] == "response_item" and (
            kind in _ASSISTANT_SIDE or (kind == "message" and payload.get("role") == "assistant")
        )
        if assistant and not inside:
            count += 1
        if assistant:
            inside = True
        elif line["type"] != "event_msg" or kind == "token_count":
            inside = False
    return count


def source_user_turns(lines: list[dict[str, Any]]) -> int:
    """User messages a person typed (not the injected AGENTS.md / environment turns)."""
    return sum(
        1
        for line in lines
        if line["type"] == "response_item"
        and line["payload"].get("role") == "user"
        and not line["payload"]["content"][0]["text"].startswith(("#", "<"))
    )


SEEDS = st.integers(min_value=0, max_value=2**32)
TURNS = st.integers(min_value=1, max_value=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=SEEDS, turns=TURNS, cli=st.sampled_from(GENERATIONS))
def test_mapping_preserves_turns_pairs_and_sizes(seed: int, turns: int, cli: str) -> None:
    """User and assistant turns are kept, every call pairs with one later result by call_id,
    output byte sizes are kept, entries chain, validate, and hide encrypted content (every CLI
    generation the generator writes)."""
    lines = generate_codex_session(seed, turns, cli=cli)
    entries = translate(lines)
    for entry in entries:
        parse_entry(entry)
    assert entries[0]["type"] == "session"
    ids = [e["id"] for e in entries[1:]]
    assert len(set(ids)) == len(ids)
    assert [e["parentId"] for e in entries[1:]] == [None, *ids[:-1]]

    assert len(messages(entries, "user")) == source_user_turns(lines) == turns
    assert len(messages(entries, "assistant")) == responses(lines)

    calls = {
        line["payload"]["call_id"]
        for line in lines
        if line["type"] == "response_item"
        and line["payload"]["type"] in _ASSISTANT_SIDE - {"reasoning"}
    }
    positions: dict[str, int] = {}
    for at, entry in enumerate(entries):
        message = entry.get("message", {})
        for block in message.get("content", []) if message.get("role") == "assistant" else []:
            if block["type"] == "toolCall":
                positions[block["id"]] = at
    results = [
        (at, e["message"])
        for at, e in enumerate(entries)
        if e.get("message", {}).get("role") == "toolResult"
    ]
    assert set(positions) == calls
    assert sorted(r["toolCallId"] for _, r in results) == sorted(calls)
    assert all(positions[r["toolCallId"]] < at for at, r in results)

    sizes = {
        line["payload"]["call_id"]: len(line["payload"]["output"].encode())
        for line in lines
        if line["type"] == "response_item" and line["payload"]["type"].endswith("_output")
    }
    assert {r["toolCallId"]: len(r["content"][0]["text"].encode()) for _, r in results} == sizes
    assert any(r["isError"] for _, r in results)  # the generator's failing shell command

    text = json.dumps(entries)
    for line in lines:
        secret = line.get("payload", {}).get("encrypted_content")
        if isinstance(secret, str):
            assert secret not in text


@settings(max_examples=15, deadline=None)
@given(seed=SEEDS, turns=TURNS, cli=st.sampled_from(GENERATIONS))
def test_generation_and_mapping_are_deterministic(seed: int, turns: int, cli: str) -> None:
    first = generate_codex_session(seed, turns, cli=cli)
    assert generate_codex_session(seed, turns, cli=cli) == first
    assert json.dumps(translate(first)) == json.dumps(translate(json.loads(json.dumps(first))))


@pytest.mark.parametrize(
    ("cli", "line_kinds", "event_kinds"),
    [
        ("0.169", {"token_usage_record", "world_state"}, {"item_completed"}),
        ("0.77", set(), {"context_compacted", "user_message", "agent_message"}),
        ("0.40", set(), {"context_compacted", "user_message", "agent_message"}),
    ],
)
def test_generated_rollouts_have_every_kind(
    tmp_path: Path, cli: str, line_kinds: set[str], event_kinds: set[str]
) -> None:
    """The generator writes what the mapping must handle, to a Codex-named file."""
    lines = generate_codex_session(7, 6, cli=cli)
    kinds = {line["type"] for line in lines}
    assert {"session_meta", "turn_context", "response_item", "event_msg", "compacted"} <= kinds
    assert line_kinds <= kinds
    events = {line["payload"]["type"] for line in lines if line["type"] == "event_msg"}
    assert {"token_count", *event_kinds} <= events
    path = write_codex_session(tmp_path, lines)
    assert path.name.startswith("rollout-") and path.name.endswith(
        f"{lines[0]['payload']['id']}.jsonl"
    )
    assert [json.loads(row) for row in path.read_text().splitlines()] == lines


# --- the ledger ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"command": ["bash", "-lc", "make test"]}, "make test"),
        ({"command": ["ls", "-la", "my dir"]}, "ls -la 'my dir'"),
        ({"cmd": "rg -n x"}, "rg -n x"),
        ({"command": "npm test"}, "npm test"),
        ({"command": [1]}, ""),
    ],
)
def test_command_text_reads_argv_lists_and_cmd(arguments: dict[str, Any], text: str) -> None:
    assert commands.command_text(arguments) == text


def test_ledger_reads_codex_shell_commands_and_exit_codes() -> None:
    """Codex shell calls become ledger commands with their exit codes; a failure is an error."""
    lines = [
        META,
        message("user", "# AGENTS.md instructions for /w\n\n<INSTRUCTIONS>never x</INSTRUCTIONS>"),
        message("user", "always run make"),
        call("a", "shell", '{"command": ["bash", "-lc", "make"]}'),
        call("b", "exec_command", '{"cmd": "pytest -q"}'),
        output("a", json.dumps({"output": "make: *** Error 2", "metadata": {"exit_code": 2}})),
        output("b", "Process exited with code 0\nOutput:\nok"),
        item(
            {"type": "local_shell_call", "call_id": "c", "action": {"command": ["git", "status"]}}
        ),
        output("c", "Exit code: 0\nOutput:\nclean"),
    ]
    entries = translate(lines)[1:]
    store = DictStore()
    fold = LedgerFold(store)
    for seq, entry in enumerate(entries, 1):
        envelope = EntryEnvelope(session_id=SID, seq=seq, payload=EntryPayload(entry=entry))
        assert fold.apply(envelope) == []
    state = snapshot(store, SID)
    got = [(c["command"], c["exit"], c["status"]) for c in state["commands"]]
    assert got == [("make", 2, "failed"), ("pytest -q", 0, "ok"), ("git status", 0, "ok")]
    assert [(e["command"], e["tool"]) for e in state["errors"]] == [("C1", "bash")]
    head = load_head(store, SID)
    assert head is not None
    assert [r["text"] for r in all_rows(store, head, "u")] == ["always run make"]


@pytest.mark.parametrize(
    "text",
    [
        "[" * 200_000 + "]" * 200_000,  # past any stack: no RecursionError
        '{"a":' + "[" * 200 + "]" * 200 + "}",  # an object deeper than an entry may hold
        '{"command": NaN}',  # not JSON the wire carries (orjson would write null)
    ],
)
def test_arguments_that_are_not_wire_json_stay_text(text: str) -> None:
    """A call's arguments parse only to an object the wire carries, within the depth an entry
    may hold; otherwise they are kept as the string; an output's JSON head never crashes."""
    entries = translate(
        [META, call("c1", "shell", text), output("c1", '{"metadata":' + text + "}")]
    )
    (assistant,) = messages(entries, "assistant")
    assert assistant["content"][0]["arguments"] == {"arguments": text}
    (result,) = messages(entries, "toolResult")
    assert "details" not in result and result["isError"] is False
