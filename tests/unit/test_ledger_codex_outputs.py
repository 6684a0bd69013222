"""What the ledger reads from Codex shell outputs and user turns (issue 38, items 3 to 6).

Codex writes how a command ended into its output (a JSON wrapper, a freeform or unified exec
header), runs long commands as unified exec sessions polled by `write_stdin`, and its VS Code
extension wraps the user's request in IDE context. Rollout lines go through the real
translator, then the ledger fold.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.events.envelope import EntryEnvelope, EntryPayload
from sessionfold.events.formats.codex import CodexTranslator
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.projections.ledger import commands
from sessionfold.projections.ledger.fold import LedgerFold
from sessionfold.projections.ledger.render import render
from sessionfold.projections.ledger.state import snapshot
from sessionfold.projections.ledger.text import user_words
from sessionfold.projections.store import DictStore
from sessionfold.streams.runtime.ledger_loop import fold_records

SID = "019b64e5-57fa-7463-b644-fba7e456f905"
T0 = "2026-01-02T03:04:05.000Z"
META = {
    "timestamp": T0,
    "type": "session_meta",
    "payload": {"id": SID, "timestamp": T0, "cwd": "/w", "model_provider": "openai"},
}


def item(payload: dict[str, Any]) -> dict[str, Any]:
    return {"timestamp": T0, "type": "response_item", "payload": payload}


def user_line(text: str) -> dict[str, Any]:
    content = [{"type": "input_text", "text": text}]
    return item({"type": "message", "role": "user", "content": content})


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    body = {"type": "function_call", "name": name, "call_id": call_id}
    return item({**body, "arguments": json.dumps(arguments)})


def output(call_id: str, out: str) -> dict[str, Any]:
    return item({"type": "function_call_output", "call_id": call_id, "output": out})


def tokens() -> dict[str, Any]:
    """A token_count: it closes the open response, as Codex writes one after each."""
    usage = {"input_tokens": 10, "cached_input_tokens": 0, "output_tokens": 5}
    payload = {"type": "token_count", "info": {"last_token_usage": usage}}
    return {"timestamp": T0, "type": "event_msg", "payload": payload}


def envelopes(lines: list[dict[str, Any]]) -> list[EntryEnvelope]:
    """The rollout's entries (the header left out) as envelopes, seq 1, 2, ..."""
    translator = CodexTranslator()
    entries: list[dict[str, Any]] = []
    for number, line in enumerate([META, *lines], 1):
        entries += translator.feed(line, number)
    entries += translator.close()
    return [
        EntryEnvelope(session_id=SID, seq=seq, payload=EntryPayload(entry=entry))
        for seq, entry in enumerate(entries[1:], 1)
    ]


def fold(lines: list[dict[str, Any]], store: DictStore | None = None) -> dict[str, Any]:
    """The ledger state after folding the rollout's lines (no pass)."""
    store = store if store is not None else DictStore()
    ledger = LedgerFold(store)
    for envelope in envelopes(lines):
        assert ledger.apply(envelope) == []
    return snapshot(store, SID)


def shell(call_id: str, command: str, out: str, tool: str = "shell") -> list[dict[str, Any]]:
    """One shell call and its output."""
    arguments = {"cmd": command} if tool == "exec_command" else {"command": command}
    return [call(call_id, tool, arguments), output(call_id, out)]


# --- item 3: an exit code nothing states is unknown ------------------------------------------

#: Output lines that state no exit code in any form the ledger reads.
_SILENT_LINES = st.lists(
    st.text(st.characters(codec="utf-8", exclude_characters="\r"), max_size=30).filter(
        lambda line: "code" not in line.lower() and "abort" not in line.lower()
    ),
    max_size=6,
)


@settings(max_examples=300)
@given(_SILENT_LINES, st.sampled_from(("shell", "local_shell", "exec_command")))
def test_a_codex_output_that_states_no_exit_code_is_an_unknown_outcome(
    lines: list[str], tool: str
) -> None:
    """Property: a Codex shell result with no exit code anywhere is unknown, never `exit 0`;
    rendered as unknown and stored with no exit."""
    text = "\n".join(lines)
    state = fold(shell("c1", "npm test", text, tool))
    (command,) = state["commands"]
    assert (command["exit"], command["status"], command["error"]) == (None, "unknown", None)
    assert "- C1 unknown: `npm test`" in render(state)[0]
    assert state["errors"] == []


