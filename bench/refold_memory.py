"""The fold process' memory after a (re)start over many old sessions, with and without eviction
(issue #39 item 8), and what the first call for an old session then waits.

    .venv/bin/python bench/refold_memory.py [--sessions 200] [--turns 200] [--seed 3]

Writes a generated fleet (`sessionfold generate`'s) into a temp dir, its files last written a
day ago, and copies it: each mode folds its own copy as a first start. For each mode it starts
`sessionfold serve` (`--evict`, then `--no-evict`), waits for the start's fold (its log line
`live: the files found are folded`), and prints: the seconds of that fold, the fold process'
RSS then and its peak (VmRSS, VmHWM), the first context call for an old session (the first
file's, at its last entry: evicted, it is folded again before the answer) and a second call,
in ms, and the RSS after them. The rows come side by side.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
from idle_cpu import fold_pid  # bench/ is on the path when a bench runs

from sessionfold.streams.tools.broker import free_port_pair
from sessionfold.streams.tools.synthetic import write_fleet

CLI = [sys.executable, "-m", "sessionfold.streams.cli"]
TOKEN = "r" * 32
#: How old the files are made, seconds (past serve's default --live-within of 600).
AGE_S = 86_400
FOLDED = b"live: the files found are folded"


def memory_mib(pid: int) -> tuple[float, float]:
    """A process' resident memory now and at its peak (VmRSS, VmHWM), MiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024
    return found["VmRSS"], found["VmHWM"]


def run(folder: Path, evict: bool, asked: tuple[str, str], work: Path) -> dict[str, float]:
    """One serve over `folder`: its start's figures and the first calls' (see the docstring)."""
    port = free_port_pair()
    env = {**os.environ, "SESSIONFOLD_API_TOKEN": TOKEN, "SESSIONFOLD_LEDGER_LOG": "off"}
    log_path = work / f"serve-{'evict' if evict else 'keep'}.log"
    mode = "--evict" if evict else "--no-evict"
    started = time.monotonic()
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            [*CLI, "serve", str(folder), "--port", str(port), mode],
            env=env,
            stderr=out,
            stdout=subprocess.DEVNULL,
        )
    try:
        fold = fold_pid(process.pid)
        while FOLDED not in log_path.read_bytes():
            if process.poll() is not None:
                raise SystemExit(f"serve exited: see {log_path}")
            time.sleep(0.1)
        figures = {"start_s": time.monotonic() - started}
        figures["rss_mib"], figures["peak_mib"] = memory_mib(fold)
        session_id, leaf = asked
        body = {"leaf": leaf, "shape": [], "wait_ms": 60_000}
        headers = {"Authorization": f"Bearer {TOKEN}"}
        url = f"http://127.0.0.1:{port}/sessions/{session_id}/context"
        with httpx.Client(headers=headers, timeout=90) as client:
            for name in ("first_ms", "second_ms"):
                sent = time.monotonic()
                answer = client.post(url, json=body).json()
                figures[name] = (time.monotonic() - sent) * 1000
                if answer.get("stale") or answer.get("reason") == "unknown-session":
                    raise SystemExit(f"the old session was not answered: {answer.get('reason')}")
        figures["rss_after_mib"], _ = memory_mib(fold)
        return figures
    finally:
        process.terminate()
        process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="refold-") as scratch:
        work = Path(scratch)
        fleet = work / "evict"
        written = write_fleet(fleet, args.sessions, args.turns, args.seed)
        stamp = time.time() - AGE_S
        for session in written:
            os.utime(session.path, (stamp, stamp))
        shutil.copytree(fleet, work / "keep")  # copy2: the mtimes go along
        first = sorted(session.path for session in written)[0]
        lines = first.read_bytes().splitlines()
        asked = (str(orjson.loads(lines[0])["id"]), str(orjson.loads(lines[-1])["id"]))
        size = sum(session.path.stat().st_size for session in written) / 2**20
        print(f"{args.sessions} sessions, {size:.0f} MiB of files, a day old", file=sys.stderr)
        rows = {
            "evict": run(fleet, True, asked, work),
            "keep": run(work / "keep", False, asked, work),
        }
    columns = ("start_s", "rss_mib", "peak_mib", "first_ms", "second_ms", "rss_after_mib")
    print(f"{'mode':<6}" + "".join(f"{name:>15}" for name in columns))
    for mode, figures in rows.items():
        print(f"{mode:<6}" + "".join(f"{figures[name]:>15.1f}" for name in columns))


if __name__ == "__main__":
    main()
