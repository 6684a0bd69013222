"""How long an agent waits on `sessionfold mcp`: its start, its first recall, the later ones.

    PYTHONPATH=. .venv/bin/python bench/mcp_recall.py [--turns 400] [--repeat 5] [--calls 10]

A synthetic Claude Code transcript (`sessionfold generate --format claude-code`, `--turns`
assistant messages) is recalled from, by refs its fold summarized (`sessionfold context`'s
stubs), through the MCP SDK's client over stdio, as the agent talks to the server:
- `start`: from spawning `sessionfold mcp claude-code --session-file FILE` to its answer to
  `initialize` (what Codex's `exec` waits about a second for);
- `first recall`: the first `context_tree_query` call of a fresh server;
- `later recalls`: the next `--calls` calls of that server, each a different ref.
Each column is one way of answering: `no serve` (SESSIONFOLD_SERVE_URL names a closed port,
so the server folds the transcript itself and keeps the fold while the file is unchanged) and
`serve up` (a `sessionfold serve` on the transcript's folder has folded it and answers).
Prints p50 and p90 of each, in milliseconds, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CLI = [sys.executable, "-m", "sessionfold.streams.cli"]
STUB = re.compile(r"ref `(t\d+)`")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _transcript(folder: Path, turns: int) -> tuple[Path, str, list[str]]:
    """A generated Claude Code transcript: its path, session id and the refs its fold stubs."""
    subprocess.run(
        [*CLI, "generate", str(folder), "--format", "claude-code", "--turns", str(turns)],
        check=True,
        capture_output=True,
    )
    (path,) = folder.glob("*/*.jsonl")
    done = subprocess.run(
        [*CLI, "context", str(path), "--format", "json"], check=True, capture_output=True
    )
    refs = sorted(set(STUB.findall(done.stdout.decode())), key=lambda r: int(r[1:]))
    return path, path.stem, refs


async def _one_server(
    path: Path, env: dict[str, str], refs: list[str], calls: int
) -> tuple[float, float, list[float]]:
    """One server's start, first recall and later recalls, in milliseconds."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    args = [*CLI[1:], "mcp", "claude-code", "--session-file", str(path)]
    server = StdioServerParameters(command=CLI[0], args=args, env=env)
    with open(os.devnull, "w") as errlog:
        started = time.perf_counter()
        async with (
            stdio_client(server, errlog=errlog) as (read, write),
            ClientSession(read, write) as client,
        ):
            await client.initialize()
            start = (time.perf_counter() - started) * 1000
            times = []
            for ref in refs[: calls + 1]:
                began = time.perf_counter()
                answer = await client.call_tool("context_tree_query", {"toolCallIds": [ref]})
                times.append((time.perf_counter() - began) * 1000)
                assert not answer.is_error, "the recall failed"
    return start, times[0], times[1:]


def _cell(times: list[float]) -> str:
    p90 = statistics.quantiles(times, n=10)[-1] if len(times) > 1 else times[0]
    return f"{statistics.median(times):>8.0f}{p90:>8.0f}"


def _measure(
    path: Path, env: dict[str, str], refs: list[str], repeat: int, calls: int
) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {"start": [], "first recall": [], "later recalls": []}
    for _ in range(repeat):
        start, first, later = asyncio.run(_one_server(path, env, refs, calls))
        found["start"].append(start)
        found["first recall"].append(first)
        found["later recalls"].extend(later)
    return found


def _wait_for_serve(url: str, session: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/sessions/{session}", timeout=5) as answer:
                if json.loads(answer.read()):
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, "serve did not fold the transcript"
        time.sleep(0.2)


def main() -> None:
    """Run the bench and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10)
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mcp-bench-"))
    try:
        path, session, refs = _transcript(root / "projects", options.turns)
        assert len(refs) > options.calls, f"the fold stubbed {len(refs)} refs only"
        env = {**os.environ, "SESSIONFOLD_SERVE_URL": f"http://127.0.0.1:{_free_port()}"}
        env.pop("SESSIONFOLD_API_TOKEN", None)
        print(f"transcript: {options.turns} assistant messages, {path.stat().st_size} bytes")
        alone = _measure(path, env, refs, options.repeat, options.calls)
        port = _free_port()
        serve = subprocess.Popen(
            [*CLI, "serve", str(root / "projects"), "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_for_serve(url, session)
            served = _measure(
                path, {**env, "SESSIONFOLD_SERVE_URL": url}, refs, options.repeat, options.calls
            )
        finally:
            serve.terminate()
            serve.wait(timeout=30)
        print(f"{'':<15}{'no serve':>16}{'serve up':>16}")
        print(f"{'':<15}{'p50 ms':>8}{'p90 ms':>8}{'p50 ms':>8}{'p90 ms':>8}")
        for name in alone:
            print(f"{name:<15}{_cell(alone[name])}{_cell(served[name])}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
