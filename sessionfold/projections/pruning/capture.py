"""Pure pieces of batch capture (reference §3): calls, batches, hashes and heads.

A batch is one assistant message's ready tool calls (reference §3.2); `group_batches` merges
them per user turn in `agent-message` batching mode (§3.4). Lengths are JavaScript string
lengths (UTF-16 code units), because pi-condense's thresholds are `text.length`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from sessionfold.projections.pruning.config import RESULT_HEAD_CHARS

# What JavaScript's String.prototype.trim removes (WhiteSpace and LineTerminator).
_JS_SPACE = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call with its paired result: what capture, dedup and the summarizer need."""

    key: str  # occurrence key `id@resultTimestamp`
    tool_call_id: str
    tool_name: str
    raw_chars: int  # JS length of the result text
    content_hash: str
    head: str  # first RESULT_HEAD_CHARS of the result text
    seq: int  # sequence number of the toolResult entry: the pointer to the original
    is_error: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    result_ts: int | float | None = None
    assistant_seq: int | None = None  # sequence number of the assistant entry with the call

    @property
    def truncated_chars(self) -> int:
        """How many chars of the result the head leaves out."""
        return max(0, self.raw_chars - js_length(self.head))


@dataclass(frozen=True, slots=True)
class Batch:
    """The ready calls of one assistant turn (or of one user turn once grouped)."""

    turn_index: int
    timestamp: int
    calls: tuple[Call, ...]
    assistant_text: str = ""
    group: int | None = None


# --- text ------------------------------------------------------------------------------------


def js_length(text: str) -> int:
    """JavaScript's `text.length`: UTF-16 code units."""
    if text.isascii():
        return len(text)
    # UTF-16 in C: an astral character is two units, a lone surrogate one.
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def js_head(text: str, units: int) -> str:
    """The longest prefix of `text` of at most `units` UTF-16 units, never half a pair."""
    head = text[:units]
    if js_length(head) <= units:
        return head  # no astral character in the first `units` code points: the common case
    used = 0
    for index, ch in enumerate(text):
        used += 2 if ord(ch) > 0xFFFF else 1
        if used > units:
            return text[:index]
    return text


def js_trim(text: str) -> str:
    """JavaScript's `String.prototype.trim`."""
    return text.strip(_JS_SPACE)


def result_text(message: dict[str, Any]) -> str:
    """A tool result's text: its text blocks joined by a newline; other blocks ignored (H3)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        block["text"]
        for block in content
        if isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    )


def assistant_text(message: dict[str, Any]) -> str:
    """An assistant's text blocks joined by a newline, trimmed (reference §3.1)."""
    return js_trim(result_text(message))


def call_arguments(block: dict[str, Any]) -> dict[str, Any]:
    """A tool call's arguments: `input ?? args ?? arguments ?? {}` (H2)."""
    for name in ("input", "args", "arguments"):
        value = block.get(name)
        if value is not None:
            return value if isinstance(value, dict) else {}
    return {}


def normalize_text(text: str) -> str:
    """CRLF to LF, trailing spaces/tabs stripped per line, whole text trimmed (§5.3)."""
    text = text.replace("\r\n", "\n")
    # Only a line that ends in a space or tab before a newline changes (the trim takes the
    # last line's): most outputs have none, and skip the split into lines.
    if " \n" in text or "\t\n" in text:
        text = "\n".join(line.rstrip(" \t") for line in text.split("\n"))
    return js_trim(text)


def content_hash(tool_name: str, text: str) -> str:
    """SHA-1 hex of `toolName + NUL + normalize(text)`, as UTF-8 (lone surrogates as U+FFFD)."""
    data = f"{tool_name}\0{normalize_text(text)}"
    if not data.isascii():  # ASCII holds no surrogate: the scan is skipped
        data = _LONE_SURROGATE.sub("\ufffd", data)
    return hashlib.sha1(data.encode("utf-8")).hexdigest()


def result_head(text: str) -> str:
    """The part of a result the summarizer prompt shows (reference §6.1)."""
    return js_head(text, RESULT_HEAD_CHARS)


def head_preview(text: str, max_bytes: int) -> str:
    """A spilled result's head preview (§5.2): whole if it fits, else a byte cut at a line end."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return text
    cut = data[:max_bytes].decode("utf-8", "ignore")  # backs off to a character boundary
    newline = cut.rfind("\n")
    return cut[:newline] if newline > 0 else cut


# --- batches ---------------------------------------------------------------------------------


def group_batches(
    batches: Iterable[Batch], mode: Literal["turn", "agent-message"] = "turn"
) -> list[Batch]:
    """Batches as the flush takes them: as they are in `turn` mode, merged per user turn in
    `agent-message` mode (calls concatenated, texts joined by a blank line, last turn's index
    and timestamp); a batch without a group passes alone and breaks a merge."""
    result: list[Batch] = []
    for batch in batches:
        previous = result[-1] if result else None
        if (
            mode == "agent-message"
            and previous is not None
            and batch.group is not None
            and previous.group == batch.group
        ):
            texts = [t for t in (previous.assistant_text, batch.assistant_text) if t]
            result[-1] = replace(
                batch,
                calls=previous.calls + batch.calls,
                assistant_text="\n\n".join(texts),
            )
        else:
            result.append(batch)
    return result


def raw_chars(calls: Iterable[Call]) -> int:
    """Sum of the calls' result lengths."""
    return sum(call.raw_chars for call in calls)
