"""`is_common_entry`, its shapes spelled out, gives the verdict of the table-driven check it
replaced (kept here as the oracle) on every drawn entry: the same lines skip pydantic."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.events.entries import is_common_entry
from tests.unit.test_entry_fast_path import ANY_VALUE, damaged_entries

_NONE = type(None)
_STR = (str,)
_OPT_STR = (str, _NONE)
_OPT_NUMBER = (int, float, _NONE)
_OPT_BOOL = (bool, _NONE)
_ABSENT: Any = object()
Fields = tuple[tuple[str, Any, tuple[type, ...]], ...]
_BLOCK_FIELDS: dict[str, Fields] = {
    "text": (("text", _ABSENT, _STR), ("textSignature", None, _OPT_STR)),
    "thinking": (
        ("thinking", _ABSENT, _STR),
        ("thinkingSignature", None, _OPT_STR),
        ("redacted", None, _OPT_BOOL),
    ),
    "toolCall": (
        ("id", _ABSENT, _STR),
        ("name", _ABSENT, _STR),
        ("arguments", {}, (dict,)),
        ("thoughtSignature", None, _OPT_STR),
        ("partialJson", None, _OPT_STR),
    ),
}
_MESSAGE_FIELDS: dict[str, Fields] = {
    "user": (("timestamp", None, _OPT_NUMBER),),
    "assistant": (
        ("api", None, _OPT_STR),
        ("provider", None, _OPT_STR),
        ("model", None, _OPT_STR),
        ("stopReason", None, _OPT_STR),
        ("errorMessage", None, _OPT_STR),
        ("timestamp", None, _OPT_NUMBER),
    ),
    "toolResult": (
        ("toolCallId", _ABSENT, _STR),
        ("toolName", None, _OPT_STR),
        ("isError", False, (bool,)),
        ("timestamp", None, _OPT_NUMBER),
    ),
}
_ENTRY_FIELDS: dict[str, Fields] = {
    "thinking_level_change": (("thinkingLevel", _ABSENT, _STR),),
    "model_change": (("provider", None, _OPT_STR), ("modelId", None, _OPT_STR)),
}


def _fields_ok(value: dict[str, Any], fields: Fields) -> bool:
    return all(type(value.get(name, absent)) in types for name, absent, types in fields)


def _blocks_ok(content: Any) -> bool:
    if type(content) is not list:
        return False
    for block in content:
        if type(block) is not dict:
            return False
        kind = block.get("type")
        fields = _BLOCK_FIELDS.get(kind) if type(kind) is str else None
        if fields is None or not _fields_ok(block, fields):
            return False
    return True


def _usage_ok(usage: Any) -> bool:
    if usage is None:
        return True
    if type(usage) is not dict:
        return False
    for name in ("input", "output", "cacheRead", "cacheWrite"):
        if type(usage.get(name, 0)) is not int:
            return False
    if type(usage.get("totalTokens")) not in (int, _NONE):
        return False
    cost = usage.get("cost")
    if cost is None:
        return True
    if type(cost) is not dict:
        return False
    for name in ("input", "output", "cacheRead", "cacheWrite", "total"):
        value = cost.get(name, 0.0)
        if type(value) is not float and not (type(value) is int and -(2**53) <= value <= 2**53):
            return False
    return True


def table_is_common_entry(raw: dict[str, Any]) -> bool:
    """The check as it was before its shapes were spelled out (the oracle)."""
    if type(raw.get("id")) is not str:
        return False
    if type(raw.get("parentId")) not in _OPT_STR or type(raw.get("timestamp")) not in _OPT_STR:
        return False
    kind = raw.get("type")
    if kind != "message":
        fields = _ENTRY_FIELDS.get(kind) if type(kind) is str else None
        return fields is not None and _fields_ok(raw, fields)
    message = raw.get("message")
    if type(message) is not dict:
        return False
    role = message.get("role")
    fields = _MESSAGE_FIELDS.get(role) if type(role) is str else None
    if fields is None or not _fields_ok(message, fields):
        return False
    if role == "user":
        content = message.get("content")
        if type(content) is not str and not _blocks_ok(content):
            return False
    elif "content" in message and not _blocks_ok(message["content"]):
        return False
    return role != "assistant" or _usage_ok(message.get("usage"))


#: Values near the edges of what each field takes: the types bool/int/float are told apart by.
EDGES = st.one_of(
    ANY_VALUE,
    st.sampled_from([True, False, 0, 1, 0.0, 2**53, 2**53 + 1, -(2**53) - 1, 1.5, "", None]),
)

FIELD_NAMES = [
    "id", "parentId", "timestamp", "type", "message", "role", "content", "api", "provider",
    "model", "stopReason", "errorMessage", "usage", "toolCallId", "toolName", "isError",
    "thinkingLevel", "modelId", "text", "textSignature", "thinking", "thinkingSignature",
    "redacted", "name", "arguments", "thoughtSignature", "partialJson", "input", "output",
    "cacheRead", "cacheWrite", "totalTokens", "cost", "total",
]  # fmt: skip


@st.composite
def nudged_entries(draw: st.DrawFn) -> dict[str, Any]:
    """A drawn entry (`damaged_entries`) with some dicts inside given edge values by name."""
    entry = copy.deepcopy(draw(damaged_entries()))  # its dicts may be the module's own
    dicts: list[dict[str, Any]] = []
    stack: list[Any] = [entry]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            dicts.append(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    for _ in range(draw(st.integers(0, 3))):
        target = draw(st.sampled_from(dicts))
        target[draw(st.sampled_from(FIELD_NAMES))] = draw(EDGES)
    return entry


@settings(max_examples=1500, deadline=None)
@given(nudged_entries())
def test_the_spelled_out_check_gives_the_tables_verdict(entry: dict[str, Any]) -> None:
    assert is_common_entry(entry) is table_is_common_entry(entry)
