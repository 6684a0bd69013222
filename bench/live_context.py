"""The live context route of `sessionfold serve` under concurrent sessions, beside the fold.

    .venv/bin/python bench/live_context.py [--levels 1,50,200] [--messages 1000] [--repeat 1]

For each level N, a real `sessionfold serve` process tails a fresh temp dir while N sessions of
about `--messages` messages (synthetic, copies of `--distinct` generated ones under their own
session ids) grow there concurrently, line by line, as pi writes them. At each user message
(`--calls every`: at every message, where pi calls its model next) the session's client posts
pi's array (the unpruned context at that leaf, encoded before the timed part) to
`POST /sessions/{id}/context` and times the answer; then it posts the same call once more:

- `live`: the first call, made right after the line is written: serve's read (every
  `--poll-ms`), the fold of the line, the render and the transport;
- `caught-up`: the same call again, the leaf already folded (the target is p99 under 50 ms
  here): serve keeps a session's render until it folds more, so this is the parse of pi's
  array, the check of it and the transport; `live - caught-up` is the wait for the fold and
  the render (the `render` column gives the render alone, embedded).

Per level: p50/p99 of both over every call of every repeat (and the median over repeats of each
run's p99), bytes sent and received per call, serve's CPU use, and the fold's own time for the
same leaf events, folded embedded (`LiveFolds` in this process, before the timed part) and the
ratio of a live call to it, and the embedded render (view and encoding) at the same leaves.
Then the cost against the session's length: the calls bucketed by pi's array size in
messages, with the array's bytes, the render's, the live and the caught-up calls' times, and
the time per array KB (a flat time per KB means no growth beyond the array's own size).
`--profile` adds cProfile's top functions of serve's render (`LiveFolds.view`) at the
session's end, in this process.

Every answer must be neither stale nor a mismatch (pi's array is the file's), nor an HTTP
error; the `bad` column counts the others (their figures are not the render's).
`--baseline-tree DIR` (a checkout, e.g. `git archive REV sessionfold | tar -x -C DIR`) runs
that code's serve at each level too, alternating, in rows marked `base`. The machine's load
average is printed: read figures from one run side by side, not across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import cProfile
import itertools
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from cpu_use import cpu_seconds
from fold_profile import top

from sessionfold.streams.runtime.live import LiveFolds
from sessionfold.streams.tools.broker import free_port_pair
from sessionfold.streams.tools.synthetic import (
    Entry,
    generate_session,
    session_file_name,
    session_seeds,
    write_session,
)

CLI = [sys.executable, "-m", "sessionfold.streams.cli"]
#: Messages per assistant message in a synthetic session (its tool results and user prompts).
MESSAGES_PER_TURN = 2.1
#: Array sizes (messages) bounding the cost-by-length buckets.
LENGTH_EDGES = (200, 400, 600, 800)


@dataclass(frozen=True, slots=True)
class Call:
    """One context call a session makes: after line `line`, for `leaf`, with pi's first
    `length` messages."""

    line: int
    leaf: str
    length: int


@dataclass
class Template:
    """One generated session and what its calls send, computed before any timing."""

    entries: list[Entry]
    lines: list[bytes]  # the file's lines after the header (the header is rewritten per copy)
    parts: list[bytes]  # pi's final array, message by message, encoded
    calls: list[Call]
    fold_us: list[float]  # the embedded fold's time of each leaf event, per call
    render_us: list[float]  # the embedded render (view and its encoding) at each leaf, per call


@dataclass
class Sample:
    """One timed call."""

    length: int  # messages in pi's array
    sent: int  # request body bytes
    received: int  # answer body bytes
    live_ms: float
    caught_ms: float
    changed: bool
    first: bool  # the session's first call: it also waits for serve to find the file
    bad: str | None  # "stale", "mismatch", an HTTP status, or None


@dataclass
class Run:
    """One level's run: its samples, wall time and serve's CPU."""

    sessions: int
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    serve_cpu_s: float | None = None


def template(seed: int, turns: int, every: bool, scratch: Path) -> Template:
    """Generate a session, fold it embedded line by line (timing each line's fold) and note
    each call's leaf and pi's array length there."""
    entries = generate_session(seed, turns)
    path = write_session(scratch, entries).path
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"")
    live = LiveFolds([path])
    live.discover()
    session_id = str(entries[0]["id"])
    points = {n for n, e in enumerate(entries) if _is_call(e, every)}
    fold_s: list[float] = []
    render_us: list[float] = []
    for number, line in enumerate(lines):
        with path.open("ab") as handle:
            handle.write(line)
        started = time.perf_counter()
        live.poll()
        fold_s.append(time.perf_counter() - started)
        if number in points:
            started = time.perf_counter()
            orjson.dumps(live.view(session_id).messages)
            render_us.append((time.perf_counter() - started) * 1e6)
    session = live.sessions[session_id]
    view = live.view(session_id)
    # pi's array at a leaf is the final array's prefix up to the leaf's entry (the synthetic
    # sessions are one branch, never compacted); serve checks it: a wrong one answers mismatch.
    seqs = [view.origin[id(message)] for message in view.unpruned]
    seq_of = {str(item.entry.get("id")): item.seq for item in session.entries}
    calls = []
    fold_us = []
    for number, entry in enumerate(entries):
        if number not in points:
            continue
        length = bisect.bisect_right(seqs, seq_of[str(entry["id"])])
        calls.append(Call(number, str(entry["id"]), length))
        fold_us.append(fold_s[number] * 1e6)
    parts = [orjson.dumps(message) for message in view.unpruned]
    return Template(entries, lines[1:], parts, calls, fold_us, render_us)


def _is_call(entry: Entry, every: bool) -> bool:
    """Whether pi calls its model after `entry` (a user message; any message with `every`)."""
    message = entry.get("message")
    if entry.get("type") != "message" or not isinstance(message, dict):
        return False
    return every or message.get("role") == "user"


def body(tmpl: Template, call: Call) -> bytes:
    """The context call's request body (built outside the timed part)."""
    messages = b",".join(tmpl.parts[: call.length])
    return b'{"leaf":' + orjson.dumps(call.leaf) + b',"messages":[' + messages + b"]}"


@contextmanager
def serving(watched: Path, poll_ms: int, tree: Path | None) -> Iterator[tuple[str, int]]:
    """A `sessionfold serve` process over `watched` (its code from `tree` when given, a
    checkout's root): its URL and pid."""
    port = free_port_pair()
    env = {**os.environ, "SESSIONFOLD_LEDGER_LOG": "off"}
    env.pop("SESSIONFOLD_API_TOKEN", None)
    if tree is not None:
        env["PYTHONPATH"] = str(tree.resolve())  # ahead of the installed tree (the cwd is not it)
    command = [*CLI, "serve", str(watched), "--port", str(port), "--poll-ms", str(poll_ms)]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, cwd=watched)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    err = process.stderr.read().decode() if process.stderr else ""
                    raise SystemExit(f"serve did not start: {err[-2000:]}") from None
                time.sleep(0.05)
        yield url, process.pid
    finally:
        process.terminate()
        process.communicate(timeout=60)


