"""Exit codes that agents' shell outputs state in their text, read the same by the readers that
map a format (events/formats) and by the ledger that reads commands (projections/ledger)."""

from __future__ import annotations

import re

# Codex refuses a command its sandbox stopped with an error that states the code before the
# command's own output ("failed in sandbox LinuxSeccomp with execution error: sandbox denied
# exec error, exit code: 2, stdout: ..."; `exit_code: 2` where it prints the error's fields).
_SANDBOX_FAILURE = re.compile(r"failed in sandbox|sandbox denied exec error")
_SANDBOX_EXIT = re.compile(r"\bexit[ _]code: (-?\d+)")
#: How far into an output the sandbox error's words, and after them its code, are looked for.
_SANDBOX_REACH = 1000


def sandbox_exit(text: str) -> int | None:
    """The exit code a Codex sandbox failure states, or None: the first `exit code: N` after
    its words, so a code the command printed later is not read."""
    failure = _SANDBOX_FAILURE.search(text, 0, _SANDBOX_REACH)
    if failure is None:
        return None
    code = _SANDBOX_EXIT.search(text, failure.end(), failure.end() + _SANDBOX_REACH)
    return int(code.group(1)) if code else None
