"""Bash commands and their outcomes, read from pi entries: tool calls, results, `!` runs."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from sessionfold.events.exit_codes import sandbox_exit
from sessionfold.projections.ledger.text import message_text
from sessionfold.projections.pruning.digest import path_argument
from sessionfold.projections.pruning.entry_facts import CallFact

# pi's bash tool appends one of these lines to its output (seen in real sessions).
_EXIT_LINE = re.compile(r"Command exited with code (-?\d+)\s*\Z")
# Claude Code's Bash tool starts a failed command's output with this line instead.
_LEADING_EXIT = re.compile(r"\AExit code (-?\d+)[ \t]*(?:\n|\Z)")
_ABORTED = re.compile(r"Command (aborted|timed out[^\n]*)\s*\Z")
_NOISE = re.compile(
    r"^(Command exited with code -?\d+|Exit code -?\d+|Command aborted|\(no output\)"
    r"|Debugger attached\.?|Waiting for the debugger to disconnect\.*|Node\.js v[\d.]+|> .*)$"
)
_TELLING = re.compile(r"error|fail|not found|no such|cannot|can't|denied|invalid|refused|×", re.I)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a command ended: its exit code when known, and a status word."""

    exit: int | None
    status: str  # ok | failed | aborted | timeout | cancelled | unknown

    @property
    def failed(self) -> bool:
        """True for every outcome but a clean exit (or an unknown one)."""
        return self.status not in ("ok", "unknown")


#: The outcome of each usual exit code, and of each status without one, made once: a frozen
#: dataclass takes microseconds to build, and every command result reads one.
_EXITED = {code: Outcome(code, "ok" if code == 0 else "failed") for code in range(-128, 256)}
_WITHOUT_EXIT = {
    status: Outcome(None, status) for status in ("failed", "aborted", "timeout", "cancelled")
}
_UNKNOWN = Outcome(None, "unknown")


def _exited(code: int) -> Outcome:
    """The outcome of a command that exited with `code`."""
    found = _EXITED.get(code)
    return found if found is not None else Outcome(code, "ok" if code == 0 else "failed")


#: Shell tools by name, whatever agent wrote the session: their calls are the ledger's commands.
#: pi `bash`; Claude Code `Bash`; Codex `shell` and `local_shell` (an argv `command`) and
#: `exec_command` (`cmd`).
SHELL_TOOLS = frozenset({"bash", "Bash", "shell", "local_shell", "exec_command"})
#: Codex's unified exec poll: `write_stdin` reads more of a process `exec_command` started.
POLL_TOOL = "write_stdin"
#: Tools whose every output states how its command ended (Codex writes the code into the
#: output it returns), so an output that states nothing is an unknown outcome. pi's `bash` and
#: Claude Code's `Bash` write a code only when the command failed: their silence is a clean exit.
STATING_TOOLS = frozenset({"shell", "local_shell", "exec_command", POLL_TOOL})
# An argv that runs its last word as a script: the script is the command line.
_SHELLS = frozenset({"bash", "sh", "zsh", "dash", "/bin/bash", "/bin/sh", "/bin/zsh"})


def bash_calls(calls: Sequence[CallFact]) -> list[tuple[str, str]]:
    """(tool-call id, command) of every shell tool call (`SHELL_TOOLS`) of an assistant (its
    facts' calls)."""
    found: list[tuple[str, str]] = []
    for call in calls:
        if call.name not in SHELL_TOOLS or not isinstance(call.id, str):
            continue
        arguments = call.arguments
        found.append((call.id, command_text(arguments) if isinstance(arguments, dict) else ""))
    return found


def command_text(arguments: dict[str, Any]) -> str:
    """A shell call's command line: `command` (a string, or an argv list such as
    ["bash", "-lc", "..."], whose script is the line) or `cmd`."""
    command = arguments.get("command", arguments.get("cmd"))
    if isinstance(command, str):
        return command
    if not isinstance(command, list) or not all(isinstance(word, str) for word in command):
        return ""
    if len(command) == 3 and command[0] in _SHELLS and command[1] in ("-c", "-lc", "-ic"):
        return str(command[2])
    return shlex.join(command)


