"""The one envelope every record on the wire travels in, and its payloads by kind."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Final, Literal, TypeVar

import msgspec
import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    TypeAdapter,
    ValidationError,
)

from sessionfold.events.errors import NewerFormatError, error_locations
from sessionfold.events.lines import DEPTH_REASON, ENVELOPE_DEPTH, may_be_too_deep, too_deep

#: The envelope schema this build writes and the newest one it reads.
SCHEMA_VERSION = 1
#: The longest entry line an envelope carries; the topics are sized so such an envelope fits.
MAX_ENTRY_BYTES = 16 * 1024 * 1024


class Kind(StrEnum):
    """Every kind of envelope, by the topic it travels on."""

    # session-events
    ENTRY = "entry"
    RELOAD = "reload"
    USAGE = "usage"
    COMMAND = "command"
    WORLD = "world"
    COMPACT_REQUEST = "compact-request"
    PLACEHOLDER = "placeholder"
    # flush-requests, compaction-events, flush-metrics
    FLUSH_REQUEST = "flush-request"
    COMPACTION = "compaction"
    FLUSH_METRICS = "flush-metrics"


SESSION_EVENT_KINDS = frozenset(
    {
        Kind.ENTRY,
        Kind.RELOAD,
        Kind.USAGE,
        Kind.COMMAND,
        Kind.WORLD,
        Kind.COMPACT_REQUEST,
        Kind.PLACEHOLDER,
    }
)


class SchemaVersionError(NewerFormatError):
    """An envelope written by a newer sessionfold: refused by name, never misread."""

    def __init__(self, found: int) -> None:
        super().__init__(found, f"envelope schema_version {found} is", SCHEMA_VERSION)


class Payload(BaseModel):
    """Base of every payload: immutable, unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class FactsCell(msgspec.Struct, gc=False):
    """Where an entry payload keeps the facts the folds derive from its entry, once
    (projections/pruning/entry_facts.py): the entry they were read from and the facts.

    Equal to every other cell and never copied, so a payload compares, copies and dumps as
    its fields alone. A struct the collector does not track (it holds the entry and its
    facts, neither of which refers back to it, so it closes no cycle): built in C, and the
    payload's private dict holding it is left untracked too, two objects fewer per envelope
    for the collector to walk."""

    entry: dict[str, Any] | None = None
    facts: Any = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FactsCell)

    __hash__ = None  # type: ignore[assignment]

    def __copy__(self) -> FactsCell:
        return FactsCell()

    def __deepcopy__(self, memo: dict[int, Any]) -> FactsCell:
        return FactsCell()


class EntryPayload(Payload):
    """A pi session entry (the header included), migrated to the v3 shape.

    `entry` is the parsed JSON object as it stood in the file, key order and unknown fields
    kept; `line` is its 1-based line in the source file, so a file-backed log can read it back.
    """

    entry: dict[str, Any]
    line: int | None = None
    _facts: FactsCell = PrivateAttr(default_factory=FactsCell)


# The slots every model has (BaseModel's): setting them through their descriptors costs about
# half of `object.__setattr__`, which looks the name up first.
_new = object.__new__
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__
_ENTRY_KIND = Kind.ENTRY
# The fields set of every entry payload and envelope built here, one set each, shared: the
# models are frozen, so pydantic never adds to them (a copy takes a set of its own first),
# and two sets fewer per line are two objects fewer for the reader to allocate and the
# collector to track.
_PAYLOAD_FIELDS = {"entry", "line"}
_ENVELOPE_FIELDS = {"session_id", "seq", "producer", "time", "payload"}


