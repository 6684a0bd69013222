"""Metrics on `sessionfold generate` sessions, with pruning on, against the definition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sessionfold.projections.pruning import context_metrics as metrics
from sessionfold.projections.pruning import digest
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.pruning.context_metrics import naive_snapshot, snapshot
from sessionfold.streams.publishing.session_file import read_session_file
from sessionfold.streams.runtime.embedded import EmbeddedRuntime
from sessionfold.streams.tools.synthetic import write_fleet


@pytest.mark.parametrize("seed", [1, 2])
def test_pruned_fold_metrics_equal_naive_recompute_after_every_event(
    tmp_path: Path, seed: int
) -> None:
    """With flushes moving the frontier, the incremental metrics equal a full recompute."""
    written = write_fleet(tmp_path, sessions=1, turns=120, seed=seed)
    runtime = EmbeddedRuntime(DEFAULT_CONFIG)
    flushes = 0
    for record in read_session_file(written[0].path):
        runtime.publish(record)
        sid = record.session_id
        store = runtime.store
        branch: list[dict[str, Any]] = []
        occurrences: list[str] = []
        for row in digest.branch_rows(store, sid):
            branch.append(digest.message_of(_entry_of(runtime, row)) or {})
            if row["role"] == "toolResult":
                occurrences.append(row["occ"])
        summarized = {occ for occ in occurrences if metrics.is_summarized(store, sid, occ)}
        frontier = pruning.open_session(store, sid, DEFAULT_CONFIG).head["frontier"]
        flushes = len(runtime.log["flush-metrics"])
        assert snapshot(store, sid) == naive_snapshot(branch, frontier, summarized)
    assert flushes > 3  # the frontier really moved during the session


def _entry_of(runtime: EmbeddedRuntime, row: dict[str, Any]) -> dict[str, Any]:
    """The entry a digest row came from, found in the in-process log by its sequence number."""
    return runtime.log["session-events"][row["seq"] - 1].payload.entry