def result_outcome(
    message: dict[str, Any], text: str | None = None, shell: ShellOutput | None = None
) -> Outcome:
    """The outcome of a bash tool result: `details.exitCode`, else the exit line pi or Claude
    Code writes; for a tool of `STATING_TOOLS`, else the code its framing or a sandbox failure
    states, else failed (isError) or unknown. `text`: the message's text (`message_text`), and
    `shell`: its `shell_output`, when the caller has them already."""
    details = message.get("details")
    if isinstance(details, dict):
        code = details.get("exitCode")
        if isinstance(code, int) and not isinstance(code, bool):
            return _exited(code)
    if text is None:
        text = message_text(message)
    leading = _LEADING_EXIT.match(text)
    if leading:
        return _exited(int(leading.group(1)))
    tail = text[-400:]
    match = _EXIT_LINE.search(tail)
    if match:
        return _exited(int(match.group(1)))
    aborted = _ABORTED.search(tail)
    if aborted:
        return _WITHOUT_EXIT["aborted" if aborted.group(1) == "aborted" else "timeout"]
    stating = message.get("toolName") in STATING_TOOLS
    if stating:
        if shell is None:
            shell = shell_output(text, POLL_TOOL)
        code = shell.exit if shell.exit is not None else sandbox_exit(text)
        if code is not None:
            return _exited(code)
    if message.get("isError") is True:
        return _WITHOUT_EXIT["failed"]
    return _UNKNOWN if stating else _EXITED[0]


@dataclass(frozen=True, slots=True)
class ShellOutput:
    """A shell output read apart from the agent's framing: what the command printed, the exit
    code the framing states, and the unified exec session of a process still running."""

    text: str
    exit: int | None = None
    session: str | None = None


# One line of the header Codex puts above a shell output: the freeform one (`Exit code: N`,
# `Wall time: ...`, `Total output lines: N`) and unified exec's (`Chunk ID: ...`, `Wall time`,
# `Process exited with code N` or `Process running with session ID N`, `Original token
# count: N`). The header ends at an `Output:` line; the rest is what the command printed.
_FRAMING_LINE = re.compile(
    r"(?:Chunk ID: \S*|Wall time: [\d.]+ seconds|Original token count: \d+"
    r"|Total output lines: \d+|Exit code: (?P<code>-?\d+)"
    r"|Process exited with code (?P<exited>-?\d+)"
    r"|Process running with session ID (?P<session>\d+))[ \t\r]*"
)
_OUTPUT_LINE = re.compile(r"Output:[ \t\r]*")
#: The most header lines Codex writes above an output.
_FRAMING_LINES = 8


def shell_output(text: str, tool: object) -> ShellOutput:
    """A shell tool's output as the command printed it. A Codex tool's (`STATING_TOOLS`) is
    read apart from its framing: the 0.40 JSON wrapper `{"output", "metadata": {"exit_code"}}`
    decoded, or the header above an `Output:` line left out; any other output is as it is."""
    if tool not in STATING_TOOLS:
        return ShellOutput(text)
    if text.startswith("{"):
        return _json_output(text)
    code: int | None = None
    session: str | None = None
    start = 0
    for lines in range(_FRAMING_LINES + 1):
        end = text.find("\n", start)
        stop = len(text) if end < 0 else end
        if lines and _OUTPUT_LINE.fullmatch(text, start, stop):
            return ShellOutput(text[stop + 1 :], code, session)
        line = _FRAMING_LINE.fullmatch(text, start, stop) if lines < _FRAMING_LINES else None
        if line is None:
            break
        found = line.group("code") or line.group("exited")
        code = int(found) if found is not None else code
        running = line.group("session")
        session = str(int(running)) if running is not None else session
        if end < 0:
            return ShellOutput("", code, session)  # a header with no output under it
        start = end + 1
    return ShellOutput(text)


def _json_output(text: str) -> ShellOutput:
    """Codex 0.40's `{"output": ..., "metadata": {"exit_code": N, ...}}`, decoded; any other
    text as it is."""
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        return ShellOutput(text)
    if not isinstance(parsed, dict) or not isinstance(parsed.get("output"), str):
        return ShellOutput(text)
    metadata = parsed.get("metadata")
    if not isinstance(metadata, dict):
        return ShellOutput(text)
    code = metadata.get("exit_code")
    known = isinstance(code, int) and not isinstance(code, bool)
    return ShellOutput(parsed["output"], code if known else None)


def poll_calls(calls: Sequence[CallFact]) -> list[tuple[str, str]]:
    """(tool-call id, unified exec session id) of every `write_stdin` call of an assistant."""
    found: list[tuple[str, str]] = []
    for call in calls:
        if call.name != POLL_TOOL or not isinstance(call.id, str):
            continue
        arguments = call.arguments
        session = arguments.get("session_id") if isinstance(arguments, dict) else None
        if isinstance(session, int) and not isinstance(session, bool) and session >= 0:
            found.append((call.id, str(session)))
        elif isinstance(session, str) and session.isdecimal() and session.isascii():
            found.append((call.id, str(int(session))))
    return found


def execution_outcome(message: dict[str, Any]) -> Outcome:
    """The outcome of a user's `!` bashExecution message."""
    if message.get("cancelled") is True:
        return _WITHOUT_EXIT["cancelled"]
    code = message.get("exitCode")
    if isinstance(code, int) and not isinstance(code, bool):
        return _exited(code)
    return _UNKNOWN