async def grow(
    client: httpx.AsyncClient,
    tmpl: Template,
    header: bytes,
    session_id: str,
    path: Path,
    gap_s: float,
    out: list[Sample],
) -> None:
    """Write one session's file line by line, calling the context route at each call point."""
    path.write_bytes(header)
    calls = {call.line: call for call in tmpl.calls}
    route = f"/sessions/{session_id}/context"
    first_call = True
    for number, line in enumerate(tmpl.lines, 1):
        with path.open("ab") as handle:
            handle.write(line)
        call = calls.get(number)
        if call is None:
            await asyncio.sleep(gap_s)
            continue
        request = body(tmpl, call)
        started = time.perf_counter()
        first = await client.post(route, content=request)
        live_ms = (time.perf_counter() - started) * 1e3
        started = time.perf_counter()
        again = await client.post(route, content=request)
        caught_ms = (time.perf_counter() - started) * 1e3
        bad: str | None = None
        changed = False
        if first.status_code != 200 or again.status_code != 200:
            bad = str(first.status_code if first.status_code != 200 else again.status_code)
        else:
            answer = orjson.loads(first.content)
            changed = bool(answer["changed"])
            bad = "stale" if answer["stale"] else answer["reason"]
            if again.content != first.content:
                bad = bad or "differs"
        out.append(
            Sample(
                call.length,
                len(request),
                len(first.content),
                live_ms,
                caught_ms,
                changed,
                first_call,
                bad,
            )
        )
        first_call = False


def copy_header(tmpl: Template, number: int) -> tuple[str, bytes]:
    """Session `number`'s header: the template's with its own id (so its own session)."""
    session_id = str(uuid.UUID(int=0xB0 << 120 | number))
    header = {**tmpl.entries[0], "id": session_id}
    return session_id, orjson.dumps(header) + b"\n"


