"""What serve's gateway adds to a model call: the same calls through it and straight upstream.

    .venv/bin/python bench/gateway_overhead.py [--levels 1,20] [--calls 20] [--rounds 2]
        [--body-kb 800] [--turns 200]

A minimal Anthropic upstream (its own process: reads the request, streams a short Messages
answer at once) stands in for the provider, so what is timed is the relay. A real `sessionfold
serve` tails a folder of Claude Code transcripts (one generated session, copied under N session
ids) with its gateway in front of that upstream. Each call posts a `/v1/messages` body of about
`--body-kb` KB (the transcript's messages, Anthropic's own form: ~800 KB is a 200k-token
request), streamed back, and is timed to its first body byte (`ttfb`) and to its end (`total`):

- `direct`: straight to the upstream;
- `pass`: through the gateway, for a session serve does not know (the plan is asked for and
  the body passes as it came);
- `rewrite`: through the gateway, for a session serve folds: the plan is fetched, the body
  parsed, its older results replaced by the fold's stubs and encoded again.

At each level N, N sessions call at once, each `--calls` calls one after the other, the three
modes in turn, `--rounds` times (a round's first call per session is a warm-up, not counted).
Printed: p50/p99 of each mode, and of `pass` and `rewrite` the milliseconds added to `direct`
and the ratio. The issue's goal (#41): p99 added under 5 ms for a 200k-token request. Figures
from one run side by side only: the machine's load average is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import shutil
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import httpx
import orjson

# tests/ holds the serve process helper (not a package: put on the path).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from serve_process import serving

from sessionfold.streams.tools.synthetic_claude import (
    generate_claude_session,
    write_claude_session,
)

#: The generated session's seed: its plan rewrites results at its end.
SEED = 1
TOKEN = "gateway-bench-token-0001"
MODES = ("direct", "pass", "rewrite")
#: The goal of issue #41: p99 added by the gateway, ms.
GOAL_MS = 5.0
#: A short streamed answer, as the Messages API streams one (the usage events the gateway reads).
_ANSWER = [
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":'
    b'"message","role":"assistant","model":"m","content":[],"stop_reason":null,"usage":'
    b'{"input_tokens":10,"cache_read_input_tokens":190000,"cache_creation_input_tokens":0,'
    b'"output_tokens":1}}}\n\n',
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n',
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"ok"}}\n\n',
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n',
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    b'"usage":{"output_tokens":2}}\n\n',
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
]


def _upstream(port: int) -> None:
    """The upstream's process: every POST read whole, then the answer streamed."""
    from aiohttp import web

    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in _ANSWER:
            await response.write(chunk)
        await response.write_eof()
        return response

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/messages", answer)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def transcripts(out: Path, copies: int, turns: int) -> tuple[list[str], list[dict[str, object]]]:
    """One generated Claude Code session copied under `copies` ids into `out`; its ids and the
    messages Claude Code sends at its end, in Anthropic's form (the user and assistant lines'
    `message` after the last compaction)."""
    [written] = [
        w
        for w in write_claude_session(out / "gen", generate_claude_session(SEED, turns))
        if w.path.parent.name != "subagents"
    ]
    text = written.path.read_text()
    original = written.path.stem
    messages: list[dict[str, object]] = []
    for line in text.splitlines():
        record = orjson.loads(line)
        if record.get("subtype") == "compact_boundary":
            messages = []  # the agent sends what follows its last compaction
        elif record.get("type") in ("user", "assistant") and not record.get("isSidechain"):
            messages.append(record["message"])
    ids = []
    project = out / "projects" / "-bench"
    project.mkdir(parents=True)
    for _ in range(copies):
        session = str(uuid.uuid4())
        (project / f"{session}.jsonl").write_text(text.replace(original, session))
        ids.append(session)
    shutil.rmtree(out / "gen")
    return ids, messages


def request_body(messages: list[dict[str, object]], kb: int) -> bytes:
    """A Messages request of `messages`, its last user message grown to make about `kb` KB
    (a pasted file: the body's size is what the gateway's parse and encode cost)."""
    body = {"model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": True}
    short = kb * 1024 - len(orjson.dumps({**body, "messages": messages}))
    pasted = {"role": "user", "content": [{"type": "text", "text": "x" * max(0, short - 60)}]}
    return orjson.dumps({**body, "messages": [*messages, pasted]})


async def _call(
    client: httpx.AsyncClient, url: str, body: bytes, session: str
) -> tuple[float, float]:
    """One streamed call: (ms to the first body byte, ms to its end)."""
    headers = {
        "content-type": "application/json",
        "x-api-key": "sk-bench",
        "anthropic-version": "2023-06-01",
        "x-claude-code-session-id": session,
        "x-sessionfold-token": TOKEN,
    }
    start = time.perf_counter()
    first = None
    async with client.stream("POST", url, content=body, headers=headers) as answer:
        async for _chunk in answer.aiter_raw():
            if first is None:
                first = time.perf_counter()
        assert answer.status_code == 200, answer.status_code
    end = time.perf_counter()
    return ((first or end) - start) * 1e3, (end - start) * 1e3


