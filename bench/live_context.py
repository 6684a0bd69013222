"""The live context route of `sessionfold serve` under concurrent sessions, beside the fold.

    .venv/bin/python bench/live_context.py [--levels 1,50,200] [--messages 1000] [--repeat 1]
        [--node [--node-probes K]]

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
  the render (the `render` column gives the render alone, embedded). `in srv` is serve's own
  time of it (its Server-Timing); with `--node`, a node process of its own (node's fetch, as
  the extension calls) times the same call once more (`node`), free of this process's delays;
  a last table splits node's calls by whether another of them was in flight meanwhile (one
  node process times all N sessions' calls, where each pi makes one at a time;
  `--node-probes K` deals the sessions' calls round K node processes).

Per level: p50/p99 of both over every call of every repeat (and the median over repeats of each
run's p99), bytes sent and received per call, serve's CPU use (its processes together) and
this process's (the clients', on the same CPUs), and the fold's own time for the same leaf
events, folded embedded (`LiveFolds` in this process, before the timed part) and the ratio of a
live call to it, and the embedded render (view and encoding) at the same leaves.
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
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from cpu_use import tree_cpu_seconds
from fold_profile import top

from sessionfold.streams.kafka.topics import Topics, ensure_topics
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
#: The node client of `--node`.
PROBE = Path(__file__).with_name("node_probe.mjs")


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
    shape_parts: list[bytes]  # the same messages' [role, toolCallId] (what the extension sends)
    calls: list[Call]
    fold_us: list[float]  # the embedded fold's time of each leaf event, per call
    render_us: list[float]  # the embedded render (view and its encoding) at each leaf, per call


@dataclass(frozen=True)
class Load:
    """How the clients drive serve: its poll, the pause between lines, the request's form of
    pi's array, and how many messages of each session are written before serve starts."""

    poll_ms: int
    gap_s: float
    send: str  # "shape" (what the extension sends) or "messages" (the whole array)
    start: int  # messages already in each file when serve starts (caught up on, no calls)
    partitions: int = 4  # the worker's topics' partitions (`--worker`)
    node: int = 0  # node processes timing each caught-up call once more (`--node`), 0: none


@dataclass
class Sample:
    """One timed call."""

    length: int  # messages in pi's array
    sent: int  # request body bytes
    array: int  # pi's array's bytes (what the call would carry whole)
    received: int  # answer body bytes
    live_ms: float
    caught_ms: float
    caught_server_ms: float | None  # the caught-up call's time in serve (its Server-Timing)
    caught_node_ms: float | None  # the same call timed from node (`--node`), else None
    caught_node_alone: bool  # node's call had no other of node's calls in flight meanwhile
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
    client_cpu_s: float = 0.0  # this process's (the writers' and the clients'): it shares the CPUs


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
    shape = [orjson.dumps([m["role"], m.get("toolCallId")]) for m in view.unpruned]
    return Template(entries, lines[1:], parts, shape, calls, fold_us, render_us)


def _is_call(entry: Entry, every: bool) -> bool:
    """Whether pi calls its model after `entry` (a user message; any message with `every`)."""
    message = entry.get("message")
    if entry.get("type") != "message" or not isinstance(message, dict):
        return False
    return every or message.get("role") == "user"


def body(tmpl: Template, call: Call, send: str) -> bytes:
    """The context call's request body (built outside the timed part): pi's array as its
    `shape`, the answer as a patch (what the extension sends), or the array whole and the
    answer whole (`messages`, what it sent before)."""
    parts = tmpl.shape_parts if send == "shape" else tmpl.parts
    array = b",".join(parts[: call.length])
    leaf = b'{"leaf":' + orjson.dumps(call.leaf)
    if send == "shape":  # the extension also asks for the answer as a patch to its array
        leaf += b',"answer":"patch"'
    return leaf + b',"' + send.encode() + b'":[' + array + b"]}"


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
    # serve's log goes to a file: a pipe read only at the end filled (64 KB: a line per flush
    # answered, 96 KB in a minute at 200 sessions) and blocked serve's logging, and its fold.
    log = watched.parent / "serve.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(command, env=env, stderr=stderr, cwd=watched)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, 60, log)
        yield url, process.pid
    finally:
        process.terminate()
        process.communicate(timeout=60)


