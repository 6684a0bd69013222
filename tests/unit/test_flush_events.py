"""Payloads of the pruning kinds (events/flush.py): wrapping, reading back, the producer check."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sessionfold.events.envelope import (
    CompactionEnvelope,
    FlushMetricsEnvelope,
    FlushRequestEnvelope,
    OpaquePayload,
    PruningCompactionEnvelope,
    decode,
    encode,
)
from sessionfold.events.flush import (
    BatchResult,
    CompactionPayload,
    FlushBatch,
    FlushCall,
    FlushMetricsPayload,
    FlushRequestPayload,
    Frontier,
    MetricsSnapshot,
    ModelUsage,
    read_compaction,
    read_flush_metrics,
    read_request,
    wrap,
    wrap_sized,
)

CALL = FlushCall(
    key="c1@5",
    tool_call_id="c1",
    tool_name="bash",
    arguments={"command": "ls"},
    raw_chars=1500,
    content_hash="h",
    head="x",
    seq=3,
    ref="t1",
)
REQUEST = FlushRequestPayload(
    request_id="s:4",
    session_id="s",
    seq=4,
    trigger="manual",
    model="offline",
    batches=(FlushBatch(turn_index=0, timestamp=9, disposition="summarize", calls=(CALL,)),),
    frontier_before=Frontier(last_attempted_tool_call_id="c0"),
    metrics=MetricsSnapshot(frontier_gap_tokens=12),
    time="2025-01-01T00:00:00Z",
)
COMPACTION = CompactionPayload(
    request_id="s:4",
    session_id="s",
    model="offline",
    results=(BatchResult(batch=0, outcome="summarized", text="did", refs=("t1",)),),
)
METRICS = FlushMetricsPayload(
    request_id="s:4",
    session_id="s",
    seq=4,
    trigger="budget",
    captured_batches=2,
    processed_batches=1,
    outcome="summarized",
    metrics=MetricsSnapshot(),
    time="2025-01-01T00:00:01Z",
)


def test_each_payload_is_wrapped_in_its_own_kind() -> None:
    """A request, a compaction and a metrics record get their envelopes, with seq and time."""
    request, compaction, metrics = wrap(REQUEST, 4), wrap(COMPACTION, 5), wrap(METRICS, 6)
    assert isinstance(request, FlushRequestEnvelope)
    assert isinstance(compaction, CompactionEnvelope)
    assert isinstance(metrics, FlushMetricsEnvelope)
    assert [(e.session_id, e.seq) for e in (request, compaction, metrics)] == [
        ("s", 4),
        ("s", 5),
        ("s", 6),
    ]
    assert (request.time, metrics.time) == (REQUEST.time, METRICS.time)


def test_payloads_read_back_equal_through_the_wire() -> None:
    """Encoded, decoded and read, every payload is the one wrapped."""
    request = decode(encode(wrap(REQUEST, 4)))
    compaction = decode(encode(wrap(COMPACTION, 5)))
    metrics = decode(encode(wrap(METRICS, 6)))
    assert isinstance(request, FlushRequestEnvelope)
    assert isinstance(compaction, CompactionEnvelope)
    assert isinstance(metrics, FlushMetricsEnvelope)
    assert read_request(request) == REQUEST
    assert read_compaction(compaction) == COMPACTION
    assert read_flush_metrics(metrics) == METRICS


def test_the_payload_travels_in_snake_case() -> None:
    """On the wire the payload's fields keep their snake_case names."""
    wire = encode(wrap(METRICS, 6))
    assert b'"captured_batches":2' in wire
    assert b'"request_id":"s:4"' in wire


def test_only_a_pruning_producer_decodes_to_a_pruning_compaction() -> None:
    """A compaction from another producer (the ledger pass, or unknown) is not pruning's."""
    pruning = wrap(COMPACTION, 1)
    assert isinstance(decode(encode(pruning)), PruningCompactionEnvelope)
    ledger = CompactionEnvelope(
        session_id="s", seq=1, payload=OpaquePayload(producer="sessionfold-ledger")
    )
    for other in (ledger, CompactionEnvelope(session_id="s", seq=1, payload={})):
        decoded = decode(encode(other))
        assert isinstance(decoded, CompactionEnvelope)
        assert not isinstance(decoded, PruningCompactionEnvelope)


_USAGE = st.builds(
    ModelUsage,
    input_tokens=st.integers(min_value=0, max_value=10**9),
    output_tokens=st.integers(min_value=0, max_value=10**9),
    cost=st.integers(min_value=0, max_value=10**6).map(float),
    calls=st.integers(min_value=0, max_value=10**6),
    cache_read_tokens=st.integers(min_value=0, max_value=10**9),
    cache_write_tokens=st.integers(min_value=0, max_value=10**9),
)


@given(a=_USAGE, b=_USAGE, c=_USAGE)
def test_usages_add_up_in_any_order(a: ModelUsage, b: ModelUsage, c: ModelUsage) -> None:
    """`plus` is a sum: commutative, associative, with the zero usage as identity."""
    assert a.plus(b) == b.plus(a)
    assert a.plus(b).plus(c) == a.plus(b.plus(c))
    assert a.plus(ModelUsage()) == a


_TEXT = st.text(max_size=80)
_RESULT = st.builds(
    BatchResult,
    batch=st.integers(min_value=0, max_value=10**6),
    outcome=st.sampled_from(["summarized", "skipped-trivial", "failed"]),
    text=st.none() | _TEXT,
    refs=st.lists(_TEXT, max_size=4).map(tuple),
    usage=st.builds(
        ModelUsage,
        input_tokens=st.integers(min_value=0, max_value=2**63),
        cost=st.floats(allow_nan=True, allow_infinity=True),
    ),
    error=st.none() | _TEXT,
)
_COMPACTION = st.builds(
    CompactionPayload,
    request_id=_TEXT,
    session_id=st.text(min_size=1, max_size=40),
    model=_TEXT,
    results=st.lists(_RESULT, max_size=6).map(tuple),
    error=st.none() | _TEXT,
)


@given(
    st.one_of(_COMPACTION, st.sampled_from([REQUEST, METRICS])),
    st.integers(min_value=0, max_value=2**63),
)
def test_a_wrapped_payloads_size_is_its_envelopes_encoded_length(
    payload: CompactionPayload | FlushRequestPayload | FlushMetricsPayload, seq: int
) -> None:
    """Property: `wrap_sized` wraps as `wrap` does, and the size it computes without encoding
    the envelope is the length of the envelope's encoding, for any text (any Unicode, escapes),
    numbers (large, NaN, infinite costs) and absent fields."""
    envelope, size = wrap_sized(payload, seq)
    assert envelope == wrap(payload, seq)
    assert size == len(encode(envelope))
