"""The reader's fast paths: its check of common entries never says yes where pydantic says no,
and the envelope it builds without validation is the one validation builds."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sessionfold.events.entries import EntryError, check_entry, is_common_entry, parse_entry
from sessionfold.events.envelope import (
    EntryEnvelope,
    EntryPayload,
    decode,
    encode,
    entry_envelope,
)

#: Values of every JSON type, and a few that only a translator's dict could hold.
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)

BLOCKS = [
    {"type": "text", "text": "hello", "textSignature": None},
    {"type": "thinking", "thinking": "hmm", "thinkingSignature": "s", "redacted": False},
    {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {"command": "ls"}},
    {"type": "image", "data": "AAAA", "mimeType": "image/png"},
    {"type": "future", "x": 1},
]

MESSAGES = [
    {"role": "user", "content": "do it", "timestamp": 1},
    {"role": "user", "content": [BLOCKS[0], BLOCKS[3]], "timestamp": 1.5},
    {
        "role": "assistant",
        "content": [BLOCKS[1], BLOCKS[0], BLOCKS[2]],
        "api": "a",
        "provider": "p",
        "model": "m",
        "usage": {
            "input": 1,
            "output": 2,
            "cacheRead": 0,
            "cacheWrite": 0,
            "totalTokens": 3,
            "cost": {"input": 0.1, "output": 1, "cacheRead": 0, "cacheWrite": 0, "total": 1.1},
        },
        "stopReason": "toolUse",
        "timestamp": 2,
    },
    {
        "role": "toolResult",
        "toolCallId": "c1",
        "toolName": "bash",
        "content": [BLOCKS[0]],
        "details": {"x": 1},
        "isError": False,
        "timestamp": 3,
    },
    {"role": "bashExecution", "command": "ls", "output": "", "exitCode": 0},
]


def entry_of(message: dict[str, Any]) -> dict[str, Any]:
    """A message entry around `message`."""
    return {
        "type": "message",
        "id": "e1",
        "parentId": None,
        "timestamp": "2025-01-01T00:00:00Z",
        "message": message,
    }


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path inside a JSON-like value."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            found += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += paths(v, (*prefix, i))
    return found


def changed(value: Any, path: tuple[Any, ...], new: Any, drop: bool) -> Any:
    """`value` with the item at `path` replaced by `new` (or removed)."""
    copy = dict(value) if isinstance(value, dict) else list(value)
    if len(path) == 1:
        if drop and isinstance(copy, dict):
            copy.pop(path[0], None)
        else:
            copy[path[0]] = new
        return copy
    copy[path[0]] = changed(copy[path[0]], path[1:], new, drop)
    return copy


#: Entries of the other common types (and of types near them, which pydantic checks).
OTHER_ENTRIES = [
    {"type": "thinking_level_change", "thinkingLevel": "high"},
    {"type": "model_change", "provider": "anthropic", "modelId": "claude"},
    {"type": "model_change"},
    {"type": "compaction", "summary": "s", "firstKeptEntryId": "e0", "tokensBefore": 5},
    {"type": "label", "targetId": "e0"},
]


def other_entry(fields: dict[str, Any]) -> dict[str, Any]:
    """An entry of another type than message, with the fields every entry has."""
    return {"id": "e1", "parentId": "e0", "timestamp": "2025-01-01T00:00:00Z", **fields}


@st.composite
def damaged_entries(draw: st.DrawFn) -> dict[str, Any]:
    """A common entry with a few values replaced by values of any type, or fields removed."""
    if draw(st.integers(0, 3)) == 0:
        entry = other_entry(draw(st.sampled_from(OTHER_ENTRIES)))
    else:
        entry = entry_of(draw(st.sampled_from(MESSAGES)))
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        where = paths(entry)
        path = draw(st.sampled_from(where))
        entry = changed(entry, path, draw(ANY_VALUE), draw(st.booleans()))
    return entry


@settings(max_examples=600, deadline=None)
@given(damaged_entries())
def test_the_fast_check_accepts_only_what_pydantic_accepts(entry: dict[str, Any]) -> None:
    if is_common_entry(entry):
        parse_entry(entry)  # raises if the fast check let an invalid entry through


@settings(max_examples=300, deadline=None)
@given(damaged_entries())
def test_check_entry_gives_pydantics_verdict(entry: dict[str, Any]) -> None:
    try:
        parse_entry(entry)
    except EntryError as exc:
        with pytest.raises(EntryError) as found:
            check_entry(entry)
        assert str(found.value) == str(exc)
    else:
        check_entry(entry)


@pytest.mark.parametrize("message", MESSAGES[:4])
def test_the_common_shapes_skip_pydantic(message: dict[str, Any]) -> None:
    """The shapes most lines have are recognised (else the fast path would be dead code)."""
    content = message["content"]
    common = isinstance(content, str) or all(
        b.get("type") in ("text", "thinking", "toolCall") for b in content
    )
    assert is_common_entry(entry_of(message)) is common


@pytest.mark.parametrize("fields", OTHER_ENTRIES)
def test_the_common_entry_types_skip_pydantic(fields: dict[str, Any]) -> None:
    """Thinking level and model changes are recognised; rarer types are pydantic's."""
    common = fields["type"] in ("thinking_level_change", "model_change")
    assert is_common_entry(other_entry(fields)) is common


@settings(max_examples=200, deadline=None)
@given(
    session_id=st.text(max_size=8),
    seq=st.integers(min_value=-2, max_value=2**40),
    producer=st.text(max_size=8),
    time=st.none() | st.text(max_size=8),
    entry=damaged_entries(),
    line=st.none() | st.integers(min_value=0, max_value=10**6),
)
def test_the_readers_envelope_is_the_validated_one(
    session_id: str,
    seq: int,
    producer: str,
    time: str | None,
    entry: dict[str, Any],
    line: int | None,
) -> None:
    """entry_envelope builds without validation what validation builds, or fails as it fails."""
    try:
        validated = EntryEnvelope(
            session_id=session_id,
            seq=seq,
            producer=producer,
            time=time,
            payload=EntryPayload(entry=entry, line=line),
        )
    except ValidationError:
        with pytest.raises(ValidationError):
            entry_envelope(session_id, seq, producer, time, entry, line)
        return
    built = entry_envelope(session_id, seq, producer, time, entry, line)
    assert built == validated
    assert built.model_fields_set == validated.model_fields_set
    assert built.payload.model_fields_set == validated.payload.model_fields_set
    assert built.model_dump() == validated.model_dump()
    try:
        wire = encode(validated)
    except TypeError:  # an int past 64 bits (never from JSON): neither encodes
        with pytest.raises(TypeError):
            encode(built)
        return
    assert encode(built) == wire
    if finite(entry):  # orjson writes NaN and infinities as null (never read from JSON)
        assert decode(wire) == built


def finite(value: Any) -> bool:
    """Whether a JSON-like value holds no NaN or infinite float."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite(v) for v in value.values())
    if isinstance(value, list):
        return all(finite(v) for v in value)
    return True
