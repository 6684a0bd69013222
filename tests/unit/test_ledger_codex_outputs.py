"""What the ledger reads from Codex shell outputs and user turns (issue 38, items 3 to 6).

Codex writes how a command ended into its output (a JSON wrapper, a freeform or unified exec
header), runs long commands as unified exec sessions polled by `write_stdin`, and its VS Code
extension wraps the user's request in IDE context. Rollout lines go through the real
translator, then the ledger fold.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.events.envelope import EntryEnvelope, EntryPayload
from sessionfold.events.formats.codex import CodexTranslator
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.projections.ledger import commands
from sessionfold.projections.ledger.fold import LedgerFold
from sessionfold.projections.ledger.render import render
from sessionfold.projections.ledger.state import canonical_json, ledger_key, snapshot
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


# --- item 3: unified exec polls join their command ---------------------------------------------


def _running(session: int, body: str, *, chunk: str = "3fa2c1") -> str:
    return (
        f"Chunk ID: {chunk}\nWall time: 1.0012 seconds\nProcess running with session ID "
        f"{session}\nOriginal token count: 12\nOutput:\n{body}"
    )


def _exited(code: int, body: str) -> str:
    return (
        f"Chunk ID: 9d0e11\nWall time: 0.2500 seconds\nProcess exited with code {code}\n"
        f"Original token count: 40\nOutput:\n{body}"
    )


def _poll(call_id: str, session: int) -> dict[str, Any]:
    return call(call_id, "write_stdin", {"session_id": session, "chars": ""})


def test_a_failing_unified_exec_run_is_one_failed_command() -> None:
    """`npm test` started by exec_command and ended by a write_stdin poll with code 1 is one
    command, exit 1, whose error is the command's, not write_stdin's; no poll state stays."""
    store = DictStore()
    lines = [
        call("e1", "exec_command", {"cmd": "npm test", "yield_time_ms": 1000}),
        output("e1", _running(5, "> app@1.0.0 test\n> vitest run\n")),
        tokens(),
        _poll("p1", 5),
        output("p1", _running(5, " RUN  v1.6.0 /w\n")),
        tokens(),
        _poll("p2", 5),
        output("p2", _exited(1, " FAIL  src/a.test.ts > parses\nTests  1 failed | 3 passed\n")),
    ]
    state = fold(lines, store)
    (command,) = state["commands"]
    assert (command["command"], command["exit"], command["status"]) == ("npm test", 1, "failed")
    assert command["call"] == "e1"
    (error,) = state["errors"]
    assert (error["tool"], error["command"], error["id"]) == ("bash", "C1", command["error"])
    assert error["head"] == "FAIL  src/a.test.ts > parses"  # the failing test, not the count
    assert "vitest run" in command["excerpt"] and "1 failed" in command["excerpt"]
    assert "Chunk ID" not in command["excerpt"]
    assert ["1 failed", "test total"] in command["values"]
    assert not [k for k in store if "/ledger/exec/" in k or "/ledger/call/" in k]


def test_a_running_command_stays_unknown_until_its_poll_ends_it() -> None:
    """Before the poll that ends it, a unified exec command is unknown; a clean end is ok."""
    start = [
        call("e1", "exec_command", {"cmd": "cargo build"}),
        output("e1", _running(7, "Compiling a v0.1.0\n")),
        tokens(),
    ]
    (running,) = fold(start)["commands"]
    assert (running["exit"], running["status"]) == (None, "unknown")
    state = fold([*start, _poll("p1", 7), output("p1", _exited(0, "Finished in 3.2s\n"))])
    (command,) = state["commands"]
    assert (command["exit"], command["status"], command["error"]) == (0, "ok", None)
    assert state["errors"] == []


@st.composite
def _exec_sessions(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, int | None]]:
    """Interleaved unified exec sessions: each started, polled, maybe ended with a code; and
    each command's expected exit (None while still running)."""
    count = draw(st.integers(1, 4))
    polls = {n: draw(st.integers(0, 3)) for n in range(count)}
    ends = {n: draw(st.one_of(st.none(), st.integers(0, 3))) for n in range(count)}
    lines: list[dict[str, Any]] = []
    steps = [n for n in range(count) for _ in range(polls[n] + 1)]
    done = dict.fromkeys(range(count), 0)
    # Any interleaving of the sessions, each session's own steps in order.
    for n in draw(st.permutations(steps)):
        step, done[n] = done[n], done[n] + 1
        code = ends[n] if step == polls[n] else None
        body = f"chunk {n}.{step} of job_{n}\n"
        text = _running(10 + n, body) if code is None else _exited(code, body)
        if step == 0:
            lines += [call(f"e{n}", "exec_command", {"cmd": f"job {n}"}), output(f"e{n}", text)]
        else:
            lines += [_poll(f"p{n}.{step}", 10 + n), output(f"p{n}.{step}", text)]
        lines.append(tokens())
    return lines, {f"job {n}": ends[n] for n in range(count)}


