"""Another commit's code beside this tree's, for benches that measure both in one run: extracted
with `git archive`, and run in a subprocess whose imports come from it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def extracted(rev: str, into: str) -> str | None:
    """`git archive rev` of this repository unpacked under `into`; None if the archive fails
    (a checkout without that commit)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True)
    if archive.returncode != 0:
        return None
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    return into


def run_in(root: str, args: list[str]) -> tuple[str, str | None]:
    """`python args...` with sessionfold imported from `root`: (its stdout, None), or ("", the
    last line of its stderr) when it fails."""
    done = subprocess.run(
        [sys.executable, *args],
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return "", lines[-1] if lines else f"exit {done.returncode}"
    return done.stdout, None
