"""Entry facts against the way their parts were written before, kept here as oracles: the usage
tokens summed the parts through a generator (now a plain loop)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

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
