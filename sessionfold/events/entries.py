"""pi session entries, message roles and content blocks (session format v3).

Every model keeps unknown fields (`extra="allow"`): pi adds fields over time and extensions add
their own, and an archive must not drop what it does not understand. Optional values that pi
leaves out of the JSON are optional here. Validation is lenient where real files are
(reference/pi-session-format.md §5): empty assistant content, a missing `totalTokens`, a
`partialJson` leftover on a tool call, a bashExecution with no `content` or `exitCode`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, ValidationError

from sessionfold.events.errors import error_locations


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


# --- content blocks ------------------------------------------------------------------------


class TextBlock(_Open):
    type: Literal["text"]
    text: str
    textSignature: str | None = None


class ThinkingBlock(_Open):
    type: Literal["thinking"]
    thinking: str
    thinkingSignature: str | None = None
    redacted: bool | None = None


class ImageBlock(_Open):
    type: Literal["image"]
    data: str
    mimeType: str


class ToolCallBlock(_Open):
    type: Literal["toolCall"]
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    thoughtSignature: str | None = None
    partialJson: str | None = None  # legacy streaming leftover on aborted calls


class UnknownBlock(_Open):
    """A block type this build does not know: kept as it is."""

    type: str


def _tag(value: Any, field: str, known: set[str]) -> str:
    """The union member a raw dict or a model names in `field`; "unknown" for any other name."""
    found = value.get(field) if isinstance(value, dict) else getattr(value, field, None)
    # Only a string can name a member: an array or object there (unhashable) is "unknown", whose
    # model wants a string and so refuses the object by its field, a dead letter like any other.
    return found if isinstance(found, str) and found in known else "unknown"


_BLOCK_TYPES = {"text", "thinking", "image", "toolCall"}


def _block_kind(value: Any) -> str:
    return _tag(value, "type", _BLOCK_TYPES)


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[ImageBlock, Tag("image")]
    | Annotated[ToolCallBlock, Tag("toolCall")]
    | Annotated[UnknownBlock, Tag("unknown")],
    Discriminator(_block_kind),
]


# --- message roles ---------------------------------------------------------------------------


class Cost(_Open):
    input: float = 0
    output: float = 0
    cacheRead: float = 0
    cacheWrite: float = 0
    total: float = 0


class Usage(_Open):
    input: int = 0
    output: int = 0
    cacheRead: int = 0
    cacheWrite: int = 0
    totalTokens: int | None = None  # missing in old files: sum the four counts instead
    cost: Cost | None = None


class UserMessage(_Open):
    role: Literal["user"]
    content: str | list[ContentBlock]
    timestamp: int | float | None = None


class AssistantMessage(_Open):
    role: Literal["assistant"]
    content: list[ContentBlock] = Field(default_factory=list)
    api: str | None = None
    provider: str | None = None
    model: str | None = None
    usage: Usage | None = None
    stopReason: str | None = None
    errorMessage: str | None = None
    timestamp: int | float | None = None


class ToolResultMessage(_Open):
    role: Literal["toolResult"]
    toolCallId: str
    toolName: str | None = None
    content: list[ContentBlock] = Field(default_factory=list)
    details: Any = None
    isError: bool = False
    timestamp: int | float | None = None


class BashExecutionMessage(_Open):
    role: Literal["bashExecution"]
    command: str
    output: str = ""
    exitCode: int | None = None
    cancelled: bool = False
    truncated: bool = False
    fullOutputPath: str | None = None
    excludeFromContext: bool | None = None
    timestamp: int | float | None = None


class CustomMessage(_Open):
    role: Literal["custom"]
    customType: str | None = None
    content: str | list[ContentBlock] = ""
    display: bool | None = None
    details: Any = None
    timestamp: int | float | None = None


class BranchSummaryMessage(_Open):
    role: Literal["branchSummary"]
    summary: str
    fromId: str | None = None
    timestamp: int | float | None = None


class CompactionSummaryMessage(_Open):
    role: Literal["compactionSummary"]
    summary: str
    tokensBefore: int | None = None
    timestamp: int | float | None = None


class UnknownMessage(_Open):
    """A role this build does not know (a future pi role): kept, and a barrier for folds."""

    role: str


_ROLES = {
    "user",
    "assistant",
    "toolResult",
    "bashExecution",
    "custom",
    "branchSummary",
    "compactionSummary",
}


_ROLE_TAGS = _ROLES | {"hookMessage"}


def _role_kind(value: Any) -> str:
    kind = _tag(value, "role", _ROLE_TAGS)
    # hookMessage: the v2 name of custom, which migration renames. One left in a v3 file is read
    # as a custom message and refused by its role (a dead letter, never an unknown message).
    return "custom" if kind == "hookMessage" else kind


AgentMessage = Annotated[
    Annotated[UserMessage, Tag("user")]
    | Annotated[AssistantMessage, Tag("assistant")]
    | Annotated[ToolResultMessage, Tag("toolResult")]
    | Annotated[BashExecutionMessage, Tag("bashExecution")]
    | Annotated[CustomMessage, Tag("custom")]
    | Annotated[BranchSummaryMessage, Tag("branchSummary")]
    | Annotated[CompactionSummaryMessage, Tag("compactionSummary")]
    | Annotated[UnknownMessage, Tag("unknown")],
    Discriminator(_role_kind),
]


# --- entries ---------------------------------------------------------------------------------


class SessionHeader(_Open):
    """First line of a file; not part of the tree. v1 headers carry no `version`."""

    type: Literal["session"]
    id: str
    version: int | None = None
    timestamp: str | None = None
    cwd: str | None = None
    parentSession: str | None = None


class _Entry(_Open):
    id: str
    parentId: str | None = None
    timestamp: str | None = None


class MessageEntry(_Entry):
    type: Literal["message"]
    message: AgentMessage


class ThinkingLevelChangeEntry(_Entry):
    type: Literal["thinking_level_change"]
    thinkingLevel: str


class ModelChangeEntry(_Entry):
    type: Literal["model_change"]
    provider: str | None = None
    modelId: str | None = None


class CompactionEntry(_Entry):
    type: Literal["compaction"]
    summary: str
    firstKeptEntryId: str | None = None
    tokensBefore: int | None = None
    details: Any = None
    fromHook: bool | None = None


class BranchSummaryEntry(_Entry):
    type: Literal["branch_summary"]
    fromId: str
    summary: str
    details: Any = None
    fromHook: bool | None = None


class CustomEntry(_Entry):
    type: Literal["custom"]
    customType: str
    data: Any = None


class CustomMessageEntry(_Entry):
    type: Literal["custom_message"]
    customType: str
    content: str | list[ContentBlock] = ""
    display: bool = True
    details: Any = None


class LabelEntry(_Entry):
    type: Literal["label"]
    targetId: str
    label: str | None = None


class SessionInfoEntry(_Entry):
    type: Literal["session_info"]
    name: str | None = None


class UnknownEntry(_Entry):
    """An entry type this build does not know: kept, ignored by the folds."""

    type: str


_ENTRY_TYPES = {
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


def _entry_kind(value: Any) -> str:
    return _tag(value, "type", _ENTRY_TYPES)


SessionEntry = Annotated[
    Annotated[SessionHeader, Tag("session")]
    | Annotated[MessageEntry, Tag("message")]
    | Annotated[ThinkingLevelChangeEntry, Tag("thinking_level_change")]
    | Annotated[ModelChangeEntry, Tag("model_change")]
    | Annotated[CompactionEntry, Tag("compaction")]
    | Annotated[BranchSummaryEntry, Tag("branch_summary")]
    | Annotated[CustomEntry, Tag("custom")]
    | Annotated[CustomMessageEntry, Tag("custom_message")]
    | Annotated[LabelEntry, Tag("label")]
    | Annotated[SessionInfoEntry, Tag("session_info")]
    | Annotated[UnknownEntry, Tag("unknown")],
    Discriminator(_entry_kind),
]

_SESSION_ENTRY = TypeAdapter(SessionEntry)


class EntryError(ValueError):
    """An object that is not a valid pi entry; the message holds field paths, never text."""


# --- the common shapes, checked without pydantic -----------------------------------------------
#
# The reader checks every entry (`check_entry`). Most lines of a session are messages of three
# roles and a few small entry types whose fields have their plain JSON types: those are
# recognised here, field by field, by exact type, and only what this accepts skips pydantic.
# Anything else (another entry type or role, a field of another type that lax validation might
# coerce or refuse) goes to `parse_entry`, so the verdict is always pydantic's (a property test
# holds this to it).

_NONE = type(None)
_STR = (str,)
_OPT_STR = (str, _NONE)
_OPT_NUMBER = (int, float, _NONE)
_OPT_BOOL = (bool, _NONE)
#: What `dict.get` returns for a required field that is not there: no type accepts it.
_ABSENT: Any = object()

#: A field: its name, what stands for it when it is absent (a valid value when it may be
#: left out, else `_ABSENT`), and the exact types its value may have.
Fields = tuple[tuple[str, Any, tuple[type, ...]], ...]

#: Per block type, its fields.
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
#: Entry types other than message, by their own fields (the common ones: id, parentId, timestamp).
_ENTRY_FIELDS: dict[str, Fields] = {
    "thinking_level_change": (("thinkingLevel", _ABSENT, _STR),),
    "model_change": (("provider", None, _OPT_STR), ("modelId", None, _OPT_STR)),
}
_USAGE_INTS = ("input", "output", "cacheRead", "cacheWrite")
_COST_FIELDS = ("input", "output", "cacheRead", "cacheWrite", "total")


def _fields_ok(value: dict[str, Any], fields: Fields) -> bool:
    # Exact types: bool is an int subclass, and only a field that names bool takes one. A loop,
    # not all() over a generator: this runs for most lines, and the generator costs more.
    for name, absent, types in fields:  # noqa: SIM110
        if type(value.get(name, absent)) not in types:
            return False
    return True


def _blocks_ok(content: Any) -> bool:
    if type(content) is not list:
        return False
    for block in content:
        if type(block) is not dict:
            return False
        kind = block.get("type")
        fields = _BLOCK_FIELDS.get(kind) if type(kind) is str else None
        if fields is None:
            return False  # an image or an unknown type: pydantic decides
        for name, absent, types in fields:
            if type(block.get(name, absent)) not in types:
                return False
    return True


def _usage_ok(usage: Any) -> bool:
    if usage is None:
        return True
    if type(usage) is not dict:
        return False
    for name in _USAGE_INTS:
        if type(usage.get(name, 0)) is not int:
            return False
    if type(usage.get("totalTokens")) not in (int, _NONE):
        return False
    cost = usage.get("cost")
    if cost is None:
        return True
    if type(cost) is not dict:
        return False
    for name in _COST_FIELDS:
        value = cost.get(name, 0.0)
        if type(value) is not float and not (type(value) is int and -(2**53) <= value <= 2**53):
            return False  # a float, or an int a float holds (pydantic's float takes it as it is)
    return True


def is_common_entry(raw: dict[str, Any]) -> bool:
    """True when `raw` is an entry of a common shape that `parse_entry` accepts (a user,
    assistant or tool result message with plain JSON field types, a thinking level or model
    change); False means: ask `parse_entry`, never that the entry is invalid."""
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
        content = message.get("content")  # required: a missing one is pydantic's to name
        if type(content) is not str and not _blocks_ok(content):
            return False
    elif "content" in message and not _blocks_ok(message["content"]):
        return False
    return role != "assistant" or _usage_ok(message.get("usage"))


def check_entry(raw: dict[str, Any]) -> None:
    """Raise EntryError (naming the bad fields) unless `raw` is a valid v3 entry or header:
    `parse_entry`'s verdict, without building the models for the common shapes."""
    if not is_common_entry(raw):
        parse_entry(raw)


def parse_entry(raw: dict[str, Any]) -> SessionEntry:
    """Validate one v3-shaped entry (or header) dict; raise EntryError naming the bad fields."""
    try:
        return _SESSION_ENTRY.validate_python(raw)
    except ValidationError as exc:
        where = error_locations(exc)
        raise EntryError(f"invalid {_type_name(raw.get('type'))} entry ({where})") from None


def _type_name(value: Any) -> str:
    """An entry's `type` for an error: a string cut to 40 characters, else its JSON kind only (an
    array or object there may hold anything, message text included)."""
    if isinstance(value, str):
        return repr(value[:40])
    kinds = {list: "array", dict: "object", bool: "boolean", int: "number", float: "number"}
    return f"{kinds.get(type(value), 'null')}-typed"
