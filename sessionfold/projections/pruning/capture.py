"""Pure pieces of batch capture (reference §3): calls, batches, hashes and heads.

A batch is one assistant message's ready tool calls (reference §3.2); `group_batches` merges
them per user turn in `agent-message` batching mode (§3.4). Lengths are JavaScript string
lengths (UTF-16 code units), because pi-condense's thresholds are `text.length`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any, Literal

import msgspec

from sessionfold.projections.jsjson import js_head as js_head
from sessionfold.projections.jsjson import js_length as js_length
from sessionfold.projections.jsjson import js_trim
from sessionfold.projections.pruning.config import RESULT_HEAD_CHARS
from sessionfold.projections.pruning.entry_facts import assistant_text as assistant_text
from sessionfold.projections.pruning.entry_facts import call_arguments as call_arguments
from sessionfold.projections.pruning.entry_facts import result_text as result_text

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class Call(msgspec.Struct, frozen=True, gc=False):
    """One tool call with its paired result: what capture, dedup and the summarizer need."""

    # A msgspec struct, not a frozen dataclass: a capture builds one per ready call at every
    # turn end and flush, and a frozen dataclass's __init__ (a setattr per field) cost ~2 us.

    key: str  # occurrence key `id@resultTimestamp`
    tool_call_id: str
    tool_name: str
    raw_chars: int  # JS length of the result text
    content_hash: str
    head: str  # first RESULT_HEAD_CHARS of the result text
    seq: int  # sequence number of the toolResult entry: the pointer to the original
    is_error: bool = False
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)
    result_ts: int | float | None = None
    assistant_seq: int | None = None  # sequence number of the assistant entry with the call

    @property
    def truncated_chars(self) -> int:
        """How many chars of the result the head leaves out."""
        return max(0, self.raw_chars - js_length(self.head))


class Batch(msgspec.Struct, frozen=True, gc=False):
    """The ready calls of one assistant turn (or of one user turn once grouped)."""

    turn_index: int
    timestamp: int
    calls: tuple[Call, ...]
    assistant_text: str = ""
    group: int | None = None


# --- text ------------------------------------------------------------------------------------


def normalize_text(text: str) -> str:
    """CRLF to LF, trailing spaces/tabs stripped per line, whole text trimmed (§5.3)."""
    # A one-character look (memchr) first: most outputs have no CR, and many no tab, and
    # those skip a two-character search through the whole text.
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    # Only a line that ends in a space or tab before a newline changes (the trim takes the
    # last line's): most outputs have none, and skip the split into lines.
    if " \n" in text or ("\t" in text and "\t\n" in text):
        text = "\n".join(line.rstrip(" \t") for line in text.split("\n"))
    return js_trim(text)


def content_hash(tool_name: str, text: str) -> str:
    """SHA-1 hex of `toolName + NUL + normalize(text)`, as UTF-8 (lone surrogates as U+FFFD)."""
    # Hashed in two parts, the text not copied into one string with the name first: the NUL
    # between them keeps every surrogate in its own part.
    digest = hashlib.sha1(_utf8(f"{tool_name}\0"))
    digest.update(_utf8(normalize_text(text)))
    return digest.hexdigest()


def _utf8(text: str) -> bytes:
    """UTF-8 with lone surrogates as U+FFFD."""
    try:
        # The strict encoder refuses only lone surrogates: text without one is not scanned.
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", text).encode("utf-8")


def result_record(tool_name: str, text: str) -> tuple[str, str]:
    """A paired result's content hash and head (`content_hash`, `result_head`) in one call."""
    return content_hash(tool_name, text), js_head(text, RESULT_HEAD_CHARS)


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
            result[-1] = msgspec.structs.replace(
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
