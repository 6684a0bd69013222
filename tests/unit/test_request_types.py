"""Flush requests, ledger pass requests and their answers decode to their own envelope classes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionfold.events.envelope import (
    CompactionEnvelope,
    EnvelopeError,
    LedgerPassEnvelope,
    LedgerRequestEnvelope,
    PruningCompactionEnvelope,
    PruningRequestEnvelope,
    decode,
    encode,
)
from sessionfold.events.flush import CompactionPayload, FlushBatch, FlushRequestPayload, wrap
from sessionfold.events.ledger import answer_envelope, request_envelope

SID = "s1"

_text = st.text(max_size=12)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**31), 2**31) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)


def _pruning_request(request_id: str, seq: int) -> PruningRequestEnvelope:
    payload = FlushRequestPayload(
        request_id=request_id,
        session_id=SID,
        seq=seq,
        trigger="manual",
        model="offline",
        batches=(FlushBatch(turn_index=0, timestamp=1, disposition="skipped-trivial"),),
    )
    return wrap(payload, seq)  # type: ignore[return-value]


@given(request_id=_text, seq=st.integers(0, 2**40))
def test_a_pruning_request_decodes_to_its_type_and_the_same_bytes(
    request_id: str, seq: int
) -> None:
    """A flush request the pruning fold writes reads back as a PruningRequestEnvelope."""
    wire = encode(_pruning_request(request_id, seq))
    decoded = decode(wire)
    assert type(decoded) is PruningRequestEnvelope
    assert encode(decoded) == wire


@given(
    extra=st.dictionaries(st.sampled_from(["span", "trigger", "x"]), _json),
    seq=st.integers(0, 2**40),
)
def test_a_ledger_request_decodes_to_its_type_and_the_same_bytes(
    extra: dict[str, Any], seq: int
) -> None:
    """A ledger pass request (the request dict marked with the ledger's producer) reads back so."""
    wire = encode(
        request_envelope({"request": f"{SID}/ledger/{seq}", "session": SID, "seq": seq} | extra)
    )
    decoded = decode(wire)
    assert type(decoded) is LedgerRequestEnvelope
    assert encode(decoded) == wire


@given(request_id=_text, error=st.none() | _text)
def test_a_pruning_compaction_decodes_to_its_type_and_the_same_bytes(
    request_id: str, error: str | None
) -> None:
    """The summarizer's answer reads back as a PruningCompactionEnvelope."""
    payload = CompactionPayload(request_id=request_id, session_id=SID, model="m", error=error)
    wire = encode(wrap(payload, 3))
    decoded = decode(wire)
    assert type(decoded) is PruningCompactionEnvelope
    assert encode(decoded) == wire


@given(fields=st.dictionaries(st.sampled_from(["summary", "span", "fallback", "events"]), _json))
def test_a_ledger_pass_result_decodes_to_its_type_and_the_same_bytes(
    fields: dict[str, Any],
) -> None:
    """A ledger pass result reads back as a LedgerPassEnvelope."""
    payload = {"producer": "sessionfold-ledger", "request": "r", "session": SID, "seq": 4} | fields
    wire = encode(answer_envelope(payload))
    decoded = decode(wire)
    assert type(decoded) is LedgerPassEnvelope
    assert encode(decoded) == wire


@pytest.mark.parametrize("producer", [None, "someone-else"])
def test_a_compaction_of_no_known_producer_is_neither_folds(producer: str | None) -> None:
    """A compaction neither fold wrote decodes to the plain CompactionEnvelope, bytes kept."""
    payload = {} if producer is None else {"producer": producer}
    wire = orjson.dumps({"kind": "compaction", "session_id": SID, "seq": 1, "payload": payload})
    decoded = decode(wire)
    assert type(decoded) is CompactionEnvelope
    assert orjson.loads(encode(decoded))["payload"] == payload


def test_an_invalid_ledger_request_is_named_by_its_kind() -> None:
    """The error of a broken ledger request names the wire's kind, not an internal tag."""
    wire = orjson.dumps(
        {
            "kind": "flush-request",
            "session_id": "",
            "seq": 1,
            "payload": {"producer": "sessionfold-ledger"},
        }
    )
    with pytest.raises(EnvelopeError, match=r"^invalid envelope \(flush-request\.session_id: "):
        decode(wire)
