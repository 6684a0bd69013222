"""The ledger's command readers against the code they replaced (kept here as the oracle).

`error_head` reads a failed output's lines from its end (or start) only as far as its answer
needs; `result_outcome` takes the text the entry's facts already joined. Both must answer as
the whole-output readings did, on any output.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from sessionfold.projections.ledger import commands
from sessionfold.projections.ledger.text import message_text
from sessionfold.projections.pruning.entry_facts import entry_facts

_OLD_NOISE = commands._NOISE
_OLD_TELLING = commands._TELLING


def old_error_head(text: str, limit: int, *, last: bool = False) -> str:
    """`commands.error_head` as it was: every line stripped and matched, then chosen."""
    lines = [line.strip() for line in text.splitlines()]
    meaningful = [line for line in lines if line and not _OLD_NOISE.match(line)]
    if not meaningful:
        return ""
    if not last:
        return meaningful[0][:limit]
    telling = [line for line in meaningful[-30:] if _OLD_TELLING.search(line)]
    return (telling or meaningful)[-1][:limit]


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
