"""Entry facts against the way their parts were written before, kept here as oracles: the usage
tokens summed the parts through a generator (now a plain loop), `iso_to_ms` built the epoch as
an aware datetime at every call (now once), and a message's text blocks were joined from a
generator (now a loop)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.projections.jsjson import js_trim
from sessionfold.projections.pruning import entry_facts as ef


def _old_usage_tokens(message: dict[str, Any]) -> int | None:
    """_usage_tokens as it was."""
    usage = message.get("usage")
    if not isinstance(usage, dict) or message.get("stopReason") in ("error", "aborted"):
        return None
    total = usage.get("totalTokens")
    if not isinstance(total, int) or total <= 0:
        parts = (usage.get(k) for k in ("input", "output", "cacheRead", "cacheWrite"))
        total = sum(p for p in parts if isinstance(p, int))
    return total if total > 0 else None


_part = st.one_of(
    st.integers(-50, 10**7), st.booleans(), st.none(), st.floats(-5, 5), st.text(max_size=2)
)
_usage = st.dictionaries(
    st.sampled_from(["input", "output", "cacheRead", "cacheWrite", "totalTokens", "cost"]),
    _part,
    max_size=6,
)
_message = st.fixed_dictionaries(
    {},
    optional={
        "usage": st.one_of(_usage, st.none(), st.integers(), st.lists(st.integers(), max_size=2)),
        "stopReason": st.sampled_from(["stop", "toolUse", "error", "aborted", None]),
    },
)


@settings(max_examples=1000, deadline=None)
@given(_message)
def test_usage_tokens_as_before(message: dict[str, Any]) -> None:
    """Any usage (missing or zero totals, negative, boolean, float or text parts, no usage at
    all, an errored stop) gives the tokens the old code gave, of the same type."""
    new, old = ef._usage_tokens(message), _old_usage_tokens(message)
    assert (new, type(new)) == (old, type(old))


def _old_iso_to_ms(value: Any) -> int | None:
    """iso_to_ms as it was."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


_offsets = st.one_of(
    st.none(),
    st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m))),
)
_iso = st.builds(
    lambda moment, zone, spec, suffix, pad: (
        pad
        + moment.replace(tzinfo=zone).isoformat(timespec=spec)
        + (suffix if zone is None else "")
        + pad
    ),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    _offsets,
    st.sampled_from(["auto", "hours", "minutes", "seconds", "milliseconds", "microseconds"]),
    st.sampled_from(["", "Z", "z"]),
    st.sampled_from(["", " ", "\t"]),
)
_timestamps = st.one_of(
    _iso, st.text(max_size=30), st.none(), st.integers(), st.floats(), st.booleans()
)


@settings(max_examples=1500, deadline=None)
@given(_timestamps)
def test_iso_to_ms_as_before(value: Any) -> None:
    """ISO timestamps (any offset or none, Z or z, every precision, padded), other text and
    other types give the milliseconds (or None) the old code gave."""
    assert ef.iso_to_ms(value) == _old_iso_to_ms(value)


def _old_result_text(message: dict[str, Any]) -> str:
    """result_text as it was."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        block["text"]
        for block in content
        if isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    )


_block = st.one_of(
    st.builds(lambda text: {"type": "text", "text": text}, st.text(max_size=5)),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image", "thinking", "toolCall"])},
        optional={"text": st.one_of(st.text(max_size=5), st.none(), st.integers())},
    ),
    st.text(max_size=3),
    st.none(),
    st.lists(st.text(max_size=2), max_size=2),
)
_content_message = st.fixed_dictionaries(
    {},
    optional={
        "content": st.one_of(st.lists(_block, max_size=5), st.text(max_size=5), st.integers()),
        "role": st.sampled_from(["assistant", "toolResult"]),
    },
)


@settings(max_examples=1000, deadline=None)
@given(_content_message)
def test_texts_as_before(message: dict[str, Any]) -> None:
    """A message's joined text (string content, blocks of every kind, text that is not a str,
    blocks that are not objects, no content) and an assistant's trimmed text are as before."""
    assert ef.result_text(message) == _old_result_text(message)
    assert ef.assistant_text(message) == js_trim(_old_result_text(message))