@settings(max_examples=300)
@given(_SILENT_LINES, st.booleans())
def test_pi_and_claude_code_results_that_state_no_code_stay_clean_exits(
    lines: list[str], claude: bool
) -> None:
    """Property: pi's `bash` and Claude Code's `Bash` write a code only when a command failed,
    so their silent results stay `exit 0` (pi sessions fold as before)."""
    message = {
        "role": "toolResult",
        "toolCallId": "c1",
        "toolName": "Bash" if claude else "bash",
        "content": [{"type": "text", "text": "\n".join(lines)}],
        "isError": False,
    }
    assert commands.result_outcome(message) == commands.Outcome(0, "ok")


def test_a_codex_error_with_no_code_is_a_failure_with_an_unknown_code() -> None:
    """isError with no code anywhere: failed, exit unknown, and an error row."""
    message = {
        "role": "toolResult",
        "toolCallId": "c1",
        "toolName": "shell",
        "content": [{"type": "text", "text": "bwrap: setting up uid map: Permission denied"}],
        "isError": True,
    }
    assert commands.result_outcome(message) == commands.Outcome(None, "failed")


@settings(max_examples=300)
@given(
    st.integers(-5, 255),
    st.sampled_from(("LinuxSeccomp", "MacosSeatbelt", "WindowsRestrictedToken")),
    st.sampled_from(("exit code: {}", "exit_code: {}")),
    st.text(max_size=40),
    st.integers(0, 255),
)
def test_a_sandbox_failure_reads_its_exit_code(
    code: int, sandbox: str, form: str, printed: str, other: int
) -> None:
    """Property: Codex's `failed in sandbox ... exit code: N` error is exit N, whatever the
    command printed after it (a second `exit code: M` in its stdout included)."""
    text = (
        f"execution error: failed in sandbox {sandbox} with execution error: "
        f"sandbox denied exec error, {form.format(code)}, stdout: {printed} exit code: {other}, "
        "stderr: cannot write"
    )
    state = fold(shell("c1", "npm test", text))
    (command,) = state["commands"]
    assert command["exit"] == code
    assert command["status"] == ("ok" if code == 0 else "failed")
    assert (command["error"] is None) == (code == 0)


def _exited(code: int, body: str) -> str:
    return (
        f"Chunk ID: 9d0e11\nWall time: 0.2500 seconds\nProcess exited with code {code}\n"
        f"Original token count: 40\nOutput:\n{body}"
    )


# --- items 4 and 6: values and error heads read the printed text, not the wrapper -------------

#: What a command printed: lines with values of every kind the ledger reads, and error lines.
_PRINTED = st.lists(
    st.sampled_from(
        (
            "src/parse.ts:12:5 - error TS2345: safeParseData is not assignable",
            "Tests  2 failed | 40 passed",
            "Server listening on http://localhost:5173",
            "Done in 3.2s",
            "[main 1a2b3c4] fix the parser",
            "  at safeParseData (src/parse.ts:40:9)",
            "npm ERR! code ELIFECYCLE",
            "plain output line",
            "",
            "snake_case_name = camelCaseName",
        )
    ),
    max_size=12,
).map("\n".join)


def _wrapped(form: str, body: str, code: int) -> str:
    if form == "json":
        metadata = {"exit_code": code, "duration_seconds": 0.1}
        return json.dumps({"output": body, "metadata": metadata})
    if form == "freeform":
        return f"Exit code: {code}\nWall time: 0.5 seconds\nTotal output lines: 3\nOutput:\n{body}"
    return _exited(code, body)


