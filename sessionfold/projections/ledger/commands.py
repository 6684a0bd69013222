"""Bash commands and their outcomes, read from pi entries: tool calls, results, `!` runs."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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


def result_outcome(message: dict[str, Any], text: str | None = None) -> Outcome:
    """The outcome of a bash tool result: `details.exitCode`, else pi's trailing exit line.
    `text`: the message's text (`message_text`), when the caller has it already."""
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
    if message.get("isError") is True:
        return _WITHOUT_EXIT["failed"]
    return _EXITED[0]


def execution_outcome(message: dict[str, Any]) -> Outcome:
    """The outcome of a user's `!` bashExecution message."""
    if message.get("cancelled") is True:
        return _WITHOUT_EXIT["cancelled"]
    code = message.get("exitCode")
    if isinstance(code, int) and not isinstance(code, bool):
        return _exited(code)
    return _UNKNOWN


def error_head(text: str, limit: int, *, last: bool = False) -> str:
    """The line that best names an error, capped: the first meaningful one, or the last.

    Bash output ends with pi's exit line, the failing program's last words just before it
    (`last=True`: the last line of the last 30 meaningful ones that tells of a failure, else
    the last meaningful one); other tools state their error first. Lines are read from the end
    (or the start) only as far as the answer needs: a long output's other lines are not
    stripped and matched.
    """
    lines = text.splitlines()
    if not last:
        for line in lines:
            line = line.strip()
            if line and not _NOISE.match(line):
                return line[:limit]
        return ""
    newest = None
    read = 0
    for line in reversed(lines):
        line = line.strip()
        if not line or _NOISE.match(line):
            continue
        if _TELLING.search(line):
            return line[:limit]
        if newest is None:
            newest = line
        read += 1
        if read == 30:
            break
    return "" if newest is None else newest[:limit]


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