def server_ms(response: httpx.Response) -> float | None:
    """The server's own time of a call (its `Server-Timing: total;dur=MS`), None without one:
    the client's time less its own delays (a loaded client's event loop adds to every call)."""
    timing = response.headers.get("server-timing", "")
    _, found, duration = timing.partition("dur=")
    try:
        return float(duration.split(";")[0]) if found else None
    except ValueError:
        return None


def first_line(tmpl: Template, start: int) -> int:
    """The number of the first line written live: the lines before hold `start` messages."""
    if start <= 0:
        return 1
    return next((c.line for c in tmpl.calls if c.length >= start), len(tmpl.lines) + 1)


@contextmanager
def worker_serving(
    watched: Path, bootstrap: str, partitions: int, sessions: int
) -> Iterator[tuple[str, int]]:
    """One `--role all` Kafka fold worker on fresh topics, fed by `publish --follow` of
    `watched` (the way a fleet feeds it): its URL and pid."""
    prefix = f"bench-live-{uuid.uuid4().hex[:8]}"
    ensure_topics(bootstrap, Topics(prefix), partitions)
    port = free_port_pair()
    env = {**os.environ, "SESSIONFOLD_LEDGER_LOG": "off"}
    env.pop("SESSIONFOLD_API_TOKEN", None)
    kafka = ["--bootstrap", bootstrap, "--topic-prefix", prefix]
    worker = [*CLI, "worker", "--role", "all", *kafka, "--partitions", str(partitions)]
    worker += ["--web-port", str(port), "--data-dir", str(watched.parent / f"{prefix}-data")]
    worker += ["--live-sessions", str(max(sessions, 64))]
    publish = [*CLI, "publish", str(watched), "--follow", *kafka]
    publish += ["--state-file", str(watched.parent / f"{prefix}-publish.json")]
    logs = (watched.parent / f"{prefix}-worker.log").open("wb")
    fold = subprocess.Popen(worker, env=env, stdout=logs, stderr=subprocess.STDOUT)
    follow = subprocess.Popen(
        publish, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, fold, 240, watched.parent / f"{prefix}-worker.log")
        # The state API answers 503 until the worker holds its partitions.
        deadline = time.monotonic() + 240
        while httpx.get(f"{url}/sessions/nobody/status", timeout=10).status_code == 503:
            if fold.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the worker never got its partitions")
            time.sleep(0.5)
        yield url, fold.pid
    finally:
        for process in (follow, fold):
            process.terminate()
        for process in (follow, fold):
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
        logs.close()


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    """Return once `url`/health answers; exit if the process dies (with the end of its `log`)
    or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.get(f"{url}/health", timeout=1)
            return
        except httpx.TransportError:
            exited = process.poll() is not None
            if exited or time.monotonic() > deadline:
                err = log.read_bytes().decode(errors="replace") if log.exists() else ""
                raise SystemExit(f"the server at {url} did not start: {err[-2000:]}") from None
            time.sleep(0.05)


async def grow(
    client: httpx.AsyncClient,
    tmpl: Template,
    session_id: str,
    path: Path,
    load: Load,
    out: list[Sample],
    probe: NodeProbe | None = None,
) -> None:
    """Write one session's file on from `load.start` messages line by line (at full speed,
    the lines up to each call point at once, as pi writes a turn's results before it calls its
    model: a write per line kept 200 sessions' writers busy on this process's event loop,
    whose delays the timed calls then measured), calling the context route at each call
    point."""
    calls = {call.line: call for call in tmpl.calls}
    route = f"/sessions/{session_id}/context"
    first_call = True
    begin = first_line(tmpl, load.start)
    held: list[bytes] = []
    for number, line in enumerate(tmpl.lines[begin - 1 :], begin):
        call = calls.get(number)
        held.append(line)
        if call is None and not load.gap_s:
            continue  # at full speed, the lines up to the next call go in one write
        with path.open("ab") as handle:
            handle.write(b"".join(held))
        held.clear()
        if call is None:
            await asyncio.sleep(load.gap_s)
            continue
        request = body(tmpl, call, load.send)
        started = time.perf_counter()
        first = await client.post(route, content=request)
        live_ms = (time.perf_counter() - started) * 1e3
        started = time.perf_counter()
        again = await client.post(route, content=request)
        caught_ms = (time.perf_counter() - started) * 1e3
        url = f"{client.base_url}".rstrip("/") + route
        node_ms, alone = (None, False) if probe is None else await probe.timed(url, request)
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
                sum(len(part) + 1 for part in tmpl.parts[: call.length]) + 1,
                len(first.content),
                live_ms,
                caught_ms,
                server_ms(again),
                node_ms,
                alone,
                changed,
                first_call,
                bad,
            )
        )
        first_call = False
    if held:
        with path.open("ab") as handle:
            handle.write(b"".join(held))


class NodeProbe:
    """Caught-up calls timed by a node process of its own (bench/node_probe.mjs, node's fetch
    as the extension's): its figures hold none of this process's event-loop delays."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.waiting: dict[int, asyncio.Future[tuple[float | None, bool]]] = {}
        self.numbers = itertools.count()
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def started(cls) -> NodeProbe:
        """A running probe."""
        process = await asyncio.create_subprocess_exec(
            "node", str(PROBE), stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        return cls(process)

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            answer = orjson.loads(line)
            ok = answer["status"] == 200
            timed = (float(answer["ms"]) if ok else None, bool(answer["alone"]))
            self.waiting.pop(answer["n"]).set_result(timed)

    async def timed(self, url: str, request: bytes) -> tuple[float | None, bool]:
        """node's time of one POST of `request` to `url` (ms), None if it was not a 200, and
        whether no other of node's calls was in flight meanwhile."""
        assert self.process.stdin is not None
        number = next(self.numbers)
        answer = self.waiting[number] = asyncio.get_running_loop().create_future()
        line = {"n": number, "url": url, "body": request.decode()}
        self.process.stdin.write(orjson.dumps(line) + b"\n")
        await self.process.stdin.drain()
        return await answer

    async def close(self) -> None:
        """Stop the probe."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        await self.process.wait()
        self.reader.cancel()


def copy_header(tmpl: Template, number: int) -> tuple[str, bytes]:
    """Session `number`'s header: the template's with its own id (so its own session)."""
    session_id = str(uuid.UUID(int=0xB0 << 120 | number))
    header = {**tmpl.entries[0], "id": session_id}
    return session_id, orjson.dumps(header) + b"\n"


def session_files_at_start(
    watched: Path, templates: Sequence[Template], sessions: int, load: Load
) -> list[tuple[Template, str, Path]]:
    """Write each session's header and its lines before `load.start` messages (before serve
    starts); (template, session id, file) per session (session i a copy of template i mod
    len)."""
    files = []
    for number in range(sessions):
        tmpl = templates[number % len(templates)]
        session_id, header = copy_header(tmpl, number)
        path = watched / session_file_name({**tmpl.entries[0], "id": session_id})
        path.write_bytes(header + b"".join(tmpl.lines[: first_line(tmpl, load.start) - 1]))
        files.append((tmpl, session_id, path))
    return files


async def caught_up(
    client: httpx.AsyncClient, files: Sequence[tuple[Template, str, Path]], load: Load
) -> None:
    """Return once serve has folded every file as written before it started (a context call
    at each one's last leaf, waiting as long as it takes; not timed)."""
    for tmpl, session_id, _path in files:
        line = first_line(tmpl, load.start) - 1
        if line < 1:
            continue
        leaf = orjson.loads(tmpl.lines[line - 1])["id"]
        body = {"leaf": leaf, "shape": [], "wait_ms": 600_000}
        # A file serve has not found yet answers `unknown-session` at once (a worker's, 503
        # until it holds its partitions): ask again until the leaf's answer comes.
        for _ in range(2400):
            answer = await client.post(f"/sessions/{session_id}/context", json=body, timeout=900)
            if answer.status_code == 200 and answer.json()["reason"] != "unknown-session":
                break
            await asyncio.sleep(0.25)


async def clients(
    url: str, files: Sequence[tuple[Template, str, Path]], load: Load
) -> list[Sample]:
    """Grow the files concurrently, once serve has caught up on what they held. Each session
    has a client of its own, as each pi has: httpx's pool looks over every connection it holds
    for each request, which with one pool of 200 made the bench measure its own time."""
    samples: list[Sample] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        await caught_up(client, files, load)
    probes = [await NodeProbe.started() for _ in range(load.node)]
    for probe in probes:  # node loads its fetch on the first call: not a figure of serve's
        await probe.timed(f"{url}/sessions/warm-up/context", b"{}")
    async with AsyncExitStack() as stack:
        own = [
            await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=120))
            for _ in files
        ]
        tasks = [
            grow(
                client,
                tmpl,
                session_id,
                path,
                load,
                samples,
                probes[n % len(probes)] if probes else None,
            )
            for n, (client, (tmpl, session_id, path)) in enumerate(zip(own, files, strict=True))
        ]
        await asyncio.gather(*tasks)
    for probe in probes:
        await probe.close()
    return samples