async def _level(
    urls: dict[str, str], body: bytes, known: list[str], calls: int, rounds: int
) -> dict[str, list[tuple[float, float]]]:
    """Every mode's samples at one level (N = len(known) sessions at once)."""
    samples: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=len(known) * 2)
    async with httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as client:

        async def session(mode: str, session_id: str) -> None:
            url = urls["direct" if mode == "direct" else "serve"] + "/v1/messages"
            for n in range(calls + 1):
                got = await _call(client, url, body, session_id)
                if n:  # the first opens the connection and warms the session's plan
                    samples[mode].append(got)

        for _ in range(rounds):
            for mode in MODES:
                ids = known if mode == "rewrite" else [str(uuid.uuid4()) for _ in known]
                await asyncio.gather(*(session(mode, s) for s in ids))
    return samples


def quantile(values: Sequence[float], q: float) -> float:
    """The `q` quantile (nearest rank) of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def _wait_folded(url: str, sessions: list[str], wanted: set[str], timeout_s: float = 300) -> int:
    """Until serve's plan of every session rewrites results of the body and its epoch holds
    for a second (the file folded to its end); the results the plan rewrites."""
    deadline = time.monotonic() + timeout_s
    headers = {"authorization": f"Bearer {TOKEN}"}
    rewritten = 0
    for session in sessions:
        last = None
        while True:
            plan = httpx.get(f"{url}/sessions/{session}/plan", headers=headers, timeout=30).json()
            rewritten = len(wanted & set(plan.get("results", ())))
            epoch = (plan.get("epoch"), rewritten)
            if plan.get("known") and rewritten and epoch == last:
                break
            assert time.monotonic() < deadline, f"serve folded no plan for {session}"
            last = epoch
            time.sleep(1.0)
    return rewritten


def _freed(url: str) -> tuple[float, float]:
    """The gateway's request bytes, asked and sent (its metrics)."""
    text = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {TOKEN}"}).text
    found = dict(
        re.findall(
            r'sessionfold_gateway_request_chars_total\{api="anthropic",side="(\w+)"\} (\S+)', text
        )
    )
    return float(found.get("asked", 0)), float(found.get("sent", 0))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,20", help="sessions calling at once")
    parser.add_argument("--calls", type=int, default=20, help="timed calls per session and mode")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--body-kb", type=int, default=800)
    parser.add_argument("--turns", type=int, default=190, help="the generated session's turns")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",") if x]
    port = _free_port()
    upstream = multiprocessing.get_context("spawn").Process(
        target=_upstream, args=(port,), daemon=True
    )
    upstream.start()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            ids, messages = transcripts(Path(scratch), max(levels), args.turns)
            body = request_body(messages, args.body_kb)
            with serving(
                Path(scratch) / "projects",
                TOKEN,
                args=["--anthropic-upstream", f"http://127.0.0.1:{port}"],
            ) as serve:
                results = {
                    b["tool_use_id"]
                    for m in messages
                    if isinstance(m.get("content"), list)
                    for b in m["content"]
                    if isinstance(b, dict) and b.get("type") == "tool_result"
                }
                planned = _wait_folded(serve.url, ids, results)
                urls = {"direct": f"http://127.0.0.1:{port}", "serve": serve.url}
                print(
                    f"body {len(body) / 1024:.0f} KB ({len(body) // 4:,} tokens at 4 chars; "
                    f"{planned} of its {len(results)} results rewritten), "
                    f"{os.cpu_count()} CPUs, load average "
                    + " ".join(f"{x:.2f}" for x in os.getloadavg())
                )
                rows = []
                for n in levels:
                    before = _freed(serve.url)
                    got = asyncio.run(_level(urls, body, ids[:n], args.calls, args.rounds))
                    after = _freed(serve.url)
                    rows.append((n, got, after[0] - before[0], after[1] - before[1]))
                serve.stop()
        report(rows)
    finally:
        upstream.terminate()
        upstream.join(10)
    return 0


def report(rows: list[tuple[int, dict[str, list[tuple[float, float]]], float, float]]) -> None:
    """The table: p50/p99 per mode, and what the gateway adds."""
    print(
        f"\n{'N':>3} {'mode':<8} {'calls':>5} {'ttfb p50':>9} {'p99':>7} {'total p50':>10} "
        f"{'p99':>7} {'added p50':>10} {'p99':>7} {'ratio p99':>9}"
    )
    verdicts = []
    for n, got, _asked, _sent in rows:
        base = [t for _f, t in got["direct"]]
        for mode in MODES:
            first = [f for f, _t in got[mode]]
            total = [t for _f, t in got[mode]]
            cells = (
                f"{n:>3} {mode:<8} {len(total):>5} {quantile(first, 0.5):>9.2f} "
                f"{quantile(first, 0.99):>7.2f} {quantile(total, 0.5):>10.2f} "
                f"{quantile(total, 0.99):>7.2f}"
            )
            if mode != "direct":
                added50 = quantile(total, 0.5) - quantile(base, 0.5)
                added99 = quantile(total, 0.99) - quantile(base, 0.99)
                ratio = quantile(total, 0.99) / quantile(base, 0.99)
                cells += f" {added50:>10.2f} {added99:>7.2f} {ratio:>9.2f}"
                verdicts.append((n, mode, added99))
            print(cells)
    for n, _got, asked, sent in rows:
        if asked:
            print(
                f"N={n}: the gateway sent {sent / asked:.3f} of the bytes asked (pass and rewrite)"
            )
    print(f"\ngoal: p99 added under {GOAL_MS:g} ms")
    for n, mode, added in verdicts:
        print(f"  N={n} {mode}: {added:+.2f} ms: {'holds' if added < GOAL_MS else 'MISSED'}")
    print("(ms; added: the mode's quantile minus direct's; ratio: p99 over direct's p99)")


if __name__ == "__main__":
    sys.exit(main())