def _pi_row(body: str, code: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The command row and errors of the same body run by pi's bash tool with this code."""
    store = DictStore()
    ledger = LedgerFold(store)
    block = {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {"command": "npm test"}}
    result = {
        "role": "toolResult",
        "toolCallId": "c1",
        "toolName": "bash",
        "content": [{"type": "text", "text": body}],
        "isError": code != 0,
        "details": {"exitCode": code},
    }
    for seq, message in enumerate(({"role": "assistant", "content": [block]}, result), 1):
        entry = {"type": "message", "id": f"e{seq}", "parentId": None, "message": message}
        ledger.apply(EntryEnvelope(session_id=SID, seq=seq, payload=EntryPayload(entry=entry)))
    state = snapshot(store, SID)
    return state["commands"][0], state["errors"]


@settings(max_examples=300)
@given(_PRINTED, st.integers(0, 2), st.sampled_from(("json", "freeform", "unified")))
def test_a_wrapped_output_reads_as_what_the_command_printed(
    body: str, code: int, form: str
) -> None:
    """Property: a Codex output wrapped in JSON (0.40) or under a freeform or unified exec
    header gives the command the excerpt, values and error head the printed text alone gives:
    no `nsafeParseData` from an escaped newline, no `exit_code`, `duration_seconds`, `Chunk ID`
    or `Wall time` as values."""
    tool = "exec_command" if form == "unified" else "shell"
    state = fold(shell("c1", "npm test", _wrapped(form, body, code), tool))
    (command,) = state["commands"]
    pi_command, pi_errors = _pi_row(body, code)
    for field in ("exit", "status", "excerpt", "values"):
        assert command[field] == pi_command[field], field
    assert [e["head"] for e in state["errors"]] == [e["head"] for e in pi_errors]
    shown = json.dumps(command["values"])
    for framing in ("nsafeParseData", "exit_code", "duration_seconds", "Chunk", "Wall time"):
        assert framing not in shown


def test_json_wrapped_values_and_error_head_read_the_decoded_text() -> None:
    """The 0.40 example: the error head and values come from the decoded lines."""
    text = json.dumps(
        {
            "output": "ok\nsrc/a.ts:3:7 - error TS1005: nsafe\nsafeParseData failed\n",
            "metadata": {"exit_code": 2, "duration_seconds": 0.1},
        }
    )
    state = fold(shell("c1", "npx tsc", text))
    (command,) = state["commands"]
    assert command["values"] == [["src/a.ts:3:7", "error location"]]
    assert state["errors"][0]["head"] == "safeParseData failed"
    assert "\\n" not in command["excerpt"] and '"metadata"' not in command["excerpt"]


# --- item 5: IDE context is not the user's words -----------------------------------------------


def _ide(request: str, tabs: list[str]) -> str:
    listed = "".join(f"- {tab}: {tab}\n" for tab in tabs)
    return (
        "# Context from my IDE setup:\n\n## Active file: src/app.py\n\n"
        f"## Open tabs:\n{listed}\n## My request for Codex:\n{request}"
    )


_TABS = st.lists(st.from_regex(r"[a-z]{1,8}/[a-z_]{1,12}\.(py|ts|md)", fullmatch=True), max_size=40)


@settings(max_examples=300)
@given(st.text(min_size=1, max_size=200).filter(str.strip), _TABS)
def test_only_the_request_of_an_ide_wrapped_turn_is_the_users_words(
    request: str, tabs: list[str]
) -> None:
    """Property: the words of an IDE-wrapped turn are its request alone, whatever the tabs."""
    message = {"role": "user", "content": [{"type": "text", "text": _ide(request, tabs)}]}
    assert user_words(message) == user_words({"role": "user", "content": request})


def test_the_now_line_and_rules_quote_the_request_not_the_tabs() -> None:
    """A pass over an IDE-wrapped turn: the rule is the request's words and Now quotes the
    request, even behind 400 open tabs (which cut the request off before)."""
    tabs = [f"pkg/module_{n}.py" for n in range(400)]
    request = "Never push to main without running the tests first."
    run = fold_records(envelopes([user_line(_ide(request, tabs))]), OfflineModel())
    state = snapshot(run.store, SID)
    assert [rule["words"] for rule in state["rules"]] == [request]
    assert state["now"] == f"Last user request (u1): {request}"
    assert "Open tabs" not in render(state)[0]
