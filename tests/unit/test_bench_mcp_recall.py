"""bench/mcp_recall.py on tiny settings, so it cannot rot: every recall of both columns
succeeds (the bench asserts it) and the side-by-side table comes out with its three rows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_bench_prints_its_table() -> None:
    args = ["--turns", "200", "--repeat", "1", "--calls", "2"]
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "mcp_recall.py"), *args],
        capture_output=True,
        timeout=240,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    lines = done.stdout.decode().splitlines()
    assert "no serve" in lines[1] and "serve up" in lines[1]
    rows = {line[:15].strip(): line[15:].split() for line in lines[3:]}
    assert set(rows) == {"start", "first recall", "later recalls"}
    assert all(len(cells) == 4 and all(c.isdigit() for c in cells) for cells in rows.values())