def entry_envelope(
    session_id: str,
    seq: int,
    producer: str,
    time: str | None,
    entry: dict[str, Any],
    line: int | None,
) -> EntryEnvelope:
    """The envelope of an entry a reader has checked (`entries.check_entry`), equal to the one
    validation builds from the same values, built without validating them again.

    The reader builds one per line: validation (a copy of the entry dict) or pydantic's
    `model_construct` (Python over every field) would cost more than the rest of its work on
    the envelope. Values validation would refuse (an empty session id, a negative seq) are
    validated, so they fail as they always did. A test holds the two constructions equal.
    """
    if not session_id or seq < 0:
        return EntryEnvelope(
            session_id=session_id,
            seq=seq,
            producer=producer,
            time=time,
            payload=EntryPayload(entry=entry, line=line),
        )
    payload = _new(EntryPayload)
    _set_dict(payload, {"entry": entry, "line": line})
    _set_fields(payload, _PAYLOAD_FIELDS)
    _set_extra(payload, None)
    _set_private(payload, {"_facts": FactsCell()})
    envelope = _new(EntryEnvelope)
    _set_dict(
        envelope,
        {
            "schema_version": SCHEMA_VERSION,
            "session_id": session_id,
            "seq": seq,
            "producer": producer,
            "time": time,
            "kind": _ENTRY_KIND,
            "payload": payload,
        },
    )
    _set_fields(envelope, _ENVELOPE_FIELDS)
    _set_extra(envelope, None)
    _set_private(envelope, None)
    return envelope


class ReloadPayload(Payload):
    """The branch may have changed: pi's session_start, /reload or /tree navigation."""

    reason: Literal["start", "reload", "tree"] = "reload"
    leaf_id: str | None = None


class UsagePayload(Payload):
    """Context tokens as the provider reported them, and the model's window."""

    tokens: int | None = None
    context_window: int | None = None


class CommandPayload(Payload):
    """An operator command for one session: a manual flush, a compaction, a config change."""

    name: Literal["flush", "compact", "config"]
    settings: dict[str, Any] = Field(default_factory=dict)


class WorldPayload(Payload):
    """A producer-side snapshot of read-only workspace facts (git branch, head, dirty paths)."""

    facts: dict[str, Any] = Field(default_factory=dict)


class CompactRequestPayload(Payload):
    """pi is about to compact: run a ledger pass."""

    custom_instructions: str | None = None


class PlaceholderPayload(Payload):
    """The place in the session tree of an entry the reader dead-lettered: ids only, no content.

    `id` is the entry's own (a JSON object with a string `id` that is not a valid entry) or
    the one a v1 file's position gives it; None when the line held no readable id (a gap).
    `parentId` is the parent it names; when `previous` is true it named none that can be read,
    and the placeholder hangs under the entry folded before it. `line` is its 1-based line in
    the source file, `reason` the dead letter's (field paths and codes, never text).
    """

    id: str | None = None
    parentId: str | None = None
    previous: bool = False
    line: int | None = None
    reason: str = ""


class OpaquePayload(BaseModel):
    """Payload of the derived kinds; its model lives with the fold that writes it."""

    model_config = ConfigDict(frozen=True, extra="allow")


