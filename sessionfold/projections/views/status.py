"""pi-condense's footer status line (reference §10.2), from a session's state.

`prune: N pending` while batches wait for a flush, else `prune: ON` or, once a render pruned,
`prune: ON · B->A (-P%)` (tokens before and after, compact counts); then, only when the frontier
gap is above zero, ` · think N · gap N · chain P%`. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping


def compact_count(value: int) -> str:
    """pi-condense's formatCompactCount: `950`, `92.0k`, `1.2M`."""
    if value < 1000:
        return str(value)
    if value < 1_000_000:
        return f"{value / 1000:.1f}k"
    return f"{value / 1_000_000:.1f}M"


def footer(
    pending: int, metrics: Mapping[str, int], tokens: Mapping[str, int] | None = None
) -> str:
    """The footer text for a session: its state, then the metrics suffix when the gap is > 0."""
    if pending > 0:
        text = f"prune: {pending} pending"
    elif tokens is None or tokens["unpruned"] <= 0:
        text = "prune: ON"
    else:
        before, after = tokens["unpruned"], tokens["pruned"]
        saved = max(0, round((1 - after / before) * 100))
        text = f"prune: ON · {compact_count(before)}->{compact_count(after)} (-{saved}%)"
    gap = metrics.get("frontier_gap_tokens", 0)
    if gap > 0:
        think = compact_count(metrics.get("open_cycle_thinking_tokens", 0))
        share = metrics.get("largest_chain_share_pct", 0)
        text += f" · think {think} · gap {compact_count(gap)} · chain {share}%"
    return text
