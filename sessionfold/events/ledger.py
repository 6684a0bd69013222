"""The ledger pass result: the compaction payload a Longhaul-style pass produces.

It travels on the compaction-events topic as the payload of a `compaction` envelope, and inside
a `sessionfold-ledger.span` custom entry of a session file (the span record), so a fold that did
not run the pass rebuilds the same state from the transcript. Every payload carries
`stateFormat`; one from a newer format is refused by name, never misread.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sessionfold.events.envelope import (
    LEDGER_PRODUCER,
    LedgerPassEnvelope,
    LedgerRequestEnvelope,
    OpaquePayload,
)
from sessionfold.events.errors import NewerFormatError

#: The ledger state format this build writes and the newest it reads.
STATE_FORMAT = 1
#: The span record version this build writes and reads; any other is skipped silently.
SPAN_RECORD_VERSION = 1
#: customType of the span record entry appended after our compaction entry.
SPAN_RECORD_TYPE = "sessionfold-ledger.span"


class StateFormatError(NewerFormatError):
    """A ledger record written by a newer sessionfold: refused by name, never misread."""

    def __init__(self, found: int, what: str = "ledger record") -> None:
        super().__init__(found, f"{what} has stateFormat {found},", STATE_FORMAT)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RuleEvent(_Frozen):
    """A standing rule: the user's exact words, cut from their message by code."""

    kind: Literal["rule"] = "rule"
    n: int
    id: str  # R<n>
    u: str  # the user message it came from, u<n>
    entry: str | None  # that message's entry id
    words: str
    start: int  # words == message text[start:end]
    end: int


class LiftEvent(_Frozen):
    """A withdrawal of a rule by a user message."""

    kind: Literal["lift"] = "lift"
    n: int
    rule: str  # R<n> lifted
    by: str  # u<n>
    entry: str | None
    replacedBy: str | None = None  # R<n> when a new rule of the same message replaces it


class NoteEvent(_Frozen):
    """A decision (D<n>) or a dead end (X<n>), with the ledger ids that back it."""

    kind: Literal["decision", "deadEnd"]
    n: int
    id: str
    text: str
    evidence: list[str] = Field(default_factory=list)


class ValueEvent(_Frozen):
    """A value a later turn may need, kept only where it stands verbatim in its turn."""

    kind: Literal["value"] = "value"
    n: int
    id: str  # V<n>
    value: str
    turn: str  # u<n>, C<n> or E<n>
    what: str = ""


LedgerEvent = Annotated[RuleEvent | LiftEvent | NoteEvent | ValueEvent, Field(discriminator="kind")]


class IdRange(_Frozen):
    """First and last id number of a kind that a span holds; empty when last < first."""

    first: int
    last: int


class SpanRecord(_Frozen):
    """What one closed span holds: its bounds, its work-log line, its World, how it was made."""

    v: int = SPAN_RECORD_VERSION
    stateFormat: int = STATE_FORMAT
    span: int
    request: str
    trigger: str  # compact-request | compaction | end | record
    entry: str | None = None  # the compaction entry that bounded it, if any
    lastSeq: int
    model: str  # the DiffModel's name, e.g. "offline"
    narrativeKind: Literal["model", "narrative-less", "turns"]
    narrative: str
    now: str | None = None
    world: dict[str, Any] | None = None
    commands: IdRange
    errors: IdRange
    users: IdRange
    counts: dict[str, int] = Field(default_factory=dict)
    dropped: dict[str, int] = Field(default_factory=dict)  # reason code -> count
    carried: list[str] = Field(default_factory=list)  # u ids offered again next pass
    calls: int = 0
    reason: str | None = None  # why it closed narrative-less, or why a chunk is missing
    chunks: int = 1  # diff calls the span was split into (retries and questions aside)
    takeover: str | None = None  # the entry of the foreign compaction this pass took over
    # Turns mode: the objective, each section's outcome (ok, repaired, carried, ...), and the
    # reasons the model gave for excusing an expectation check.
    objective: str | None = None
    sections: dict[str, str] = Field(default_factory=dict)
    excuses: dict[str, str] = Field(default_factory=dict)
    missing: list[int] = Field(default_factory=list)  # chunks that never verified
    summaryChars: int = 0
    capFit: dict[str, int] = Field(default_factory=dict)  # section -> items left out


class LedgerPassPayload(_Frozen):
    """The result of one pass: accepted events, the span record and the rendered summary.

    A `fallback` payload closes nothing: the pass threw, pi's own compaction stands, and the
    flush barrier is released.
    """

    producer: Literal["sessionfold-ledger"] = LEDGER_PRODUCER
    stateFormat: int = STATE_FORMAT
    request: str
    session: str
    span: int
    seq: int
    events: list[LedgerEvent] = Field(default_factory=list)
    record: SpanRecord | None = None
    summary: str = ""
    fallback: str | None = None


def check_state_format(value: Any, what: str = "ledger record") -> None:
    """Raise StateFormatError when `value` names a state format newer than this build's."""
    if isinstance(value, int) and not isinstance(value, bool) and value > STATE_FORMAT:
        raise StateFormatError(value, what)


# --- on the wire: a pass request on flush-requests, its result on compaction-events ----------


def request_envelope(request: dict[str, Any]) -> LedgerRequestEnvelope:
    """The flush-requests record asking for one ledger pass (the request dict, marked ours)."""
    payload = OpaquePayload(**request, producer=LEDGER_PRODUCER)
    return LedgerRequestEnvelope(session_id=request["session"], seq=request["seq"], payload=payload)


def read_ledger_request(envelope: LedgerRequestEnvelope) -> dict[str, Any]:
    """The pass request a ledger flush-requests record carries, as the fold wrote it."""
    request = envelope.payload.model_dump(mode="json")
    request.pop("producer", None)
    return request


def answer_envelope(payload: dict[str, Any]) -> LedgerPassEnvelope:
    """The compaction-events record carrying one pass result (its seq: the request's)."""
    return LedgerPassEnvelope(
        session_id=payload["session"], seq=payload["seq"], payload=OpaquePayload(**payload)
    )
