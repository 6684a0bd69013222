"""One entry's fold is a pipeline, not a web: traced call by call (bench/call_trace.py), each
pruning module is entered afresh at most twice per entry, and each pipeline step once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# bench/ holds scripts, not a package: its helpers are imported the way the scripts import them.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from call_trace import PRUNING, TARGET, mean, trace

from sessionfold.streams.tools.synthetic import generate_session, write_session


@pytest.mark.parametrize("seed", [1, 7])
def test_each_pruning_module_is_entered_at_most_twice_per_entry(tmp_path: Path, seed: int) -> None:
    path = write_session(tmp_path, generate_session(seed, 80)).path
    traced = trace(path)
    assert traced["entries"] > 80
    entered = {
        name: mean(counts) for name, counts in traced["modules"].items() if name.startswith(PRUNING)
    }
    assert entered, "no pruning module traced"
    over = {name: round(figure, 2) for name, figure in entered.items() if figure > TARGET}
    assert not over, f"entered more than {TARGET:g} times per entry: {over}"
    steps = {name: figure for name, figure in entered.items() if "/steps/" in name}
    # guard runs twice (the sequence guard, then the duplicate id); every other step once.
    assert steps and all(
        figure <= (2 if name.endswith("guard.py") else 1) for name, figure in steps.items()
    )