def run_level(
    templates: Sequence[Template],
    sessions: int,
    load: Load,
    work: Path,
    tree: Path | None = None,
    bootstrap: str | None = None,
) -> Run:
    """One level: a fresh serve (of `tree`'s code if given; a Kafka fold worker on `bootstrap`
    if given) over a fresh dir, `sessions` clients (the server's CPU and the wall time count
    from when it has caught up)."""
    watched = Path(tempfile.mkdtemp(prefix=f"n{sessions}-", dir=work)) / "sessions"
    watched.mkdir()
    files = session_files_at_start(watched, templates, sessions, load)
    server = (
        serving(watched, load.poll_ms, tree)
        if bootstrap is None
        else worker_serving(watched, bootstrap, load.partitions, sessions)
    )
    with server as (url, pid):
        cpu_before = tree_cpu_seconds(pid)
        client_before = time.process_time()
        started = time.perf_counter()
        samples = asyncio.run(clients(url, files, load))
        wall = time.perf_counter() - started
        client = time.process_time() - client_before
        cpu_after = tree_cpu_seconds(pid)
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return Run(sessions, samples, wall, cpu, client)


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
    served = [s.caught_server_ms for s in samples if s.caught_server_ms is not None]
    node = [s.caught_node_ms for s in samples if s.caught_node_ms is not None]
    no_figure = float("nan")
    bad = sum(1 for s in samples if s.bad is not None)
    fold_p50 = quantile(fold_us, 0.5) / 1e3
    cpu = [r.serve_cpu_s / r.wall_s for r in runs if r.serve_cpu_s is not None and r.wall_s]
    client_cpu = [r.client_cpu_s / r.wall_s for r in runs if r.wall_s]
    cells = [
        f"{label}{runs[0].sessions:>5}",
        f"{len(samples):>6}",
        f"{quantile(live, 0.5):7.1f}",
        f"{quantile(live, 0.99):7.1f}",
        f"{quantile(caught, 0.5):7.1f}",
        f"{quantile(caught, 0.99):7.1f}",
        f"{run_p99:7.1f}",
        f"{quantile(served, 0.5) if served else no_figure:7.1f}",
        f"{quantile(served, 0.99) if served else no_figure:7.1f}",
        f"{quantile(node, 0.5) if node else no_figure:7.1f}",
        f"{quantile(node, 0.99) if node else no_figure:7.1f}",
        f"{statistics.mean(s.sent for s in samples) / 1e3:8.0f}",
        f"{statistics.mean(s.received for s in samples) / 1e3:8.0f}",
        f"{statistics.median(cpu) if cpu else float('nan'):5.2f}",
        f"{statistics.median(client_cpu) if client_cpu else float('nan'):6.2f}",
        f"{fold_p50:6.2f}",
        f"{quantile(render_us, 0.5) / 1e3:6.1f}",
        f"{quantile(live, 0.5) / fold_p50:6.0f}x",
        f"{bad:>4}",
    ]
    return " ".join(cells)