class _EnvelopeBase(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    session_id: str = Field(min_length=1)
    seq: int = Field(ge=0)
    producer: str = "sessionfold"
    time: str | None = None


class EntryEnvelope(_EnvelopeBase):
    kind: Literal[Kind.ENTRY] = Kind.ENTRY
    payload: EntryPayload


class ReloadEnvelope(_EnvelopeBase):
    kind: Literal[Kind.RELOAD] = Kind.RELOAD
    payload: ReloadPayload = ReloadPayload()


class UsageEnvelope(_EnvelopeBase):
    kind: Literal[Kind.USAGE] = Kind.USAGE
    payload: UsagePayload


class CommandEnvelope(_EnvelopeBase):
    kind: Literal[Kind.COMMAND] = Kind.COMMAND
    payload: CommandPayload


class WorldEnvelope(_EnvelopeBase):
    kind: Literal[Kind.WORLD] = Kind.WORLD
    payload: WorldPayload


class CompactRequestEnvelope(_EnvelopeBase):
    kind: Literal[Kind.COMPACT_REQUEST] = Kind.COMPACT_REQUEST
    payload: CompactRequestPayload = CompactRequestPayload()


class PlaceholderEnvelope(_EnvelopeBase):
    """A dead-lettered entry keeping its place (and sequence number) in the session."""

    kind: Literal[Kind.PLACEHOLDER] = Kind.PLACEHOLDER
    payload: PlaceholderPayload


class FlushRequestEnvelope(_EnvelopeBase):
    """A flush-requests record: a pruning flush or a ledger pass (the subclasses)."""

    kind: Literal[Kind.FLUSH_REQUEST] = Kind.FLUSH_REQUEST
    payload: OpaquePayload


class PruningRequestEnvelope(FlushRequestEnvelope):
    """A flush that needs the model (events/flush.py reads its payload)."""


class LedgerRequestEnvelope(FlushRequestEnvelope):
    """A ledger pass request: its payload names the ledger's producer."""


class CompactionEnvelope(_EnvelopeBase):
    """A compaction-events record; one of no producer we know is neither fold's."""

    kind: Literal[Kind.COMPACTION] = Kind.COMPACTION
    payload: OpaquePayload


class PruningCompactionEnvelope(CompactionEnvelope):
    """The summarizer's answer to a pruning flush request."""


class LedgerPassEnvelope(CompactionEnvelope):
    """A ledger pass result."""


class FlushMetricsEnvelope(_EnvelopeBase):
    kind: Literal[Kind.FLUSH_METRICS] = Kind.FLUSH_METRICS
    payload: OpaquePayload


_Opaque = TypeVar("_Opaque", bound=FlushRequestEnvelope | CompactionEnvelope | FlushMetricsEnvelope)
_NO_TIME: Any = object()


def opaque_envelope(
    cls: type[_Opaque], session_id: str, seq: int, body: dict[str, Any], time: Any = _NO_TIME
) -> _Opaque:
    """`cls(session_id=..., seq=..., time=..., payload=OpaquePayload(**body))` (`time` left out
    when not given), built without validating what a fold or an answer wrote itself: a
    non-empty session id, a non-negative int seq, a str or None time, str keys. Anything else
    is validated, so it fails as it always did. A test holds the two constructions equal."""
    timed = time is not _NO_TIME
    if not (
        cls in _OPAQUE_KINDS
        and type(session_id) is str
        and session_id
        and type(seq) is int
        and seq >= 0
        and (not timed or time is None or type(time) is str)
        and type(body) is dict
        and all(type(name) is str for name in body)
    ):
        fields: dict[str, Any] = {"time": time} if timed else {}
        return cls(session_id=session_id, seq=seq, payload=OpaquePayload(**body), **fields)
    payload = _new(OpaquePayload)
    _set_dict(payload, {})
    _set_fields(payload, set(body))
    _set_extra(payload, dict(body))
    _set_private(payload, None)
    envelope = _new(cls)
    _set_dict(
        envelope,
        {
            "schema_version": SCHEMA_VERSION,
            "session_id": session_id,
            "seq": seq,
            "producer": _DEFAULT_PRODUCER,
            "time": time if timed else None,
            "kind": _OPAQUE_KINDS[cls],
            "payload": payload,
        },
    )
    _set_fields(envelope, _TIMED_FIELDS if timed else _UNTIMED_FIELDS)
    _set_extra(envelope, None)
    _set_private(envelope, None)
    return envelope


_DEFAULT_PRODUCER = _EnvelopeBase.model_fields["producer"].default
_OPAQUE_KINDS: dict[type, Kind] = {
    cls: cls.model_fields["kind"].default
    for base in (FlushRequestEnvelope, CompactionEnvelope)
    for cls in (base, *base.__subclasses__())
}
_OPAQUE_KINDS[FlushMetricsEnvelope] = Kind.FLUSH_METRICS
# Fresh sets per envelope would be two more objects; frozen models never add to them.
_TIMED_FIELDS = {"session_id", "seq", "time", "payload"}
_UNTIMED_FIELDS = {"session_id", "seq", "payload"}


#: `producer` of a pruning compaction's payload.
PRUNING_PRODUCER: Final = "sessionfold-pruning"
#: `producer` of a ledger pass request's and result's payload (and of our pi compaction entries).
LEDGER_PRODUCER: Final = "sessionfold-ledger"

# The wire tells the request and answer types apart only by the payload's producer; decoding
# picks the class, so nothing past events/ compares producer strings. A tag that is not a kind
# is named by its kind in error messages (`_TAG_KINDS`).
_LEDGER_REQUEST, _UNKNOWN_COMPACTION, _LEDGER_PASS = "ledger-request", "other-compaction", "ledger"
_TAG_KINDS = {
    _LEDGER_REQUEST: Kind.FLUSH_REQUEST.value,
    _UNKNOWN_COMPACTION: Kind.COMPACTION.value,
    _LEDGER_PASS: Kind.COMPACTION.value,
}


def _tag(value: Any) -> Any:
    """The union member an envelope (a dict or a model) decodes to: its kind, or its producer."""
    if isinstance(value, dict):
        kind, payload = value.get("kind"), value.get("payload")
        producer = payload.get("producer") if isinstance(payload, dict) else None
    else:
        payload = getattr(value, "payload", None)
        kind, producer = getattr(value, "kind", None), getattr(payload, "producer", None)
    if kind == Kind.FLUSH_REQUEST:
        return _LEDGER_REQUEST if producer == LEDGER_PRODUCER else Kind.FLUSH_REQUEST.value
    if kind == Kind.COMPACTION:
        if producer == PRUNING_PRODUCER:
            return Kind.COMPACTION.value
        return _LEDGER_PASS if producer == LEDGER_PRODUCER else _UNKNOWN_COMPACTION
    return kind.value if isinstance(kind, Kind) else kind


Envelope = Annotated[
    Annotated[EntryEnvelope, Tag(Kind.ENTRY.value)]
    | Annotated[ReloadEnvelope, Tag(Kind.RELOAD.value)]
    | Annotated[UsageEnvelope, Tag(Kind.USAGE.value)]
    | Annotated[CommandEnvelope, Tag(Kind.COMMAND.value)]
    | Annotated[WorldEnvelope, Tag(Kind.WORLD.value)]
    | Annotated[CompactRequestEnvelope, Tag(Kind.COMPACT_REQUEST.value)]
    | Annotated[PlaceholderEnvelope, Tag(Kind.PLACEHOLDER.value)]
    | Annotated[PruningRequestEnvelope, Tag(Kind.FLUSH_REQUEST.value)]
    | Annotated[LedgerRequestEnvelope, Tag(_LEDGER_REQUEST)]
    | Annotated[PruningCompactionEnvelope, Tag(Kind.COMPACTION.value)]
    | Annotated[LedgerPassEnvelope, Tag(_LEDGER_PASS)]
    | Annotated[CompactionEnvelope, Tag(_UNKNOWN_COMPACTION)]
    | Annotated[FlushMetricsEnvelope, Tag(Kind.FLUSH_METRICS.value)],
    Discriminator(_tag),
]

_ENVELOPE = TypeAdapter(Envelope)


class EnvelopeError(ValueError):
    """Bytes that are not a readable envelope; the message names the cause, never the content."""


def encode(envelope: _EnvelopeBase) -> bytes:
    """Serialize an envelope to the JSON bytes that go on the wire."""
    return orjson.dumps(envelope.model_dump(mode="json"))


def decode(data: bytes | str) -> Envelope:
    """Read an envelope from wire bytes; a newer schema raises SchemaVersionError."""
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if may_be_too_deep(data, ENVELOPE_DEPTH) and str(exc).startswith("depth limit"):
            raise EnvelopeError(f"{DEPTH_REASON} ({len(data)} bytes)") from None
        raise EnvelopeError(f"not JSON ({len(data)} bytes)") from exc
    if may_be_too_deep(data, ENVELOPE_DEPTH) and too_deep(raw, ENVELOPE_DEPTH):
        # orjson reads 1024 levels but writes 254, and the folds recurse: refuse it here.
        raise EnvelopeError(f"{DEPTH_REASON} ({len(data)} bytes)")
    return from_dict(raw)


def from_dict(raw: Any) -> Envelope:
    """Validate a decoded JSON value as an envelope."""
    if not isinstance(raw, dict):
        raise EnvelopeError(f"envelope is a JSON {type(raw).__name__}, not an object")
    version = raw.get("schema_version", SCHEMA_VERSION)
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise SchemaVersionError(version)
    try:
        return _ENVELOPE.validate_python(raw)
    except ValidationError as exc:
        # Field locations and error types only: the input may hold message text.
        raise EnvelopeError(f"invalid envelope ({error_locations(exc, tags=_TAG_KINDS)})") from None
