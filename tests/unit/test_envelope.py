"""The envelope contract: kinds, round trip, refusal of newer schemas."""

from __future__ import annotations

import orjson
import pytest

from sessionfold.events.envelope import (
    SCHEMA_VERSION,
    EntryEnvelope,
    EntryPayload,
    EnvelopeError,
    Kind,
    SchemaVersionError,
    UsageEnvelope,
    UsagePayload,
    decode,
    encode,
)


def _entry_envelope() -> EntryEnvelope:
    entry = {"type": "message", "id": "a1b2c3d4", "parentId": None, "zeta": 1, "alpha": 2}
    return EntryEnvelope(session_id="s1", seq=3, payload=EntryPayload(entry=entry, line=4))


def test_round_trip_keeps_entry_key_order() -> None:
    """An entry envelope decodes to an equal envelope with the entry's key order intact."""
    envelope = _entry_envelope()
    decoded = decode(encode(envelope))
    assert decoded == envelope
    assert list(decoded.payload.entry) == ["type", "id", "parentId", "zeta", "alpha"]


def test_every_kind_is_addressable() -> None:
    """Each kind of ARCHITECTURE.md decodes to its own envelope class."""
    usage = UsageEnvelope(session_id="s", seq=1, payload=UsagePayload(tokens=5))
    assert decode(encode(usage)).kind is Kind.USAGE
    names = {k.value for k in Kind}
    assert {"entry", "reload", "usage", "command", "world", "compact-request"} <= names
    assert {"flush-request", "compaction", "flush-metrics"} <= names


def test_newer_schema_is_refused_by_name() -> None:
    """An envelope from a newer schema raises SchemaVersionError naming both versions."""
    raw = orjson.loads(encode(_entry_envelope()))
    raw["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(SchemaVersionError) as caught:
        decode(orjson.dumps(raw))
    assert str(SCHEMA_VERSION + 1) in str(caught.value)


def test_invalid_envelope_error_carries_no_content() -> None:
    """A malformed envelope names the bad field, never the text it held."""
    raw = orjson.loads(encode(_entry_envelope()))
    raw["seq"] = "secret words here"
    with pytest.raises(EnvelopeError) as caught:
        decode(orjson.dumps(raw))
    assert "seq" in str(caught.value)
    assert "secret" not in str(caught.value)


def test_unknown_kind_is_an_error() -> None:
    """A kind this build does not know is refused, not guessed."""
    raw = orjson.loads(encode(_entry_envelope()))
    raw["kind"] = "telepathy"
    with pytest.raises(EnvelopeError):
        decode(orjson.dumps(raw))
