"""The budget and delta gates of a turn end (reference §4.1-4.3): pure, null-safe.

The 300k window cap is applied differently on purpose: the threshold is a level, so the level
is capped; the delta is a growth rate, so its denominator is capped.
"""

from __future__ import annotations

from sessionfold.projections.pruning.config import MAX_BUDGET_WINDOW


def should_budget_flush(tokens: int | None, window: int | None, threshold: float | None) -> bool:
    """True iff tokens >= min(300k, threshold x window); false on any missing reading."""
    if threshold is None or not 0 < threshold <= 1:
        return False
    if tokens is None or window is None or window <= 0:
        return False
    return tokens >= min(MAX_BUDGET_WINDOW, threshold * window)


def usage_fraction(tokens: int | None, window: int | None) -> float | None:
    """tokens / min(window, 300k), not clamped; None on a missing reading."""
    if tokens is None or window is None or window <= 0:
        return None
    return tokens / min(window, MAX_BUDGET_WINDOW)


def should_delta_flush(previous: float | None, current: float | None, delta: float | None) -> bool:
    """True iff the usage fraction grew by at least `delta` since the previous gated turn."""
    if delta is None or not 0 < delta <= 1:
        return False
    if previous is None or current is None:
        return False
    return current - previous >= delta
