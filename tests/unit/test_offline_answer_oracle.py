"""The offline summarizer's answer built as its JSON (`summarize_document`, and the envelope
`answer_pruning` sends from it) held to the typed answer it replaces: `summarize`, dumped, and
`fitted_envelope` over it, as wire bytes, over drawn requests (skips, refs, errors, any text)
and size limits (an answer over its limit takes the typed path, which fits it)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.events.envelope import PruningRequestEnvelope, encode
from sessionfold.events.flush import (
    DedupedCall,
    FlushBatch,
    FlushCall,
    FlushRequestPayload,
    wrap,
)
from sessionfold.ports.summarizer import OfflineSummarizer
from sessionfold.streams.runtime.step import (
    answer_pruning,
    error_answer,
    fitted_envelope,
    offline_envelope,
)

_TEXT = st.text(st.sampled_from("ab /._-`\n\r\té€\u0130error failed Traceback src/a.py 0"))
_NAMES = st.sampled_from(["bash", "read", "edit", "grep", "Bash", "tool"])
_ARGS = st.dictionaries(
    st.sampled_from(["command", "path", "pattern", "query", "x", "cmd"]),
    st.one_of(_TEXT, st.integers(), st.none(), st.lists(st.integers(), max_size=2)),
    max_size=3,
)


@st.composite
def _calls(draw: st.DrawFn, number: int) -> FlushCall:
    head = draw(_TEXT)
    truncated = draw(st.integers(0, 50))
    return FlushCall(
        key=f"k{number}",
        tool_call_id=f"call_{number}",
        tool_name=draw(_NAMES),
        arguments=draw(_ARGS),
        is_error=draw(st.booleans()),
        raw_chars=len(head) + truncated + draw(st.integers(0, 400)),
        content_hash="h",
        head=head,
        truncated_chars=truncated,
        seq=number,
        ref=draw(st.one_of(st.none(), st.just(f"t{number}"))),
    )


@st.composite
def _requests(draw: st.DrawFn) -> FlushRequestPayload:
    batches = []
    for index in range(draw(st.integers(0, 5))):
        count = draw(st.integers(0, 4))
        batches.append(
            FlushBatch(
                turn_index=index,
                timestamp=index,
                disposition=draw(
                    st.sampled_from(["summarize", "skipped-trivial", "skipped-deduped"])
                ),
                calls=tuple(draw(_calls(10 * index + n)) for n in range(count)),
                deduped=(
                    DedupedCall(
                        key="d",
                        tool_call_id="d",
                        tool_name="read",
                        original_key="o",
                        raw_chars=3,
                        seq=1,
                    ),
                )
                if draw(st.booleans())
                else (),
            )
        )
    return FlushRequestPayload(
        request_id=draw(st.sampled_from(["s:1", "s/é:2"])),
        session_id=draw(st.sampled_from(["s", "s/é"])),
        seq=draw(st.integers(1, 10**6)),
        trigger="manual",
        model=draw(st.sampled_from(["offline", "m"])),
        batches=tuple(batches),
        time=draw(st.one_of(st.none(), st.just("2026-01-01T00:00:00Z"))),
    )


def _dump_keys(value: Any) -> Any:
    """The value with every dict as a list of its items: key order compared too."""
    if isinstance(value, dict):
        return [(key, _dump_keys(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [_dump_keys(item) for item in value]
    return value


@settings(max_examples=300, deadline=None)
@given(_requests())
def test_the_offline_document_is_the_typed_answers_dump(request: FlushRequestPayload) -> None:
    port = OfflineSummarizer()
    document = port.summarize_document(request)
    typed = port.summarize(request).model_dump(mode="json")
    assert _dump_keys(document) == _dump_keys(typed)
    assert orjson.dumps(document) == orjson.dumps(typed)


@settings(max_examples=200, deadline=None)
@given(_requests(), st.integers(200, 6000), st.integers(1, 10**6))
def test_the_offline_envelope_is_the_fitted_typed_answer(
    request: FlushRequestPayload, limit: int, seq: int
) -> None:
    port = OfflineSummarizer()
    typed = fitted_envelope(port.summarize(request), seq, limit)
    fast = offline_envelope(port, request, seq, limit)
    if fast is not None:
        assert typed is not None and encode(fast) == encode(typed)
    else:  # over the limit as it is: the typed path fits it
        assert typed is None or len(encode(wrap(port.summarize(request), seq))) > limit
    # What answer_pruning sends, the fast path or the typed one behind it, is the typed answer.
    envelope = wrap(request, seq)
    assert isinstance(envelope, PruningRequestEnvelope)
    sent = answer_pruning(port, envelope, limit).envelope
    expected = typed if typed is not None else error_answer(envelope, "oversized-answer").envelope
    assert encode(sent) == encode(expected)
