"""What an idle `sessionfold serve` costs with many session files (issue #39 item 5).

    .venv/bin/python bench/idle_cpu.py [--files 2000] [--seconds 10] [--calls-per-s 20]
        [--baseline-tree DIR] [--serve-args "--no-notify"]

Writes `--files` small pi sessions (copies of one generated session under their own ids and
pi's file names) into a temp dir, starts `sessionfold serve` over it, waits until every
session is folded, then measures the fold process' CPU time over `--seconds` of idling, and
over as long again while a client asks for sessions no file holds (`--calls-per-s` context
calls a second, each for a new id). `--baseline-tree DIR` (e.g. `git archive REV sessionfold |
tar -x -C DIR`) runs that code's serve too; the rows are printed side by side, as the share of
one core.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import orjson
from cpu_use import cpu_seconds

from sessionfold.streams.tools.broker import free_port_pair
from sessionfold.streams.tools.synthetic import generate_session, write_session

CLI = [sys.executable, "-m", "sessionfold.streams.cli"]
TOKEN = "t" * 32


def write_files(folder: Path, count: int) -> None:
    """`count` copies of one small session, each its own id, in pi's naming."""
    scratch = folder.parent / "scratch"
    scratch.mkdir()
    source = write_session(scratch, generate_session(5, 4)).path
    lines = source.read_bytes().splitlines(keepends=True)
    header = orjson.loads(lines[0])
    rest = b"".join(lines[1:])
    folder.mkdir()
    for _ in range(count):
        session_id = str(uuid.uuid4())
        path = folder / f"2026-01-01T00-00-00-000Z_{session_id}.jsonl"
        path.write_bytes(orjson.dumps({**header, "id": session_id}) + b"\n" + rest)


def fold_pid(pid: int) -> int:
    """serve's fold process (its child spawned by multiprocessing)."""
    for _ in range(600):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
        time.sleep(0.05)
    raise SystemExit("serve has no fold process")


def measure(
    tree: Path | None, folder: Path, files: int, seconds: float, rate: float, extra: list[str]
) -> tuple[float, float, float]:
    """Seconds to fold every file, and the fold process' share of a core idle and while
    unknown sessions are asked for."""
    port = free_port_pair()
    env = {**os.environ, "SESSIONFOLD_API_TOKEN": TOKEN}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    started = time.monotonic()
    process = subprocess.Popen(
        [*CLI, "serve", str(folder), "--port", str(port), *extra],
        env=env,
        stderr=subprocess.DEVNULL,
        cwd=tree or None,
    )
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            while True:
                try:
                    if client.get("/health").json()["sessions"] >= files:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            folded_s = time.monotonic() - started
            fold = fold_pid(process.pid)
            time.sleep(3)  # past the back-off's ramp
            before = cpu_seconds(fold) or 0.0
            time.sleep(seconds)
            idle = ((cpu_seconds(fold) or 0.0) - before) / seconds
            before = cpu_seconds(fold) or 0.0
            end = time.monotonic() + seconds
            body = {"leaf": None, "shape": [], "wait_ms": 1000}
            while time.monotonic() < end:
                client.post(f"/sessions/{uuid.uuid4()}/context", json=body)
                time.sleep(1 / rate)
            asked = ((cpu_seconds(fold) or 0.0) - before) / seconds
    finally:
        process.terminate()
        process.wait(30)
    return folded_s, idle, asked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--calls-per-s", type=float, default=20.0)
    parser.add_argument("--baseline-tree", type=Path)
    parser.add_argument("--serve-args", default="", help="more options for this tree's serve")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "sessions"
        write_files(folder, args.files)
        print(f"load average {os.getloadavg()[0]:.2f}; {args.files} files", flush=True)
        runs = [("this tree " + args.serve_args).strip(), None]
        rows = [
            (
                runs[0],
                measure(
                    None,
                    folder,
                    args.files,
                    args.seconds,
                    args.calls_per_s,
                    args.serve_args.split(),
                ),
            )
        ]
        if args.baseline_tree is not None:
            rows.append(
                (
                    "base",
                    measure(
                        args.baseline_tree.resolve(),
                        folder,
                        args.files,
                        args.seconds,
                        args.calls_per_s,
                        [],
                    ),
                )
            )
    print(f"{'serve':<28} {'fold all (s)':>12} {'idle (core)':>12} {'unknown calls (core)':>21}")
    for name, (folded, idle, asked) in rows:
        print(f"{name:<28} {folded:>12.1f} {idle:>11.1%} {asked:>20.1%}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
