"""Render invariants of the context view (reference §14) at every turn of replayed sessions.

On generated sessions (hypothesis draws the session and the pruning settings) the view is
checked after every assistant message. On the two real sessions the default run checks every
4th turn and the end (122 and 115 points, a few seconds each); the `slow` test checks every
turn (485 and 454 points). Each check (tests/context_oracles.py): no tool result without its
open call; rendering twice is byte-identical; a render that changes nothing returns its input
list itself; every output taken out resolves by its ref to the original in the log (and the
ref is visible on its stub or its chain's synthetic); protected outputs are never removed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from context_oracles import check_view, views_at_turns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionfold.projections.pruning.config import build_config
from sessionfold.streams.tools.synthetic import generate_session, write_session

REAL = ("before-compaction.jsonl", "large-session.jsonl")
SAMPLE_EVERY = 4

pruning_settings = st.fixed_dictionaries(
    {
        "minBatchChars": st.sampled_from([0, 1_000, 4_000]),
        "protectedTools": st.sampled_from([[], ["read"], ["edit", "write"]]),
        "recoveryGraceTurns": st.sampled_from([0, 3]),
        "batchingMode": st.sampled_from(["turn", "agent-message"]),
        "pruneOn": st.sampled_from(["agent-message", "on-demand"]),
        "autoBudgetThreshold": st.sampled_from([None, 0.2]),
        "contextWindow": st.just(200_000),
        "chainCompression": st.fixed_dictionaries(
            {
                "rollingWindow": st.integers(1, 3),
                "stripFinalAssistantThinking": st.booleans(),
            }
        ),
        "purgeErrors": st.fixed_dictionaries(
            {"cooldownTurns": st.integers(1, 2), "minArgChars": st.sampled_from([50, 500])}
        ),
    }
)


def _check_all(path: Path, config: Any, wanted: Any = lambda _turn: True) -> dict[str, int]:
    totals = {"points": 0, "removed": 0, "protected": 0, "chains": 0, "pruned": 0}
    for point in views_at_turns(path, config, wanted):
        counts = check_view(point)
        totals["points"] += 1
        totals["removed"] += counts["removed"]
        totals["protected"] += counts["protected"]
        totals["chains"] = max(totals["chains"], len(point.view.chains))
        totals["pruned"] += point.view.pruned
    return totals


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(seed=st.integers(0, 2**32 - 1), turns=st.integers(8, 70), chosen=pruning_settings)
def test_invariants_at_every_turn_of_generated_sessions(
    seed: int, turns: int, chosen: dict[str, Any]
) -> None:
    """Every render of a generated session, at every turn, keeps the five invariants."""
    config = build_config(chosen)
    with tempfile.TemporaryDirectory() as folder:
        written = write_session(Path(folder), generate_session(seed, turns))
        totals = _check_all(written.path, config)
    assert totals["points"] == turns + 1


def test_generated_sessions_exercise_every_phase(tmp_path: Path) -> None:
    """The generated shape really prunes: stubs, chains, protection and purge all happen."""
    written = write_session(tmp_path, generate_session(11, 80))
    config = build_config({"protectedTools": ["read"], "chainCompression": {"rollingWindow": 1}})
    totals = _check_all(written.path, config)
    assert totals["removed"] > 0 and totals["protected"] > 0 and totals["chains"] > 0


@pytest.mark.parametrize("name", REAL)
def test_invariants_on_real_sessions_sampled(shared_sessions: Path, name: str) -> None:
    """Every 4th turn and the end of each real session (>= 50 points per file), with `write`
    protected so that protection is exercised on real data."""
    config = build_config({"protectedTools": ["write"]})
    totals = _check_all(shared_sessions / name, config, lambda t: t % SAMPLE_EVERY == 0)
    assert totals["points"] >= 50
    assert totals["removed"] > 0 and totals["protected"] > 0 and totals["chains"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL)
def test_invariants_on_real_sessions_every_turn(shared_sessions: Path, name: str) -> None:
    """Every turn of each real session, default policy and with `write` protected."""
    for config in (build_config({}), build_config({"protectedTools": ["write"]})):
        totals = _check_all(shared_sessions / name, config)
        assert totals["points"] > 450