def report_alone(rows: Sequence[tuple[str, Sequence[Run]]]) -> None:
    """node's caught-up calls split by whether another of node's calls was in flight: one
    node process times every session's, where a pi extension makes one call at a time."""
    print("\nnode's caught-up calls, alone in the node process / overlapping another of its calls")
    quantiles = f"{'p50 ms':>7} {'p99 ms':>7}"
    print(f"{'N':>10} {'alone':>6} {quantiles} {'others':>6} {quantiles}")
    for label, runs in rows:
        timed = [(s.caught_node_ms, s.caught_node_alone) for run in runs for s in run.samples]
        parts = [
            [ms for ms, was in timed if ms is not None and was == alone] for alone in (True, False)
        ]
        cells = [f"{label:>10}"]
        for part in parts:
            cells.append(f"{len(part):>6}")
            for q in (0.5, 0.99):
                cells.append(f"{quantile(part, q) if part else float('nan'):7.1f}")
        print(" ".join(cells))


HEADER = (
    f"{'':>5}{'N':>5} {'calls':>6} {'live':>7} {'live':>7} {'caught':>7} {'caught':>7} "
    f"{'run p99':>7} {'in srv':>7} {'in srv':>7} {'node':>7} {'node':>7} {'KB sent':>8} "
    f"{'KB recv':>8} {'serve':>5} "
    f"{'client':>6} {'fold':>6} {'render':>6} {'live/':>7} {'bad':>4}\n"
    f"{'':>10} {'':>6} {'p50 ms':>7} {'p99 ms':>7} {'p50 ms':>7} {'p99 ms':>7} {'median':>7} "
    f"{'p50 ms':>7} {'p99 ms':>7} {'p50 ms':>7} {'p99 ms':>7} {'mean':>8} {'mean':>8} "
    f"{'CPUs':>5} {'CPUs':>6} {'p50 ms':>6} "
    f"{'p50 ms':>6} {'fold':>7} {'':>4}"
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
        f"{'messages':>11} {'calls':>6} {'array KB':>8} {'render':>7} {'live':>7} {'caught':>7} "
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
        kb = statistics.median(s.array for s in bucket) / 1e3
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
    parser.add_argument(
        "--send",
        choices=("shape", "messages"),
        default="shape",
        help="pi's array as the extension sends it (its shape) or whole (a baseline tree from "
        "before the shape contract needs `messages`)",
    )
    parser.add_argument(
        "--start-at",
        type=int,
        default=0,
        help="messages each file holds when serve starts (caught up on before any timed "
        "call): the calls are then those of long sessions only",
    )
    parser.add_argument(
        "--worker",
        metavar="BOOTSTRAP",
        help="also run each level against one `--role all` Kafka fold worker on this broker, "
        "fed by `publish --follow` (rows marked `worker`)",
    )
    parser.add_argument("--partitions", type=int, default=4, help="the worker's partitions")
    parser.add_argument(
        "--node",
        action="store_true",
        help="time each caught-up call once more from a node process (node's fetch, as the "
        "extension calls): the `node` columns, free of this process's delays",
    )
    parser.add_argument(
        "--node-probes",
        type=int,
        default=1,
        metavar="K",
        help="with --node: K node processes, the sessions' calls dealt round among them "
        "(fewer of a probe's calls in flight at once)",
    )
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
    load = Load(
        args.poll_ms,
        args.gap_ms / 1e3,
        args.send,
        args.start_at,
        args.partitions,
        max(1, args.node_probes) if args.node else 0,
    )
    turns = max(1, round(args.messages / MESSAGES_PER_TURN))
    average = os.getloadavg()
    print(
        f"{os.cpu_count()} CPUs, load average {average[0]:.1f} {average[1]:.1f} {average[2]:.1f}; "
        f"sessions of {turns} assistant messages, calls at {args.calls} messages, "
        f"serve --poll-ms {args.poll_ms}, gap {args.gap_ms} ms, {args.repeat} run(s) per level, "
        f"pi's array sent as {args.send}, files start at {args.start_at} messages"
        + (f", {load.node} node process(es) timing" if load.node else "")
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
        every: list[Sample] = []  # serve's
        rows: list[tuple[str, list[Run]]] = []  # serve's and base's, for `report_alone`
        worker_bad: list[str] = []
        for sessions in levels:
            runs = []
            base = []
            workers = []
            for _ in range(args.repeat):
                runs.append(run_level(templates, sessions, load, work))
                if args.baseline_tree is not None:
                    base.append(run_level(templates, sessions, load, work, args.baseline_tree))
                if args.worker is not None:
                    workers.append(
                        run_level(templates, sessions, load, work, bootstrap=args.worker)
                    )
            every.extend(s for run in runs for s in run.samples)
            print(report_level(runs, fold_us, render_us, "     "), flush=True)
            rows.append((f"{sessions:>5}", runs))
            if base:
                print(report_level(base, fold_us, render_us, "base "), flush=True)
                rows.append((f"{sessions:>5} base", base))
            if workers:
                worker_bad.extend(s.bad for run in workers for s in run.samples if s.bad)
                print(report_level(workers, fold_us, render_us, "wrkr "), flush=True)
        report_lengths(every, templates)
        if load.node:
            report_alone(rows)
        bad = [s.bad for s in every if s.bad is not None] + worker_bad
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