#: A line that starts by saying what failed, the test runner's or the compiler's verdict:
#: `FAILED test_io.py::test_read`, `FAIL src/a.test.ts`, `ERROR ...`, `error[E0308]: ...`,
#: `fatal: ...`, `Error: ...`, `AssertionError: ...`.
_FAILURE_START = re.compile(
    r"(?:FAIL(?:ED)?\b|ERROR\b|error(?:\[\w+\])?:|fatal:|[\w.]*(?:Error|Exception)(?::|$))"
)
#: A decorated banner (`===== FAILURES =====`, `--- 1 failed ---`): it heads what failed and
#: names nothing, so it is the answer only when no other line tells of a failure.
_BANNER = re.compile(r"[=\-_*#~]{3,}.*[=\-_*#~]{3,}|[=\-_*#~]{3,}")


def is_shell_tool(tool: object) -> bool:
    """True for a shell tool or a unified exec poll: its output ends with the failing program's
    last words, so its failure line is read from the end."""
    return isinstance(tool, str) and (tool in SHELL_TOOLS or tool == POLL_TOOL)


def failure_line(text: str, limit: int, *, shell: bool) -> str:
    """The line that tells why a failed call failed, capped: the one rule for the ledger's
    error entries and the offline summary's error line. A shell tool's is `error_head`'s
    last reading, any other tool's its first."""
    return error_head(text, limit, last=shell)


def error_head(text: str, limit: int, *, last: bool = False) -> str:
    """The line that best names an error, capped: the first meaningful one, or the last.

    Bash output ends with pi's exit line, the failing program's last words just before it
    (`last=True`): of the last 30 meaningful lines, read from the end, the newest that starts
    by saying what failed (`_FAILURE_START`: `FAILED test_io.py::test_read`, `Error: ...`),
    else the newest that tells of a failure and is not a banner (`=== 1 failed ===`), else
    the newest banner that does, else the last meaningful line. Other tools state their error
    first. Lines are read from the end (or the start) only as far as the answer needs: a long
    output's other lines are not stripped and matched.
    """
    lines = text.splitlines()
    if not last:
        for line in lines:
            line = line.strip()
            if line and not _NOISE.match(line):
                return line[:limit]
        return ""
    newest = telling = banner = None
    read = 0
    for line in reversed(lines):
        line = line.strip()
        if not line or _NOISE.match(line):
            continue
        if _FAILURE_START.match(line):
            return line[:limit]
        if _TELLING.search(line):
            if not _BANNER.fullmatch(line):
                telling = telling or line
            else:
                banner = banner or line
        if newest is None:
            newest = line
        read += 1
        if read == 30:
            break
    found = telling or banner or newest
    return "" if found is None else found[:limit]


def excerpt(text: str, limit: int) -> str:
    """Head and tail of an output, `limit` characters each, joined by " … "."""
    if len(text) <= 2 * limit:
        return text
    return text[:limit] + " … " + text[-limit:]


#: The agents' file tools and what a successful call did to its file (as pi's own compaction
#: tracks <read-files> and <modified-files>): pi's, then Claude Code's.
FILE_TOOLS = {
    "read": "read",
    "edit": "modified",
    "write": "modified",
    "Read": "read",
    "Edit": "modified",
    "MultiEdit": "modified",
    "Write": "modified",
    "NotebookEdit": "modified",
}


def file_calls(calls: Sequence[CallFact]) -> list[tuple[str, str, str]]:
    """(tool-call id, path, read|modified) of every file tool call of an assistant (its facts'
    calls)."""
    found: list[tuple[str, str, str]] = []
    for call in calls:
        op = FILE_TOOLS.get(str(call.name))
        if not op or not isinstance(call.id, str):
            continue
        path = path_argument(call.arguments)
        if isinstance(path, str) and path.strip():
            found.append((call.id, path.strip(), op))
    return found


def unfixed_errors(commands: list[dict[str, Any]], errors: list[dict[str, Any]]) -> list[str]:
    """Ids of a span's command errors that no later run of the same command fixed.

    A failed command counts as fixed when the same command line ran again later in the span
    and exited cleanly; errors of other tools are not judged here.
    """
    unfixed = []
    by_id = {row["id"]: row for row in commands}
    for error in errors:
        command = by_id.get(error.get("command") or "")
        if command is None:
            continue
        later_ok = any(
            row.get("command") == command.get("command")
            and row.get("status") == "ok"
            and int(row.get("seq", 0)) > int(command.get("seq", 0))
            for row in commands
        )
        if not later_ok:
            unfixed.append(error["id"])
    return unfixed
