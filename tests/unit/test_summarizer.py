"""The model port's text formats (reference §6.1, §6.4) and the offline summarizer."""

from __future__ import annotations

import re
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.events.flush import FlushBatch, FlushCall, FlushRequestPayload
from sessionfold.ports import summarizer
from sessionfold.ports.summarizer import (
    OfflineSummarizer,
    batch_prompt,
    offline_summary,
    substitute_inline_refs,
    summary_footer,
)
from sessionfold.projections.pruning.capture import js_length
from sessionfold.projections.text_lines import line_at


def _call(
    call_id: str,
    name: str = "bash",
    args: dict | None = None,
    head: str = "ok\n" * 500,
    *,
    error: bool = False,
    truncated: int = 0,
    ref: str | None = None,
) -> FlushCall:
    return FlushCall(
        key=f"{call_id}@1",
        tool_call_id=call_id,
        tool_name=name,
        arguments=args if args is not None else {"command": "npm test"},
        is_error=error,
        raw_chars=len(head) + truncated,
        content_hash="h",
        head=head,
        truncated_chars=truncated,
        seq=1,
        ref=ref,
    )


def _request(*batches: FlushBatch) -> FlushRequestPayload:
    return FlushRequestPayload(
        request_id="s:9", session_id="s", seq=9, trigger="manual", model="offline", batches=batches
    )


def test_prompt_labels_are_contiguous_whatever_the_ids() -> None:
    """Calls are labelled [[1:name]]..[[N:name]] in order, with args as indented JSON."""
    batch = FlushBatch(
        turn_index=0,
        timestamp=0,
        assistant_text="Looking.",
        disposition="summarize",
        calls=(_call("zz", "read", {"path": "/a"}), _call("aa", head="boom", error=True)),
    )
    prompt = batch_prompt(batch)
    assert "<tool-call-batch>\nAssistant said: Looking.\n[[1:read]] Tool: read({\n" in prompt
    assert '  "path": "/a"\n})\nResult (OK): ok' in prompt
    assert "\n---\n[[2:bash]] Tool: bash(" in prompt
    assert "Result (ERROR): boom\n</tool-call-batch>" in prompt


def test_prompt_marks_truncated_results() -> None:
    """A result cut to its head says how many chars were left out."""
    batch = FlushBatch(
        turn_index=0,
        timestamp=0,
        disposition="summarize",
        calls=(_call("a", head="x" * 2000, truncated=345),),
    )
    assert "x ...[345 chars truncated]\n</tool-call-batch>" in batch_prompt(batch)
    assert "Assistant said" not in batch_prompt(batch)


def test_inline_refs_replace_matching_leading_labels() -> None:
    """A line-leading label naming the right tool becomes its ref, case and spaces aside."""
    text = "- [[1:Read]]   read the file\n* [[2:bash]] ran tests\n  [[2:bash]] again"
    assert substitute_inline_refs(text, ["t7", "t8"], ["read", "bash"]) == (
        "- `t7` read the file\n* `t8` ran tests\n  `t8` again"
    )


def test_mismatched_out_of_range_and_inline_labels_are_stripped() -> None:
    """Wrong names, N=0, out-of-range and mid-line labels vanish; fenced lines stay untouched."""
    text = (
        "- [[1:bash]] wrong name\n- [[0:read]] zero\n- [[3:read]] out of range\n"
        "1. [[1:read]] numbered\nsee [[1:read]] here\n```\n[[1:read]] fenced\n```\n[single]"
    )
    assert substitute_inline_refs(text, ["t1"], ["read"]) == (
        "- wrong name\n- zero\n- out of range\n1. numbered\nsee here\n```\n[[1:read]] fenced\n"
        "```\n[single]"
    )


def test_footer_lists_the_refs() -> None:
    """The footer is a rule, the refs in backticks, and the recovery hint."""
    assert summary_footer(["t1", "t2"]) == (
        "\n\n---\n**Summarized tool refs**: `t1`, `t2`\n"
        "Use `context_tree_query` with these refs to retrieve the original full outputs."
    )


def test_offline_bullets_say_tool_gist_outcome_and_error_line() -> None:
    """One bullet per call: ref, tool, argument gist, outcome, size and its error line."""
    calls = [
        _call("a", "read", {"path": "src/main.ts"}, head="import x\n" * 200),
        _call("b", head="running\nError: Cannot find module 'y'\n" + "." * 2000, error=True),
        _call("c", head="wrote build/out/app.js\n" + "." * 2000),
    ]
    text = offline_summary(calls, ["t1", "t2", "t3"])
    lines = text.split("\n")
    assert lines[0] == "- `t1` read `src/main.ts`: ok, 1800 chars"
    assert lines[1].startswith("- `t2` bash `npm test`: error, ")
    assert lines[1].endswith("error line: `Error: Cannot find module 'y'`")
    assert lines[2].endswith("printed `build/out/app.js`")
    assert text.endswith(summary_footer(["t1", "t2", "t3"]))


