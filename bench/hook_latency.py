"""How long the agent waits for `sessionfold hook claude-code` after a compaction.

    PYTHONPATH=. .venv/bin/python bench/hook_latency.py [--turns 1000] [--repeat 15]

A synthetic Claude Code transcript (`sessionfold generate --format claude-code`, `--turns`
assistant messages) gets a compaction at its end (the boundary and summary lines Claude Code
writes), then the hook is run as the agent runs it (a new process, its input on stdin), each
run timed from start to exit:
- `no serve`: SESSIONFOLD_SERVE_URL names a closed port, so the hook folds the transcript;
- `serve up`: a `sessionfold serve` on the transcript's folder has folded it (its ledger holds
  the compaction), and the hook takes serve's answer.
Also `--help`'s time, for the start-up alone. Prints p50 and p90 of each, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _transcript(folder: Path, turns: int) -> tuple[Path, str]:
    """A generated transcript with a compaction appended; its path and session id."""
    subprocess.run(
        [*CLI, "generate", str(folder), "--format", "claude-code", "--turns", str(turns)],
        check=True,
        capture_output=True,
    )
    (path,) = folder.glob("*/*.jsonl")
    lines = [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    last = [line for line in lines if line.get("uuid") and line.get("sessionId")][-1]
    session = str(last["sessionId"])
    # A turn before the compaction, so its span is not empty (the generator may end on one).
    prompt = {
        "parentUuid": last["uuid"],
        "type": "user",
        "message": {"role": "user", "content": "go on"},
        "uuid": "bench-prompt",
        "sessionId": session,
        "timestamp": last.get("timestamp"),
    }
    boundary = {
        "parentUuid": None,
        "logicalParentUuid": "bench-prompt",
        "type": "system",
        "subtype": "compact_boundary",
        "content": "Conversation compacted",
        "compactMetadata": {"trigger": "manual", "preTokens": 100000},
        "uuid": "bench-boundary",
        "sessionId": session,
        "timestamp": last.get("timestamp"),
    }
    summary = {
        "parentUuid": "bench-boundary",
        "type": "user",
        "isCompactSummary": True,
        "message": {"role": "user", "content": "Summary:\nThe work went on."},
        "uuid": "bench-summary",
        "sessionId": session,
        "timestamp": last.get("timestamp"),
    }
    # Claude Code writes its command's output after the summary; the reader holds a file's
    # newest line group until a line follows it.
    stdout = "<local-command-stdout>Compacted</local-command-stdout>"
    after = {
        "parentUuid": "bench-summary",
        "type": "user",
        "message": {"role": "user", "content": stdout},
        "uuid": "bench-after",
        "sessionId": session,
        "timestamp": last.get("timestamp"),
    }
    with path.open("a") as out:
        out.write("".join(json.dumps(line) + "\n" for line in (prompt, boundary, summary, after)))
    return path, session


def _time(args: list[str], stdin: bytes, env: dict[str, str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        done = subprocess.run(args, input=stdin, env=env, capture_output=True, check=True)
        times.append((time.perf_counter() - start) * 1000)
        assert done.stderr == b"", done.stderr
    return times


def _row(name: str, times: list[float]) -> str:
    p90 = statistics.quantiles(times, n=10)[-1] if len(times) > 1 else times[0]
    return f"{name:<12}{statistics.median(times):>8.0f}{p90:>8.0f}{len(times):>6}"


def main() -> None:
    """Run the bench and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=15)
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hook-bench-"))
    try:
        path, session = _transcript(root / "projects", options.turns)
        data = {"session_id": session, "transcript_path": str(path), "cwd": str(root)}
        data.update(hook_event_name="SessionStart", source="compact")
        stdin = json.dumps(data).encode()
        hook = [*CLI, "hook", "claude-code"]
        env = {**os.environ, "SESSIONFOLD_SERVE_URL": f"http://127.0.0.1:{_free_port()}"}
        env.pop("SESSIONFOLD_API_TOKEN", None)
        print(f"transcript: {options.turns} assistant messages, {path.stat().st_size} bytes")
        print(f"{'':<12}{'p50 ms':>8}{'p90 ms':>8}{'runs':>6}")
        print(_row("--help", _time([*CLI, "--help"], b"", env, options.repeat)))
        out = subprocess.run(hook, input=stdin, env=env, capture_output=True, check=True).stdout
        assert b"additionalContext" in out, "the hook printed nothing"
        print(_row("no serve", _time(hook, stdin, env, options.repeat)))
        port = _free_port()
        serve = subprocess.Popen(
            [*CLI, "serve", str(root / "projects"), "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while True:  # until serve has folded the compaction
                try:
                    with urllib.request.urlopen(f"{url}/sessions/{session}", timeout=5) as r:
                        ledger = json.loads(r.read()).get("ledger") or {}
                    if any(s.get("entry") == "bench-summary" for s in ledger.get("spans", [])):
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, "serve did not fold the transcript"
                time.sleep(0.2)
            served = {**env, "SESSIONFOLD_SERVE_URL": url}
            print(_row("serve up", _time(hook, stdin, served, options.repeat)))
        finally:
            serve.terminate()
            serve.wait(timeout=30)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
