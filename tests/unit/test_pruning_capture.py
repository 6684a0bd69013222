"""Pure capture pieces: texts, hashes, heads, previews and batch grouping (reference §3, §5)."""

from __future__ import annotations

import hashlib
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.projections.pruning.capture import (
    Batch,
    Call,
    assistant_text,
    call_arguments,
    content_hash,
    group_batches,
    head_preview,
    js_head,
    js_length,
    normalize_text,
    result_head,
    result_text,
)


def _call(call_id: str, raw: int = 10) -> Call:
    return Call(
        key=f"{call_id}@1",
        tool_call_id=call_id,
        tool_name="bash",
        raw_chars=raw,
        content_hash="h",
        head="x",
        seq=1,
    )


def test_result_text_joins_text_blocks_and_ignores_others() -> None:
    """A result's text is its text blocks joined by a newline; images are ignored."""
    message = {
        "content": [
            {"type": "text", "text": "a"},
            {"type": "image", "data": "..", "mimeType": "image/png"},
            {"type": "text", "text": "b"},
        ]
    }
    assert result_text(message) == "a\nb"


def test_assistant_text_is_trimmed() -> None:
    """The assistant text of a batch is its text blocks joined and trimmed."""
    message = {"content": [{"type": "text", "text": "  hi "}, {"type": "toolCall", "id": "1"}]}
    assert assistant_text(message) == "hi"


def test_call_arguments_prefer_input_then_args_then_arguments() -> None:
    """Arguments are read as input ?? args ?? arguments ?? {}."""
    assert call_arguments({"input": {"a": 1}, "arguments": {"b": 2}}) == {"a": 1}
    assert call_arguments({"args": {"c": 3}}) == {"c": 3}
    assert call_arguments({"arguments": {"b": 2}}) == {"b": 2}
    assert call_arguments({}) == {}


def test_normalization_keeps_case_tabs_and_inner_space() -> None:
    """CRLF and trailing blanks are normalized; case, inner whitespace and tabs survive."""
    assert normalize_text("  A  b\t \r\nc\t\n\n") == "A  b\nc"
    assert normalize_text("x\ty") == "x\ty"


def test_content_hash_ignores_trailing_blanks_and_depends_on_tool() -> None:
    """Identical normalized outputs hash equal for the same tool, differently across tools."""
    assert content_hash("read", "a \r\nb\n") == content_hash("read", "a\nb")
    assert content_hash("read", "a") != content_hash("bash", "a")
    assert content_hash("read", "A") != content_hash("read", "a")


def test_lengths_and_heads_count_utf16_units() -> None:
    """Lengths are JavaScript's; a head never splits a surrogate pair."""
    assert js_length("a😀") == 3
    assert js_head("a😀b", 2) == "a"
    assert js_head("a😀b", 3) == "a😀"
    assert result_head("x" * 2500) == "x" * 2000


def test_head_preview_cuts_at_a_line_within_the_byte_cap() -> None:
    """A preview is whole when it fits, else cut at the byte cap and back to the last newline."""
    assert head_preview("short", 2048) == "short"
    text = "line one\nline two\n" + "z" * 100
    assert head_preview(text, 20) == "line one\nline two"
    assert head_preview("é" * 10, 5) == "éé"  # 2-byte chars: 5 bytes back off to 4


def test_turn_mode_keeps_one_batch_per_turn() -> None:
    """In turn mode the batches pass unchanged."""
    batches = [Batch(0, 1, (_call("a"),), group=1), Batch(1, 2, (_call("b"),), group=1)]
    assert group_batches(batches, "turn") == batches


def test_agent_message_mode_merges_one_user_turn() -> None:
    """agent-message mode merges consecutive batches of one user turn: last index and timestamp."""
    batches = [
        Batch(0, 10, (_call("a"),), "first", group=1),
        Batch(1, 20, (_call("b"),), "", group=1),
        Batch(2, 30, (_call("c"),), "third", group=1),
        Batch(3, 40, (_call("d"),), "next", group=2),
        Batch(4, 50, (_call("e"),), "", group=None),
        Batch(5, 60, (_call("f"),), "", group=None),
    ]
    grouped = group_batches(batches, "agent-message")
    assert [b.turn_index for b in grouped] == [2, 3, 4, 5]
    assert [c.tool_call_id for c in grouped[0].calls] == ["a", "b", "c"]
    assert grouped[0].assistant_text == "first\n\nthird"
    assert grouped[0].timestamp == 30


#: Pieces of a result's text around what normalization changes: line ends, trailing blanks,
#: JavaScript's other white space, and a lone surrogate.
_TEXT = st.lists(
    st.sampled_from(["a", "é", " ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u2028", "\ud800"]),
    max_size=30,
).map("".join)


def _normalized_line_by_line(text: str) -> str:
    """§5.3 spelled out: CRLF to LF, every line's trailing spaces and tabs off, then trimmed."""
    lines = text.replace("\r\n", "\n").split("\n")
    return "\n".join(line.rstrip(" \t") for line in lines).strip(
        "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
        "\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
    )


@settings(max_examples=500)
@given(_TEXT)
def test_normalizing_skips_no_line_that_changes(text: str) -> None:
    """Property: the normalized text and its hash are those of the line-by-line definition."""
    normalized = _normalized_line_by_line(text)
    assert normalize_text(text) == normalized
    data = re.sub("[\ud800-\udfff]", "\ufffd", f"bash\0{normalized}")
    assert content_hash("bash", text) == hashlib.sha1(data.encode("utf-8")).hexdigest()