def test_offline_summary_is_never_longer_than_the_raw_output() -> None:
    """With little raw output the bullets lose detail until the text fits."""
    calls = [_call(f"c{n}", head="e" * 60, args={"command": "x" * 70}) for n in range(5)]
    text = offline_summary(calls, [f"t{n}" for n in range(5)])
    assert js_length(text) <= 300
    assert text.startswith("- `t0` bash: ok\n")


def test_offline_summarizer_answers_each_batch_and_echoes_skips() -> None:
    """Summarized batches get text and refs; skipped ones are echoed; it is deterministic."""
    request = _request(
        FlushBatch(turn_index=0, timestamp=0, disposition="skipped-trivial", calls=(_call("a"),)),
        FlushBatch(
            turn_index=1,
            timestamp=0,
            disposition="summarize",
            calls=(_call("b", ref="t4"), _call("c", ref="t5")),
        ),
    )
    answer = OfflineSummarizer().summarize(request)
    assert answer == OfflineSummarizer().summarize(request)
    assert answer.request_id == "s:9" and answer.model == "offline"
    trivial, summarized = answer.results
    assert (trivial.batch, trivial.outcome, trivial.text) == (0, "skipped-trivial", None)
    assert summarized.outcome == "summarized" and summarized.refs == ("t4", "t5")
    assert summarized.text is not None and "`t4`" in summarized.text and "`t5`" in summarized.text
    assert answer.usage.calls == 1


#: Every character `str.splitlines` ends a line at (asked of it, not of the code under test).
_BREAKS = [c for c in map(chr, range(0x3000)) if len(f"a{c}b".splitlines()) == 2]

#: Pieces of a tool's output near the error words: the words in several cases, every line
#: break `str.splitlines` knows, blanks, and non-ASCII letters re.I equates with ASCII ones
#: (alone and in the words).
_ERROR_PIECES = st.sampled_from(
    (
        *summarizer._ERROR_WORDS,
        "ERROR",
        "Failed",
        "NOT FOUND",
        "not  found",
        "Traceback (most recent call last):",
        *_BREAKS,
        "\r\n",
        " ",
        "\t",
        "ok",
        "x",
        "é",
        "K",
        "ſ",
        "İ",
        "ı",
        "…",
        "faıled",
        "denİed",
        "tracebac\u212a",
    )
)


def _first_error_line_by_lines(text: str) -> str | None:
    """What `_first_error_line` replaces: every stripped line tried in order."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return next((line for line in lines if summarizer._ERROR_LINE.search(line)), None)


@settings(max_examples=1000)
@given(st.lists(_ERROR_PIECES, max_size=30).map("".join))
def test_the_first_error_line_is_the_first_line_the_pattern_matches(text: str) -> None:
    """Property: the line found around the first match is the first matching line, stripped."""
    assert summarizer._first_error_line(text) == _first_error_line_by_lines(text)


def test_the_ascii_folds_are_the_letters_re_i_equates_with_ascii_ones() -> None:
    """`_ASCII_FOLDS` is every non-ASCII character re.I matches with an ASCII letter (asked of
    `re` over all code points), so text without them reads as its ASCII-lowered bytes."""
    others = "".join(chr(c) for c in range(128, 0x110000) if not 0xD800 <= c <= 0xDFFF)
    letters = re.compile("|".join(string.ascii_lowercase), re.IGNORECASE)
    assert tuple(m.group(0) for m in letters.finditer(others)) == summarizer._ASCII_FOLDS


#: Pieces of an output around printed paths: path characters, slashes, dots, extensions,
#: separators, non-ASCII word characters, and runs with a slash but no path (more of them
#: than `_printed_path` tries one by one).
_PATH_PIECES = st.sampled_from(
    (
        *("/", "//", ".", "..", "./", "../", "@", "-", "_", "a", "Z", "9", ".ts", ".j", "é"),
        *(" ", "\n", ":", ",", "(", "~", "…", "ß", "1/2", "a/b", "http://x/y", "src/app.py"),
    )
)


@settings(max_examples=1000)
@given(st.lists(_PATH_PIECES, max_size=60).map("".join))
def test_the_printed_path_is_the_patterns_first_match(text: str) -> None:
    """Property: `_printed_path` finds what `_PRINTED_PATH.search` over the whole text finds."""
    found = summarizer._PRINTED_PATH.search(text)
    assert summarizer._printed_path(text) == (found.group(0) if found else None)


@given(st.lists(_ERROR_PIECES, max_size=30).map("".join), st.data())
def test_line_at_is_the_line_splitlines_gives(text: str, data: st.DataObject) -> None:
    """Property: `line_at` cuts out the same line `str.splitlines` has the character in."""
    at = 0
    for line in text.splitlines(keepends=True):
        content = line.splitlines()[0] if line.splitlines() else ""
        if content:
            offset = data.draw(st.integers(0, len(content) - 1))
            assert line_at(text, at + offset) == content
        at += len(line)
