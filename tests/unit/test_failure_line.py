"""One rule for a failed call's failure line (ledger/commands.py `failure_line`): the ledger's
error entry and the offline summary's error line quote the same line of the same output."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_ledger_fold import SID, bash_call, fold_all, result
from test_summarizer import _call

from sessionfold.ports.summarizer import offline_summary
from sessionfold.projections.ledger import commands
from sessionfold.projections.ledger.fold import LedgerFold
from sessionfold.projections.ledger.state import snapshot
from sessionfold.projections.store import DictStore

#: `pytest -x -q` on a failing test, as pi's bash tool returns it.
PYTEST_FAILED = """.F
=================================== FAILURES ===================================
__________________________________ test_read ___________________________________

    def test_read():
>       assert read_file("a.txt") == "hello"
E       AssertionError: assert 'hell' == 'hello'

test_io.py:7: AssertionError
=========================== short test summary info ============================
FAILED test_io.py::test_read - AssertionError
!!!!!!!!!!!!!!!!!!!!!!!!!! stopping after 1 failures !!!!!!!!!!!!!!!!!!!!!!!!!!!
1 failed, 1 passed in 0.03s


Command exited with code 1"""
FAILED_LINE = "FAILED test_io.py::test_read - AssertionError"


def _ledger_head(output: str, tool: str = "bash") -> str:
    store = DictStore()
    call = bash_call(1, "c1", "pytest -x -q")
    if tool != "bash":
        block = call.payload.entry["message"]["content"][0]
        block["name"] = tool
    fold_all(LedgerFold(store), [call, result(2, "c1", output, error=True, tool=tool)])
    errors = snapshot(store, SID)["errors"]
    return str(errors[0]["head"]) if errors else ""


def _summary_line(output: str, tool: str = "bash") -> str:
    # Long enough that the bullet keeps its full detail (it never outgrows the raw output).
    call = _call("c1", tool, {"command": "pytest -x -q"}, output, error=True, truncated=10_000)
    text = offline_summary([call], ["t1"])
    bullet = text.split("\n")[0]
    _, _, quoted = bullet.partition("error line: `")
    return quoted.removesuffix("`")


def test_a_failing_test_run_quotes_the_failed_test_in_both() -> None:
    """The issue's case: both quote `FAILED test_io.py::test_read`, not the first line (`.F`)
    nor the `FAILURES` banner nor the count."""
    assert _ledger_head(PYTEST_FAILED) == FAILED_LINE
    assert _summary_line(PYTEST_FAILED) == FAILED_LINE


def test_a_line_that_names_the_failure_beats_a_count_and_a_banner() -> None:
    """Read from the end: a line starting with what failed, else a telling line, else a banner."""
    assert commands.failure_line("Error: boom\n1 failed\n=== end ===", 200, shell=True) == (
        "Error: boom"
    )
    assert commands.failure_line("=== FAILURES ===\n1 failed\nok", 200, shell=True) == "1 failed"
    assert commands.failure_line("x\n=== FAILURES ===\nok", 200, shell=True) == "=== FAILURES ==="
    assert commands.failure_line("first\nError: late", 200, shell=False) == "first"


_LINES = st.sampled_from(
    (
        ".F",
        "=== FAILURES ===",
        "FAILED test_io.py::test_read - AssertionError",
        "E       AssertionError: assert 1 == 2",
        "1 failed, 2 passed in 0.1s",
        "Error: Cannot find module 'y'",
        "error[E0308]: mismatched types",
        "plain line",
        "`back` ticks and a path src/a.py",
        "Command exited with code 1",
        "",
    )
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_LINES, min_size=1, max_size=40), st.sampled_from(("bash", "Bash", "read")))
def test_the_ledger_and_the_offline_summary_quote_the_same_failure_line(
    lines: list[str], tool: str
) -> None:
    """Property: for any failed output of a shell or another tool, the summary's error line is
    the ledger's error head (the summary clips it to 120 characters, backticks made quotes)."""
    output = "\n".join(lines)
    head = _ledger_head(output, tool)
    expected = head.replace("`", "'")
    expected = expected if len(expected) <= 120 else expected[:119] + "…"
    if tool == "read" or head not in ("", "exit 1", "failed"):
        assert _summary_line(output, tool) == expected
