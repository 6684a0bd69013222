"""`opaque_envelope` (an opaque-payload envelope built without validation) against the
validated construction it stands for, kept here as the oracle: `cls(session_id=..., seq=...,
time=..., payload=OpaquePayload(**body))`. Drawn values the fold and the answers write, and ones
validation refuses (an empty id, a negative or non-int seq, a non-str time, non-str keys)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from sessionfold.events.envelope import (
    CompactionEnvelope,
    FlushMetricsEnvelope,
    FlushRequestEnvelope,
    LedgerPassEnvelope,
    LedgerRequestEnvelope,
    OpaquePayload,
    PruningCompactionEnvelope,
    PruningRequestEnvelope,
    encode,
    opaque_envelope,
)

_CLASSES = (
    FlushRequestEnvelope,
    PruningRequestEnvelope,
    LedgerRequestEnvelope,
    CompactionEnvelope,
    PruningCompactionEnvelope,
    LedgerPassEnvelope,
    FlushMetricsEnvelope,
)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
_KEYS = st.text(max_size=8) | st.sampled_from(("request_id", "session_id", "seq", "time"))
_BODY = st.dictionaries(_KEYS, _JSON, max_size=6) | st.dictionaries(
    st.integers(), _JSON, min_size=1, max_size=2
)
_UNSET = object()


def _validated(cls: type, session_id: Any, seq: Any, body: Any, time: Any) -> Any:
    fields = {} if time is _UNSET else {"time": time}
    return cls(session_id=session_id, seq=seq, payload=OpaquePayload(**body), **fields)


def _built(cls: type, session_id: Any, seq: Any, body: Any, time: Any) -> Any:
    if time is _UNSET:
        return opaque_envelope(cls, session_id, seq, body)
    return opaque_envelope(cls, session_id, seq, body, time)


@given(
    st.sampled_from(_CLASSES),
    st.sampled_from(("", "s", "0199a-b")) | st.text(max_size=4),
    st.sampled_from((-1, 0, 7, True, 1.0, "3")) | st.integers(-2, 2**40),
    _BODY,
    st.sampled_from((_UNSET, None, "2025-01-01T00:00:00Z", 5)),
)
def test_opaque_envelope_is_the_validated_one(
    cls: type, session_id: Any, seq: Any, body: Any, time: Any
) -> None:
    """Equal, field for field (set fields, extras, private state), encoded alike; or refused
    with the same error."""
    try:
        expected = _validated(cls, session_id, seq, body, time)
    except (ValidationError, TypeError) as exc:
        with pytest.raises(type(exc)):
            _built(cls, session_id, seq, body, time)
        return
    built = _built(cls, session_id, seq, body, time)
    assert type(built) is type(expected)
    assert built == expected
    assert built.__dict__ == expected.__dict__
    assert built.model_fields_set == expected.model_fields_set
    assert built.__pydantic_extra__ == expected.__pydantic_extra__
    assert built.__pydantic_private__ == expected.__pydantic_private__
    assert built.payload.model_fields_set == expected.payload.model_fields_set
    assert built.payload.__pydantic_extra__ == expected.payload.__pydantic_extra__
    assert built.payload.__pydantic_private__ == expected.payload.__pydantic_private__
    assert built.payload.__pydantic_extra__ is not body  # a copy, as the keywords make
    assert encode(built) == encode(expected)
    assert built.model_copy(update={"seq": 1}) == expected.model_copy(update={"seq": 1})