async def clients(
    url: str, watched: Path, templates: Sequence[Template], sessions: int, gap_s: float
) -> list[Sample]:
    """Grow `sessions` files concurrently (session i a copy of template i mod len)."""
    samples: list[Sample] = []
    limits = httpx.Limits(max_connections=sessions + 4, max_keepalive_connections=sessions + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        tasks = []
        for number in range(sessions):
            tmpl = templates[number % len(templates)]
            session_id, header = copy_header(tmpl, number)
            path = watched / session_file_name({**tmpl.entries[0], "id": session_id})
            tasks.append(grow(client, tmpl, header, session_id, path, gap_s, samples))
        await asyncio.gather(*tasks)
    return samples


def run_level(
    templates: Sequence[Template],
    sessions: int,
    poll_ms: int,
    gap_s: float,
    work: Path,
    tree: Path | None = None,
) -> Run:
    """One level: a fresh serve (of `tree`'s code if given) over a fresh dir, `sessions`
    clients."""
    watched = Path(tempfile.mkdtemp(prefix=f"n{sessions}-", dir=work))
    with serving(watched, poll_ms, tree) as (url, pid):
        cpu_before = cpu_seconds(pid)
        started = time.perf_counter()
        samples = asyncio.run(clients(url, watched, templates, sessions, gap_s))
        wall = time.perf_counter() - started
        cpu_after = cpu_seconds(pid)
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return Run(sessions, samples, wall, cpu)


def quantile(values: Sequence[float], q: float) -> float:
    """The `q` quantile (nearest rank) of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))]


def report_level(
    runs: Sequence[Run], fold_us: Sequence[float], render_us: Sequence[float], label: str = ""
) -> str:
    """One table row per level: latencies, bytes, CPU, the embedded fold and render beside."""
    samples = [s for run in runs for s in run.samples]
    live = [s.live_ms for s in samples if not s.first] or [s.live_ms for s in samples]
    caught = [s.caught_ms for s in samples]
    run_p99 = statistics.median(quantile([s.caught_ms for s in r.samples], 0.99) for r in runs)
    bad = sum(1 for s in samples if s.bad is not None)
    fold_p50 = quantile(fold_us, 0.5) / 1e3
    cpu = [r.serve_cpu_s / r.wall_s for r in runs if r.serve_cpu_s is not None and r.wall_s]
    cells = [
        f"{label}{runs[0].sessions:>5}",
        f"{len(samples):>6}",
        f"{quantile(live, 0.5):7.1f}",
        f"{quantile(live, 0.99):7.1f}",
        f"{quantile(caught, 0.5):7.1f}",
        f"{quantile(caught, 0.99):7.1f}",
        f"{run_p99:7.1f}",
        f"{statistics.mean(s.sent for s in samples) / 1e3:8.0f}",
        f"{statistics.mean(s.received for s in samples) / 1e3:8.0f}",
        f"{statistics.median(cpu) if cpu else float('nan'):5.2f}",
        f"{fold_p50:6.2f}",
        f"{quantile(render_us, 0.5) / 1e3:6.1f}",
        f"{quantile(live, 0.5) / fold_p50:6.0f}x",
        f"{bad:>4}",
    ]
    return " ".join(cells)


HEADER = (
    f"{'':>5}{'N':>5} {'calls':>6} {'live':>7} {'live':>7} {'caught':>7} {'caught':>7} "
    f"{'run p99':>7} {'KB sent':>8} {'KB recv':>8} {'serve':>5} {'fold':>6} {'render':>6} "
    f"{'live/':>7} {'bad':>4}\n"
    f"{'':>10} {'':>6} {'p50 ms':>7} {'p99 ms':>7} {'p50 ms':>7} {'p99 ms':>7} {'median':>7} "
    f"{'mean':>8} {'mean':>8} {'CPUs':>5} {'p50 ms':>6} {'p50 ms':>6} {'fold':>7} {'':>4}"
)


def report_lengths(samples: Sequence[Sample], templates: Sequence[Template]) -> None:
    """Calls by pi's array length: the embedded render, live and caught-up calls, per KB."""
    renders = [
        (call.length, us / 1e3)
        for tmpl in templates
        for call, us in zip(tmpl.calls, tmpl.render_us, strict=True)
    ]
    print("\ncalls by pi's array length (every level and repeat; render: embedded, per leaf)")
    print(
        f"{'messages':>11} {'calls':>6} {'KB sent':>8} {'render':>7} {'live':>7} {'caught':>7} "
        f"{'caught':>7} {'render':>7} {'live':>7}"
    )
    print(
        f"{'':>11} {'':>6} {'median':>8} {'p50 ms':>7} {'p50 ms':>7} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'us/KB':>7} {'us/KB':>7}"
    )
    edges = [0, *LENGTH_EDGES, 10**9]
    for low, high in itertools.pairwise(edges):
        bucket = [s for s in samples if low <= s.length < high]
        render = [ms for length, ms in renders if low <= length < high]
        if not bucket or not render:
            continue
        kb = statistics.median(s.sent for s in bucket) / 1e3
        live = quantile([s.live_ms for s in bucket], 0.5)
        render_p50 = quantile(render, 0.5)
        label = f"{low}-{high - 1}" if high < 10**9 else f"{low}+"
        print(
            f"{label:>11} {len(bucket):>6} {kb:8.0f} {render_p50:7.1f} {live:7.1f} "
            f"{quantile([s.caught_ms for s in bucket], 0.5):7.1f} "
            f"{quantile([s.caught_ms for s in bucket], 0.99):7.1f} "
            f"{render_p50 * 1e3 / kb if kb else 0.0:7.1f} {live * 1e3 / kb if kb else 0.0:7.1f}"
        )


def profile_render(tmpl: Template, scratch: Path, count: int) -> None:
    """cProfile's top functions of `LiveFolds.view` over the whole template session."""
    path = write_session(scratch, tmpl.entries).path
    live = LiveFolds([path], journals=False)
    live.discover()
    live.poll()
    session_id = str(tmpl.entries[0]["id"])
    profiler = cProfile.Profile()
    started = time.perf_counter()
    for _ in range(5):
        profiler.runcall(live.view, session_id)
    stats: Any = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = sum(figures[2] for figures in stats.values())
    print(
        f"\nserve's render (LiveFolds.view) of {len(tmpl.parts)} messages under cProfile: "
        f"{(time.perf_counter() - started) * 200:.1f} ms per render (profiled)"
    )
    top(stats, 3, count, total)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the levels and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,50,200", help="concurrent sessions per level")
    parser.add_argument("--messages", type=int, default=1000, help="messages per session, about")
    parser.add_argument("--distinct", type=int, default=4, help="distinct generated sessions")
    parser.add_argument("--calls", choices=("user", "every"), default="user", help="call points")
    parser.add_argument("--poll-ms", type=int, default=20, help="serve's --poll-ms")
    parser.add_argument("--gap-ms", type=float, default=0.0, help="pause between a file's lines")
    parser.add_argument("--repeat", type=int, default=1, help="runs per level (medians kept)")
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--profile", type=int, default=0, help="top N functions of a render")
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="a checkout (e.g. `git archive REV sessionfold | tar -x -C DIR`) whose serve runs "
        "each level too, alternating with this tree's: its rows say `base`",
    )
    args = parser.parse_args(argv)
    levels = [int(level) for level in args.levels.split(",") if level]
    turns = max(1, round(args.messages / MESSAGES_PER_TURN))
    load = os.getloadavg()
    print(
        f"{os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
        f"sessions of {turns} assistant messages, calls at {args.calls} messages, "
        f"serve --poll-ms {args.poll_ms}, gap {args.gap_ms} ms, {args.repeat} run(s) per level"
    )
    with tempfile.TemporaryDirectory(prefix="live-context-") as tmp:
        work = Path(tmp)
        scratch = work / "templates"
        scratch.mkdir()
        seeds = session_seeds(args.seed, min(args.distinct, max(levels)))
        templates = [template(seed, turns, args.calls == "every", scratch) for seed in seeds]
        fold_us = [us for tmpl in templates for us in tmpl.fold_us]
        render_us = [us for tmpl in templates for us in tmpl.render_us]
        messages = statistics.mean(len(t.parts) for t in templates)
        print(
            f"{len(templates)} distinct sessions of {messages:.0f} messages, "
            f"{statistics.mean(len(t.calls) for t in templates):.0f} calls each; the fold of a "
            f"leaf event embedded: p50 {quantile(fold_us, 0.5) / 1e3:.2f} ms, "
            f"p99 {quantile(fold_us, 0.99) / 1e3:.2f} ms; its render (view and encoding) "
            f"embedded: p50 {quantile(render_us, 0.5) / 1e3:.1f} ms, "
            f"p99 {quantile(render_us, 0.99) / 1e3:.1f} ms"
        )
        print(f"\n{HEADER}")
        every: list[Sample] = []
        for sessions in levels:
            runs = []
            base = []
            for _ in range(args.repeat):
                runs.append(run_level(templates, sessions, args.poll_ms, args.gap_ms / 1e3, work))
                if args.baseline_tree is not None:
                    base.append(
                        run_level(
                            templates,
                            sessions,
                            args.poll_ms,
                            args.gap_ms / 1e3,
                            work,
                            args.baseline_tree,
                        )
                    )
            every.extend(s for run in runs for s in run.samples)
            print(report_level(runs, fold_us, render_us, "     "), flush=True)
            if base:
                print(report_level(base, fold_us, render_us, "base "), flush=True)
        report_lengths(every, templates)
        bad = [s.bad for s in every if s.bad is not None]
        if bad:
            print(
                f"\n{len(bad)} calls answered {sorted(set(bad))}: their figures are not the "
                "render's"
            )
        changed = sum(1 for s in every if s.changed)
        print(f"\n{changed} of {len(every)} answers changed pi's array (the others kept it)")
        if args.profile:
            (work / "profile").mkdir()
            profile_render(templates[0], work / "profile", args.profile)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
