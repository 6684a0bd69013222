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
_OPT_STR = (str, _NONE)
_OPT_NUMBER = (int, float, _NONE)
_OPT_BOOL = (bool, _NONE)
_OPT_INT = (int, _NONE)


def _usage_ok(usage: Any) -> bool:
    """Whether an assistant message's `usage` (None or absent included) has plain types."""
    if usage is None:
        return True
    if type(usage) is not dict:
        return False
    if not (
        type(usage.get("input", 0)) is int
        and type(usage.get("output", 0)) is int
        and type(usage.get("cacheRead", 0)) is int
        and type(usage.get("cacheWrite", 0)) is int
        and type(usage.get("totalTokens")) in _OPT_INT
    ):
        return False
    cost = usage.get("cost")
    if cost is None:
        return True
    if type(cost) is not dict:
        return False
    get = cost.get
    for value in (
        get("input", 0.0),
        get("output", 0.0),
        get("cacheRead", 0.0),
        get("cacheWrite", 0.0),
        get("total", 0.0),
    ):
        if type(value) is not float and not (type(value) is int and -(2**53) <= value <= 2**53):
            return False  # a float, or an int a float holds (pydantic's float takes it as it is)
    return True


def is_common_entry(raw: dict[str, Any]) -> bool:
    """True when `raw` is an entry of a common shape that `parse_entry` accepts (a user,
    assistant or tool result message with plain JSON field types, a thinking level or model
    change); False means: ask `parse_entry`, never that the entry is invalid."""
    # Each shape's fields spelled out, the commonest shapes first: the reader asks this of
    # most lines, and loops over tables of fields cost about twice as much (a test holds this
    # to the table-driven check it replaced).
    if type(raw.get("id")) is not str:
        return False
    if type(raw.get("parentId")) not in _OPT_STR or type(raw.get("timestamp")) not in _OPT_STR:
        return False
    kind = raw.get("type")
    if kind != "message":
        return _common_other(raw, kind)
    message = raw.get("message")
    if type(message) is not dict:
        return False
    role = message.get("role")
    if type(role) is not str:
        return False
    if role == "assistant":
        if not (
            type(message.get("api")) in _OPT_STR
            and type(message.get("provider")) in _OPT_STR
            and type(message.get("model")) in _OPT_STR
            and type(message.get("stopReason")) in _OPT_STR
            and type(message.get("errorMessage")) in _OPT_STR
            and type(message.get("timestamp")) in _OPT_NUMBER
        ):
            return False
        if "content" in message and not _common_blocks(message["content"]):
            return False
        return _usage_ok(message.get("usage"))
    if role == "toolResult":
        if not (
            type(message.get("toolCallId")) is str
            and type(message.get("toolName")) in _OPT_STR
            and type(message.get("isError", False)) is bool
            and type(message.get("timestamp")) in _OPT_NUMBER
        ):
            return False
        return "content" not in message or _common_blocks(message["content"])
    if role == "user":
        if type(message.get("timestamp")) not in _OPT_NUMBER:
            return False
        content = message.get("content")  # required: a missing one is pydantic's to name
        return type(content) is str or _common_blocks(content)
    return False


def _common_other(raw: dict[str, Any], kind: Any) -> bool:
    """`is_common_entry` of an entry whose type is not message."""
    if type(kind) is not str:
        return False
    if kind == "thinking_level_change":
        return type(raw.get("thinkingLevel")) is str
    if kind == "model_change":
        return type(raw.get("provider")) in _OPT_STR and type(raw.get("modelId")) in _OPT_STR
    return False


#: `arguments` absent: what stands for it (pydantic's default, a dict).
_NO_ARGUMENTS: dict[str, Any] = {}


def _common_blocks(content: Any) -> bool:
    """Whether a message's content is a list of text, tool call and thinking blocks of plain
    types (text first: most blocks are)."""
    if type(content) is not list:
        return False
    for block in content:
        if type(block) is not dict:
            return False
        kind = block.get("type")
        if type(kind) is not str:
            return False
        if kind == "text":
            if (
                type(block.get("text")) is not str
                or type(block.get("textSignature")) not in _OPT_STR
            ):
                return False
        elif kind == "toolCall":
            if not (
                type(block.get("id")) is str
                and type(block.get("name")) is str
                and type(block.get("arguments", _NO_ARGUMENTS)) is dict
                and type(block.get("thoughtSignature")) in _OPT_STR
                and type(block.get("partialJson")) in _OPT_STR
            ):
                return False
        elif kind == "thinking":
            if not (
                type(block.get("thinking")) is str
                and type(block.get("thinkingSignature")) in _OPT_STR
                and type(block.get("redacted")) in _OPT_BOOL
            ):
                return False
        else:
            return False  # an image or an unknown type: pydantic decides
    return True


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
