"""pi session entries (events/entries.py): parsing, lenient fields, unknown kinds, errors."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from sessionfold.events.entries import (
    AssistantMessage,
    EntryError,
    MessageEntry,
    SessionHeader,
    TextBlock,
    ToolCallBlock,
    UnknownBlock,
    UnknownEntry,
    UnknownMessage,
    UserMessage,
    parse_entry,
)

KNOWN_TYPES = {
    "session",
    "message",
    "thinking_level_change",
    "model_change",
    "compaction",
    "branch_summary",
    "custom",
    "custom_message",
    "label",
    "session_info",
}


def _message(message: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message", "id": "e1", "parentId": None, "message": message}


def test_a_header_without_version_is_a_v1_header() -> None:
    """The header parses as such; a v1 header has no version."""
    header = parse_entry({"type": "session", "id": "s1", "cwd": "/w"})
    assert isinstance(header, SessionHeader)
    assert (header.version, header.cwd) == (None, "/w")


def test_messages_are_told_apart_by_role() -> None:
    """The message's role picks its model; blocks are told apart by type."""
    entry = parse_entry(
        _message(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "toolCall", "id": "c1", "name": "bash", "partialJson": "{"},
                ],
            }
        )
    )
    assert isinstance(entry, MessageEntry)
    assert isinstance(entry.message, AssistantMessage)
    text, call = entry.message.content
    assert isinstance(text, TextBlock) and isinstance(call, ToolCallBlock)
    assert call.arguments == {}  # a leftover partial call without arguments is valid


def test_an_assistant_with_empty_content_and_no_usage_is_valid() -> None:
    """Real files hold empty assistant content and no usage: both are accepted."""
    entry = parse_entry(_message({"role": "assistant", "content": []}))
    assert isinstance(entry, MessageEntry) and isinstance(entry.message, AssistantMessage)
    assert entry.message.usage is None


def test_unknown_roles_blocks_and_entries_are_kept_as_they_are() -> None:
    """A future role, block type or entry type parses, with every field kept."""
    message = parse_entry(_message({"role": "future", "x": 1}))
    assert isinstance(message, MessageEntry) and isinstance(message.message, UnknownMessage)
    assert message.message.model_dump() == {"role": "future", "x": 1}
    user = parse_entry(_message({"role": "user", "content": [{"type": "video", "url": "u"}]}))
    assert isinstance(user, MessageEntry) and isinstance(user.message, UserMessage)
    assert isinstance(user.message.content, list)
    assert isinstance(user.message.content[0], UnknownBlock)
    entry = parse_entry({"type": "bookmark", "id": "e9", "note": "n"})
    assert isinstance(entry, UnknownEntry)
    assert entry.model_dump()["note"] == "n"


def test_unknown_fields_survive_a_round_trip() -> None:
    """Fields this build does not know are kept on every level."""
    raw = _message({"role": "user", "content": "hi", "extra": {"a": [1]}}) | {"new": True}
    entry = parse_entry(raw)
    dumped = entry.model_dump(exclude_none=True)
    assert dumped["new"] is True
    assert dumped["message"]["extra"] == {"a": [1]}


def test_entries_are_frozen() -> None:
    """A parsed entry cannot be changed."""
    entry = parse_entry(_message({"role": "user", "content": "hi"}))
    with pytest.raises(ValidationError):
        entry.id = "other"  # type: ignore[misc]


def test_an_invalid_entry_names_the_fields_and_not_the_text() -> None:
    """EntryError names the entry type and the bad field paths; no message text."""
    secret = "do-not-leak-this"
    with pytest.raises(EntryError) as caught:
        parse_entry(_message({"role": "toolResult", "content": [{"type": "text", "text": 5}]}))
    text = str(caught.value)
    assert text.startswith("invalid 'message' entry (")
    assert "toolCallId" in text
    with pytest.raises(EntryError) as caught:
        parse_entry({"type": "label", "id": "e1", "label": secret})
    assert secret not in str(caught.value) and "targetId" in str(caught.value)


def test_a_long_type_is_cut_in_the_error() -> None:
    """The type named in the error is at most 40 characters."""
    with pytest.raises(EntryError) as caught:
        parse_entry({"type": "m" * 80})
    assert "m" * 41 not in str(caught.value)


@given(
    kind=st.text(min_size=1, max_size=20).filter(lambda k: k not in KNOWN_TYPES),
    value=st.integers() | st.text(max_size=10),
)
def test_any_unknown_entry_type_is_kept(kind: str, value: int | str) -> None:
    """Every type this build does not know parses as an UnknownEntry with its fields."""
    entry = parse_entry({"type": kind, "id": "e1", "field": value})
    assert isinstance(entry, UnknownEntry)
    assert (entry.type, entry.model_dump()["field"]) == (kind, value)


@pytest.mark.parametrize("tag", [[], {}, ["secret words"], {"k": "secret words"}])
@pytest.mark.parametrize("where", ["type", "role", "block"])
def test_an_array_or_object_tag_is_an_entry_error_naming_no_value(tag: Any, where: str) -> None:
    """An unhashable `type`, `role` or block `type` is refused by its field (a dead letter for
    the reader), never a TypeError, and the error carries none of the value's words."""
    block: dict[str, Any] = {"type": "text", "text": "hi"}
    message: dict[str, Any] = {"role": "user", "content": [block]}
    raw = _message(message)
    if where == "type":
        raw["type"] = tag
    elif where == "role":
        message["role"] = tag
    else:
        block["type"] = tag
    with pytest.raises(EntryError) as caught:
        parse_entry(raw)
    assert "secret" not in str(caught.value)
