"""The ledger's command readers against the code they replaced (kept here as the oracle).

`error_head` reads a failed output's lines from its end (or start) only as far as its answer
needs; `result_outcome` takes the text the entry's facts already joined. Both must answer as
the whole-output readings did, on any output.
"""

from __future__ import annotations

import re
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from sessionfold.projections.ledger import commands
from sessionfold.projections.ledger.text import message_text
from sessionfold.projections.pruning.entry_facts import entry_facts

_OLD_NOISE = commands._NOISE
_OLD_TELLING = commands._TELLING
_FAILURE_START = commands._FAILURE_START
_BANNER = commands._BANNER


def old_error_head(text: str, limit: int, *, last: bool = False) -> str:
    """`commands.error_head` as it was: every line stripped and matched, then chosen."""
    lines = [line.strip() for line in text.splitlines()]
    meaningful = [line for line in lines if line and not _OLD_NOISE.match(line)]
    if not meaningful:
        return ""
    if not last:
        return meaningful[0][:limit]
    window = meaningful[-30:]
    # The newest line of the first kind that has one: naming what failed, telling of a
    # failure outside a banner, a telling banner, any (`failure_line`'s rule).
    naming = [line for line in window if _FAILURE_START.match(line)]
    telling = [line for line in window if _OLD_TELLING.search(line)]
    plain = [line for line in telling if not _BANNER.fullmatch(line)]
    return (naming or plain or telling or window)[-1][:limit]


#: Lines near the readers' edges: noise lines (exit lines, debugger chatter, `> ` prompts),
#: telling words in any case, plain lines, blank and space-only lines, and every line break
#: `splitlines` takes.
_LINES = st.sampled_from(
    (
        "Command exited with code 1",
        "Exit code 2",
        "Command aborted",
        "(no output)",
        "Debugger attached.",
        "Node.js v20.1.0",
        "> npm test",
        "Error: boom",
        "FAILED x",
        "=== 1 failed ===",
        "AssertionError: no",
        "E   assert 1",
        "cannot open",
        "× nope",
        "plain line",
        "ok",
        "",
        "   ",
        "\tindented error",
    )
)
_BREAKS = st.sampled_from(("\n", "\r\n", "\r", "\x0b", "\x1c", "\u2028", "\x85"))


@st.composite
def _outputs(draw: st.DrawFn) -> str:
    lines = draw(st.lists(_LINES, max_size=80))
    breaks = draw(st.lists(_BREAKS, min_size=len(lines), max_size=len(lines)))
    return "".join(line + brk for line, brk in zip(lines, breaks, strict=True))


@settings(max_examples=2000)
@example("\n".join(["Error: early"] + ["plain line"] * 30), 40, True)  # telling, 31 back
@example("\n".join(["Error: early"] + ["plain line"] * 29), 40, True)  # and 30 back
@given(st.one_of(_outputs(), st.text(max_size=200)), st.integers(0, 40), st.booleans())
def test_error_head_reads_as_far_as_needed_and_answers_as_the_whole_reading(
    text: str, limit: int, last: bool
) -> None:
    """Property: `error_head` equals the reading of every line, first or last, any limit."""
    assert commands.error_head(text, limit, last=last) == old_error_head(text, limit, last=last)


@settings(max_examples=500)
@given(
    st.one_of(
        st.text(max_size=60),
        st.none(),
        st.integers(),
        st.lists(
            st.one_of(
                st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=40)}),
                st.fixed_dictionaries({"type": st.just("text"), "text": st.integers()}),
                st.fixed_dictionaries({"type": st.just("image")}),
                st.text(max_size=5),
            ),
            max_size=4,
        ),
    ),
    st.sampled_from(("", "\nCommand exited with code 3", "Exit code 1\n", "\nCommand aborted")),
    st.booleans(),
)
def test_result_outcome_read_from_the_facts_text_is_the_outcome_of_the_message(
    content: object, tail: str, is_error: bool
) -> None:
    """Property: the text a tool result's facts hold is the text `result_outcome` reads from
    the message, so the outcome read from the facts' text is the message's."""
    if isinstance(content, str):
        content = content + tail
    elif isinstance(content, list):
        content = [*content, {"type": "text", "text": tail}]
    message = {"role": "toolResult", "toolCallId": "c1", "toolName": "bash"}
    message |= {"content": content, "isError": is_error, "timestamp": 1}
    entry = {"type": "message", "id": "e1", "parentId": None, "message": message}
    facts = entry_facts(entry)
    assert facts.text == message_text(message)
    assert commands.result_outcome(message, facts.text) == commands.result_outcome(message)


def old_result_outcome(message: dict[str, Any]) -> commands.Outcome:
    """`commands.result_outcome` as it was: a new Outcome built for every result."""
    details = message.get("details")
    if isinstance(details, dict):
        code = details.get("exitCode")
        if isinstance(code, int) and not isinstance(code, bool):
            return commands.Outcome(code, "ok" if code == 0 else "failed")
    text = message_text(message)
    leading = re.match(r"\AExit code (-?\d+)[ \t]*(?:\n|\Z)", text)
    if leading:
        code = int(leading.group(1))
        return commands.Outcome(code, "ok" if code == 0 else "failed")
    tail = text[-400:]
    match = re.search(r"Command exited with code (-?\d+)\s*\Z", tail)
    if match:
        code = int(match.group(1))
        return commands.Outcome(code, "ok" if code == 0 else "failed")
    aborted = re.search(r"Command (aborted|timed out[^\n]*)\s*\Z", tail)
    if aborted:
        return commands.Outcome(None, "aborted" if aborted.group(1) == "aborted" else "timeout")
    if message.get("isError") is True:
        return commands.Outcome(None, "failed")
    return commands.Outcome(0, "ok")


def old_execution_outcome(message: dict[str, Any]) -> commands.Outcome:
    """`commands.execution_outcome` as it was."""
    if message.get("cancelled") is True:
        return commands.Outcome(None, "cancelled")
    code = message.get("exitCode")
    if isinstance(code, int) and not isinstance(code, bool):
        return commands.Outcome(code, "ok" if code == 0 else "failed")
    return commands.Outcome(None, "unknown")


_CODES = st.one_of(
    st.integers(-300, 300), st.integers(), st.booleans(), st.none(), st.just("1"), st.just(1.0)
)
_ENDINGS = st.sampled_from(
    ("", "Command exited with code ", "Exit code ", "Command aborted", "Command timed out x")
)


@settings(max_examples=2000)
@given(_CODES, _ENDINGS, st.booleans(), st.booleans(), st.booleans())
def test_outcomes_made_once_are_the_outcomes_built_each_time(
    code: Any, ending: str, with_details: bool, is_error: bool, cancelled: bool
) -> None:
    """Property: the outcomes the readers share (each usual exit code's, each status's) are
    the ones they built for every result and `!` run, exit code and status alike."""
    number = str(code) if isinstance(code, int) and not isinstance(code, bool) else ""
    text = ending + number if ending.endswith(" ") else ending
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": is_error}
    if with_details:
        result["details"] = {"exitCode": code}
    assert commands.result_outcome(result) == old_result_outcome(result)
    run = {"exitCode": code, "cancelled": cancelled}
    assert commands.execution_outcome(run) == old_execution_outcome(run)