@settings(max_examples=150)
@given(_exec_sessions())
def test_polls_join_their_command_in_any_interleaving(
    sessions: tuple[list[dict[str, Any]], dict[str, int | None]],
) -> None:
    """Property: however sessions interleave, each exec_command is one command whose outcome
    is its ending poll's code (unknown while running); every error is a command's; the store
    keeps a poll key only for the sessions still open; folding every envelope twice changes
    nothing."""
    lines, expected = sessions
    store = DictStore()
    state = fold(lines, store)
    got = {c["command"]: c["exit"] for c in state["commands"]}
    assert got == expected
    for command in state["commands"]:
        code = expected[command["command"]]
        status = "unknown" if code is None else ("ok" if code == 0 else "failed")
        assert command["status"] == status
        assert (command["error"] is not None) == (code not in (None, 0))
        assert "Chunk ID" not in command["excerpt"]
    assert all(e["tool"] == "bash" and e["command"] for e in state["errors"])
    open_keys = sorted(k for k in store if "/ledger/exec/" in k)
    running = sorted(str(10 + int(c.split()[1])) for c, code in expected.items() if code is None)
    assert [k.rsplit("/", 1)[1] for k in open_keys] == running
    twice = DictStore()
    ledger = LedgerFold(twice)
    for envelope in envelopes(lines):
        ledger.apply(envelope)
        ledger.apply(envelope)
    assert canonical_json(snapshot(twice, SID)) == canonical_json(state)


class _Crash(Exception):
    """The worker died."""


class _CrashingStore(DictStore):
    """A store that keeps values as bytes, as a changelog does (a value read is a copy, not
    the object the fold changes), and whose next write of the ledger head dies (`armed`)."""

    armed = False

    def get(self, key: str) -> Any | None:
        found = super().get(key)
        return None if found is None else orjson.loads(found)

    def put(self, key: str, value: Any) -> None:
        if self.armed and key == ledger_key(SID, "head"):
            self.armed = False
            raise _Crash
        super().put(key, orjson.dumps(value))


@settings(max_examples=50)
@given(st.integers(1, 3), st.booleans())
def test_a_poll_folded_again_after_a_crash_before_its_head_is_joined_once(
    polls: int, ends: bool
) -> None:
    """Property: a crash after a poll's rows but before its head, then the poll folded again
    (redelivery), gives the state of one fold: its output joined once, one error."""
    lines = [call("e1", "exec_command", {"cmd": "make"}), output("e1", _running(3, "start\n"))]
    for n in range(1, polls + 1):
        body = f"step {n}: error in job_{n}\n"
        text = _exited(2, body) if ends and n == polls else _running(3, body)
        lines += [tokens(), _poll(f"p{n}", 3), output(f"p{n}", text)]
    whole = fold(lines)
    store = _CrashingStore()
    ledger = LedgerFold(store)
    for envelope in envelopes(lines):
        message = envelope.payload.entry.get("message") or {}
        is_poll = message.get("toolName") == "write_stdin"
        store.armed = is_poll
        try:
            ledger.apply(envelope)
        except _Crash:
            ledger.apply(envelope)  # redelivered: the head never said it was folded
    assert canonical_json(snapshot(store, SID)) == canonical_json(whole)
    assert sorted(k for k in store if "/exec/" in k) == (
        [] if ends else [ledger_key(SID, "exec", 3)]
    )
    (command,) = whole["commands"]
    assert command["excerpt"].count(f"step {polls}:") == 1
    assert len(whole["errors"]) == (1 if ends else 0)


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
