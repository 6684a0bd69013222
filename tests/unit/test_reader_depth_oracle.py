"""The reader's bracket bound and shared fields sets against what they replace.

`may_be_too_deep` (and the reader's common line, which spells it out) counts a line's
opening brackets by deleting every other byte, in place of two counts; `entry_envelope` gives
every envelope and payload one shared fields set, which no copy or dump may change.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.events.envelope import EntryEnvelope, EntryPayload, encode, entry_envelope
from sessionfold.events.lines import MAX_DEPTH, may_be_too_deep

_BYTES = st.one_of(
    st.binary(max_size=400),
    st.lists(
        st.sampled_from((b"[", b"{", b"]", b"}", b'"', b"a", b"\xff", b"\x00")), max_size=300
    ).map(b"".join),
)


@settings(max_examples=2000)
@given(_BYTES, st.integers(0, 2 * MAX_DEPTH))
def test_the_bracket_bound_is_the_two_counts(data: bytes, limit: int) -> None:
    """Property: the bound of any bytes is the sum of its "[" and "{" counts over the limit,
    as bytes and as the text they decode to."""
    assert may_be_too_deep(data, limit) == (data.count(b"[") + data.count(b"{") > limit)
    text = data.decode("utf-8", "replace")
    assert may_be_too_deep(text, limit) == (text.count("[") + text.count("{") > limit)


def test_shared_fields_sets_stay_what_validation_sets() -> None:
    """Envelopes built by the reader share their fields sets; a copy with an update, a deep
    copy and a dump leave every other envelope's as validation sets it."""
    built = [
        entry_envelope("s", seq, "p", None, {"type": "x", "id": str(seq)}, seq) for seq in (1, 2)
    ]
    validated = EntryEnvelope(
        session_id="s", seq=1, producer="p", time=None, payload=EntryPayload(entry={}, line=1)
    )
    copied = built[0].model_copy(update={"seq": 9})
    built[1].model_copy(deep=True)
    built[0].payload.model_copy(update={"line": 3})
    encode(built[1])
    assert "seq" in copied.model_fields_set
    for envelope in built:
        assert envelope.model_fields_set == validated.model_fields_set
        assert envelope.payload.model_fields_set == validated.payload.model_fields_set
