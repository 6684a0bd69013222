"""Budget and delta gates with the 300k window cap (reference §4.2-4.3, budget.test.ts)."""

from __future__ import annotations

import pytest

from sessionfold.projections.pruning.triggers import (
    should_budget_flush,
    should_delta_flush,
    usage_fraction,
)


@pytest.mark.parametrize("threshold", [None, 0, -0.1, 1.01])
def test_threshold_out_of_range_never_fires(threshold: float | None) -> None:
    """A null, non-positive or above-one threshold never fires."""
    assert not should_budget_flush(10**6, 10**6, threshold)


@pytest.mark.parametrize(("tokens", "window"), [(None, 1000), (500, None), (500, 0), (500, -1)])
def test_missing_usage_never_fires(tokens: int | None, window: int | None) -> None:
    """A missing reading, null tokens or a non-positive window never fires."""
    assert not should_budget_flush(tokens, window, 0.5)


def test_threshold_boundary_and_full_threshold() -> None:
    """The budget fires at the threshold and not below it; 1.0 is valid."""
    assert should_budget_flush(3200, 8000, 0.4)
    assert not should_budget_flush(3199, 8000, 0.4)
    assert should_budget_flush(8000, 8000, 1.0)


def test_window_cap_binds_the_level_on_huge_windows() -> None:
    """1M @ 0.4 fires at 300,000 not 299,999; a low threshold still governs."""
    assert should_budget_flush(300_000, 1_000_000, 0.4)
    assert not should_budget_flush(299_999, 1_000_000, 0.4)
    assert should_budget_flush(100_000, 1_000_000, 0.1)
    assert not should_budget_flush(99_999, 1_000_000, 0.1)


def test_cap_never_binds_at_small_windows() -> None:
    """256k @ 0.9 = 230,400."""
    assert should_budget_flush(230_400, 256_000, 0.9)
    assert not should_budget_flush(230_399, 256_000, 0.9)


def test_usage_fraction_caps_the_denominator_unclamped() -> None:
    """The fraction divides by min(window, 300k) and is not clamped."""
    assert usage_fraction(600_000, 1_000_000) == 2.0
    assert usage_fraction(100_000, 200_000) == 0.5
    assert usage_fraction(None, 200_000) is None
    assert usage_fraction(1, 0) is None


def test_delta_guards() -> None:
    """Delta needs a delta in (0, 1] and both readings."""
    assert not should_delta_flush(0.1, 0.9, None)
    assert not should_delta_flush(0.1, 0.9, 0)
    assert not should_delta_flush(0.1, 0.9, 1.5)
    assert not should_delta_flush(None, 0.9, 0.1)
    assert not should_delta_flush(0.1, None, 0.1)


def test_delta_jumps() -> None:
    """1M @ 0.1 needs +30k tokens; 200k @ 0.3 needs +60k; it keeps firing above the cap."""
    assert should_delta_flush(usage_fraction(0, 10**6), usage_fraction(30_000, 10**6), 0.1)
    assert not should_delta_flush(usage_fraction(0, 10**6), usage_fraction(29_999, 10**6), 0.1)
    assert should_delta_flush(usage_fraction(0, 200_000), usage_fraction(60_000, 200_000), 0.3)
    assert not should_delta_flush(usage_fraction(0, 200_000), usage_fraction(59_999, 200_000), 0.3)
    assert should_delta_flush(usage_fraction(600_000, 10**6), usage_fraction(630_000, 10**6), 0.1)
