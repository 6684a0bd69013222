"""`sessionfold serve`: the live loop for one machine, no broker.

It tails the agents' session directories (default pi's, Claude Code's and Codex's, as each
agent's settings place them: runtime/agent_dirs.py; several paths allowed), folds
every session as its lines arrive (runtime/live.py), answers flushes with the configured model
port (offline unless `summarizerModel` names an HTTP model; answers are kept beside each file)
and serves the live API (web/live_api.py) that the pi extension in integrations/pi calls. It
binds 127.0.0.1 unless `--bind` widens it and wants the API token on every route but `/health`
and `/metrics` when one is set. A restart folds the files again: the log is the archive.

Two processes (spawned, so neither shares the other's GIL): the API process listens on the
port and answers caught-up context calls from what the fold process handed over (web/
live_front.py), relaying every other call to it on a Unix socket in a private temporary
directory; the fold process runs the tailer (reads and folds the files), one render thread,
`--answer-threads` model calls (runtime/live.py: a slow model delays only the session it
answers) and the live API (web/live_api.py) on that socket. Its threads but the event
loop's (which answers the relayed calls) run `--fold-nice` below the API process' CPU
priority. A stop (SIGTERM, Ctrl-C) closes the port, then stops the fold process, which waits
up to `--shutdown-grace` seconds for the answers still with the model. A fold process that ends
unasked ends serve with exit code 1 and a line saying so (never half alive); a fold process
whose API process is gone ends at once (a thread waits for the end of a pipe only that process
holds open).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from sessionfold.projections.pruning.config import PruneConfig
from sessionfold.streams.cli.ledger import OFFLINE_NAMES, diff_model_for
from sessionfold.streams.cli.options import (
    ANTHROPIC_UPSTREAM,
    OPENAI_UPSTREAM,
    AnthropicUpstream,
    ApiToken,
    ApiTokenFile,
    CacheTtl,
    ConfigFile,
    MinFreedTokens,
    OpenaiUpstream,
    Settings,
    api_token_or_exit,
    config_or_exit,
    upstreams_or_exit,
)
from sessionfold.streams.cli.self_loop import calls_itself
from sessionfold.streams.cli.worker import model_port_for
from sessionfold.streams.logs import (
    configure_cli_logging,
    show_session_lines,
    write_stderr_in_background,
)
from sessionfold.streams.runtime.agent_dirs import agent_session_dirs
from sessionfold.streams.runtime.heap import freeze_after_full_collections
from sessionfold.streams.runtime.live import DEFAULT_ANSWER_THREADS, LiveFolds
from sessionfold.streams.web.auth import exposure_warning, quiet_bad_requests
from sessionfold.streams.web.cache_policy import CACHE_TTL_S, MIN_FREED_TOKENS, CachePolicy
from sessionfold.streams.web.gateway import APIS, Gateway
from sessionfold.streams.web.handover import Handover
from sessionfold.streams.web.live_api import DEFAULT_WAIT_S, LiveApi
from sessionfold.streams.web.live_contract import READ_TIMEOUT_S
from sessionfold.streams.web.live_front import LiveFront

log = logging.getLogger(__name__)

#: How recently a session's file must have been written for its flushes to go to the model
#: (`--live-within`), seconds: older sessions are folded for their state, their flushes
#: answered offline, unless a client asks for them.
LIVE_WITHIN_S = 600.0
#: How long a stop waits for the answers still with the model by default, seconds
#: (`--shutdown-grace`): one that comes back in time is journaled and folded; one that does not
#: is asked again at the next start.
SHUTDOWN_GRACE_S = 30.0
#: How much lower the fold process' folding threads' CPU priority (the tailer, the render and
#: answer threads; not its event loop's) is than the API process' (a nice increment) by
#: default (`--fold-nice`). On a machine with more work than cores, the API process' few
#: milliseconds per call then get a CPU ahead of the folds' long runs, so a caught-up call no
#: longer waits out the fold process' time slices (docs/live.md, Performance).
FOLD_NICE = 10
#: The fold process' socket's accept queue.
FOLD_BACKLOG = 4096
#: How much longer than the shutdown grace the API process waits for the fold process to stop
#: (its tailer's join, its last frames) before it kills it.
STOP_MARGIN_S = 15.0
#: The GIL's switch interval in serve, seconds (Python's default: 0.005). The event loop gives
#: up the GIL at each socket call and waits up to an interval to get it back from the tailer and
#: the render thread: a shorter one halves a caught-up call's median as a client sees it at 50
#: and 200 busy sessions (bench/live_context.py --node; docs/live.md), though serve's own time
#: of the call grows a little.
SWITCH_INTERVAL_S = 0.001


def register(app: typer.Typer) -> None:
    """Attach the `serve` command to the root app."""

    @app.command("serve")
    def serve(
        paths: Annotated[
            list[Path] | None,
            typer.Argument(
                help="Session directories or files (default: every agent's: pi's "
                "$PI_CODING_AGENT_DIR/sessions or ~/.pi/agent/sessions, Claude Code's "
                "$CLAUDE_CONFIG_DIR/projects or ~/.claude/projects, Codex's $CODEX_HOME/sessions "
                "or ~/.codex/sessions)."
            ),
        ] = None,
        port: Annotated[
            int,
            typer.Option("--port", envvar="SESSIONFOLD_SERVE_PORT", min=0, max=65535),
        ] = 6068,
        bind: Annotated[
            str,
            typer.Option(
                "--bind",
                envvar="SESSIONFOLD_SERVE_BIND",
                help="Address to listen on (a wider one than loopback wants an API token).",
            ),
        ] = "127.0.0.1",
        wait_s: Annotated[
            float,
            typer.Option(
                "--wait-s",
                envvar="SESSIONFOLD_SERVE_WAIT_S",
                min=0.0,
                help="How long a context call waits for its leaf to be folded.",
            ),
        ] = DEFAULT_WAIT_S,
        poll_ms: Annotated[
            int,
            typer.Option("--poll-ms", min=1, help="How often the files are read for new lines."),
        ] = 20,
        answer_threads: Annotated[
            int,
            typer.Option(
                "--answer-threads",
                envvar="SESSIONFOLD_SERVE_ANSWER_THREADS",
                min=0,
                help="Model calls out at once (one per session at most); 0 answers inline.",
            ),
        ] = DEFAULT_ANSWER_THREADS,
        shutdown_grace_s: Annotated[
            float,
            typer.Option(
                "--shutdown-grace",
                envvar="SESSIONFOLD_SERVE_SHUTDOWN_GRACE",
                min=0.0,
                help="How long a stop waits for the answers still with the model, seconds "
                "(one that does not come back is asked again at the next start).",
            ),
        ] = SHUTDOWN_GRACE_S,
        fold_nice: Annotated[
            int,
            typer.Option(
                "--fold-nice",
                envvar="SESSIONFOLD_SERVE_FOLD_NICE",
                min=0,
                max=19,
                help="How much lower the fold process' folding threads' CPU priority is "
                "than the port's (a nice increment; 0: the same).",
            ),
        ] = FOLD_NICE,
        read_timeout_s: Annotated[
            float,
            typer.Option(
                "--read-timeout",
                envvar="SESSIONFOLD_SERVE_READ_TIMEOUT",
                min=0.1,
                help="How long a request may take to send its headers, and then its body, "
                "and how long an idle connection is kept, seconds (then it is closed).",
            ),
        ] = READ_TIMEOUT_S,
        anthropic_upstream: AnthropicUpstream = ANTHROPIC_UPSTREAM,
        openai_upstream: OpenaiUpstream = OPENAI_UPSTREAM,
        min_freed_tokens: MinFreedTokens = MIN_FREED_TOKENS,
        cache_ttl_s: CacheTtl = CACHE_TTL_S,
        live_within_s: Annotated[
            float,
            typer.Option(
                "--live-within",
                envvar="SESSIONFOLD_SERVE_LIVE_WITHIN",
                min=0.0,
                help="A session whose file was written within this many seconds, or that a "
                "client asked for, is live: its flushes go to the model; an older one's are "
                "answered offline.",
            ),
        ] = LIVE_WITHIN_S,
        allow_roots: Annotated[
            list[Path] | None,
            typer.Option(
                "--allow-root",
                help="Where a session file a client names may lie (repeatable; default: the "
                "watched paths and pi's, Claude Code's and Codex's session directories).",
            ),
        ] = None,
        notify: Annotated[
            bool,
            typer.Option(
                "--notify/--no-notify",
                envvar="SESSIONFOLD_SERVE_NOTIFY",
                help="Learn which files changed from file-system notifications (else a scan "
                "that backs off for files that do not change).",
            ),
        ] = True,
        evict: Annotated[
            bool,
            typer.Option(
                "--evict/--no-evict",
                envvar="SESSIONFOLD_SERVE_EVICT",
                help="Keep only the path of a session no client asked for, not live and "
                "settled; fold its file again when it is asked for or grows.",
            ),
        ] = True,
        api_token: ApiToken = None,
        api_token_file: ApiTokenFile = None,
        config_file: ConfigFile = None,
        settings: Settings = None,
        ledger_model: Annotated[
            str | None,
            typer.Option(
                "--ledger-model",
                envvar="SESSIONFOLD_MODEL",
                help="The ledger's diff model: offline (default) or provider/model-id over HTTP.",
            ),
        ] = None,
    ) -> None:
        """Fold pi's live sessions and answer its extension: pruned context, compaction, recall."""
        err = Console(stderr=True)
        config = config_or_exit(err, config_file, settings or [])
        token = api_token_or_exit(err, api_token, api_token_file)
        try:
            diff_model_for(ledger_model)  # refused here, with its reason; made in the fold process
        except ValueError as exc:
            err.print(f"[red]cannot use the ledger model:[/] {exc}", highlight=False)
            raise typer.Exit(2) from None
        refusal = _model_refusal(config, ledger_model, bind, port)
        if refusal is not None:
            err.print(f"[red]cannot use the model:[/] {refusal}", highlight=False)
            raise typer.Exit(2)
        warning = exposure_warning(bind, token)
        if warning is not None:
            err.print(f"[yellow]warning:[/] {warning}", highlight=False)
        # By default every agent's folder: the gateway rewrites Claude Code's and Codex's
        # calls only for sessions whose files serve folds.
        watched = [p.expanduser().absolute() for p in (paths or agent_session_dirs())]
        for path in watched:
            if not path.exists():
                err.print(f"watching {path}: not there yet", highlight=False)
        roots = [p.expanduser().absolute() for p in allow_roots] if allow_roots else None
        if roots is None:
            roots = [*watched, *agent_session_dirs()]
        fold = _FoldSide(
            watched,
            config,
            ledger_model,
            answer_threads,
            wait_s,
            poll_ms / 1000,
            shutdown_grace_s,
            fold_nice,
            live_within_s,
            roots,
            notify,
            evict,
        )
        # Every refusal before anything is changed in this process (tests invoke it in theirs).
        upstreams = upstreams_or_exit(err, anthropic_upstream, openai_upstream)
        quiet_bad_requests()
        write_stderr_in_background()  # a stderr nobody reads never blocks serve
        freeze_after_full_collections()  # the renders handed over: a few per session, kept
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        policy = CachePolicy(min_freed_tokens, cache_ttl_s)
        code = asyncio.run(
            _serve(err, fold, token, bind, port, wait_s, read_timeout_s, upstreams, policy)
        )
        if code:
            raise typer.Exit(code)


def _model_refusal(
    config: PruneConfig, ledger_model: str | None, bind: str, port: int
) -> str | None:
    """Why the models serve would call cannot be used, or None: a model that cannot be
    configured (no base URL, say), or one whose URL is serve's own address (every call would
    come back through its gateway: a Claude Code user's `ANTHROPIC_BASE_URL` often is serve)."""
    from sessionfold.ports.model_http import model_urls

    named = [("summarizerModel", config.summarizerModel)]
    if ledger_model is not None and ledger_model.strip().lower() not in OFFLINE_NAMES:
        named.append(("--ledger-model", ledger_model.strip()))
    for what, name in named:
        if name == "offline":
            continue
        try:
            urls = model_urls(name)
        except ValueError as exc:
            return f"{what} {name}: {exc}"
        for url in urls:
            if calls_itself(url, bind, port):
                return (
                    f"{what} {name} would call {url}, which is this serve: point the model at "
                    "the provider (SESSIONFOLD_MODEL_BASE_URL), not at the gateway"
                )
    return None


@dataclass(frozen=True)
class _FoldSide:
    """What the fold process is started with (pickled to it: `spawn`)."""

    watched: list[Path]
    config: PruneConfig
    ledger_model: str | None
    answer_threads: int
    wait_s: float
    poll_s: float
    shutdown_grace_s: float
    nice: int
    live_within_s: float | None = None
    allowed_roots: list[Path] | None = None
    notify: bool = False
    evict: bool = False


async def _serve(
    err: Console,
    fold: _FoldSide,
    token: str | None,
    bind: str,
    port: int,
    wait_s: float,
    read_timeout_s: float = READ_TIMEOUT_S,
    upstreams: dict[str, str] | None = None,
    policy: CachePolicy | None = None,
) -> int:
    """The API process: start the fold process, serve the routes until a signal (0) or until
    the fold process ends on its own (1)."""
    from aiohttp import web

    spawn = multiprocessing.get_context("spawn")
    private = Path(tempfile.mkdtemp(prefix="sessionfold-serve-"))  # 0700: the socket's dir
    socket_path = private / "fold.sock"
    frames_in, frames_out = spawn.Pipe(duplex=False)
    # The fold process watches `alive_in`: it reads its end (EOF) once this process is gone.
    alive_in, alive_out = spawn.Pipe(duplex=False)
    process = spawn.Process(
        target=_fold_process,
        args=(fold, str(socket_path), frames_out, alive_in),
        name="sessionfold-fold",
    )
    process.start()
    frames_out.close()
    alive_in.close()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**31)
    pipe = open(frames_in.fileno(), "rb", buffering=0, closefd=False)  # noqa: SIM115
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    front = LiveFront(str(socket_path), wait_s)
    assert front.metrics is not None
    gateway = Gateway(
        upstreams or {api.name: api.default_upstream for api in APIS},
        token,
        front.metrics.registry,
        policy=policy or CachePolicy(),
    )
    ready: asyncio.Future[int] = loop.create_future()
    receiving = asyncio.create_task(front.receive(reader, ready))
    ended = asyncio.Event()
    loop.add_reader(process.sentinel, ended.set)
    done = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, done.set)
    # aiohttp closes a connection whose request headers are not in `keepalive_timeout` after
    # it opened (or after its last answer): with the body's bound (live_api.bounded_middleware)
    # a slow or stalled client holds a connection that long at most.
    # A body left unread after an answer (a 401's) is read on and dropped for at most
    # `lingering_time`: the same bound.
    runner = web.AppRunner(
        front.app(token, read_timeout_s, gateway),
        access_log=None,
        keepalive_timeout=read_timeout_s,
        lingering_time=read_timeout_s,
    )
    try:
        waits = [ready, asyncio.ensure_future(ended.wait()), asyncio.ensure_future(done.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            return _fold_ended(err, process) if ended.is_set() else 0
        await runner.setup()
        site = web.TCPSite(runner, bind, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        sessions = ready.result()
        err.print(f"serving on http://{bind}:{bound} (sessions: {sessions})", highlight=False)
        stopping = asyncio.ensure_future(done.wait())
        await asyncio.wait(
            [stopping, asyncio.ensure_future(ended.wait()), receiving],
            return_when=asyncio.FIRST_COMPLETED,
        )
        if not done.is_set():
            # The fold process ended (or closed its pipe) unasked: no half-alive serve.
            await runner.cleanup()
            await asyncio.to_thread(process.join, 5)
            return _fold_ended(err, process)
        return 0
    finally:
        loop.remove_reader(process.sentinel)
        await runner.cleanup()
        if process.is_alive():
            process.terminate()  # the fold process' own stop: its grace for the answers
            await asyncio.to_thread(process.join, fold.shutdown_grace_s + STOP_MARGIN_S)
            if process.is_alive():
                err.print("the fold process did not stop: killed", highlight=False)
                process.kill()
                await asyncio.to_thread(process.join, 5)
        receiving.cancel()
        pipe.close()
        frames_in.close()
        alive_out.close()
        with contextlib.suppress(OSError):  # the fold process removes them as it stops
            socket_path.unlink()
            private.rmdir()
        if done.is_set():
            err.print("stopped", highlight=False)


def _fold_ended(err: Console, process: BaseProcess) -> int:
    """Say the fold process ended unasked (its exit code), and serve's exit code: 1."""
    log.error("serve: the fold process ended", extra={"exit_code": process.exitcode})
    err.print(
        f"[red]the fold process ended (exit code {process.exitcode}): serve stops[/]",
        highlight=False,
    )
    return 1


#: Whether a nice value is a thread's own (Linux), so the fold process can lower every thread
#: but its event loop's: the loop answers relayed calls and hands renders over at the API
#: process' priority while the tailer, the renders and the answers run below it.
_PER_THREAD_NICE = sys.platform.startswith("linux")


def _lowered(increment: int) -> Callable[[], None]:
    """What lowers the calling thread's CPU priority by `increment` (nothing where a nice
    value is the process' own: `_fold_process` lowered it all at its start)."""

    def lower() -> None:
        if _PER_THREAD_NICE and increment:
            os.nice(increment)  # on Linux the calling thread's nice value only

    return lower


def _fold_process(fold: _FoldSide, socket_path: str, frames: Connection, alive: Connection) -> None:
    """The fold process: `LiveFolds` and the live API over it on `socket_path`, what its
    answers were made from handed over on `frames`; it stops at SIGTERM (the API process
    stopping), or ends at once when `alive` ends (that process gone)."""
    # The API process gone (killed: it never asked for a stop) ends this one at once, not after
    # the grace for the answers: a serve started again must not overlap it.
    threading.Thread(
        target=_end_with_peer,
        args=(alive, socket_path, _lowered(fold.nice)),
        name="peer",
        daemon=True,
    ).start()
    configure_cli_logging()
    show_session_lines()
    # the fold logs under its lock: a full pipe must not stall it
    write_stderr_in_background(_lowered(fold.nice))
    if not _PER_THREAD_NICE:
        os.nice(fold.nice)  # the whole process, loop too: every thread is made from this one
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the API process stops this one
    config = fold.config
    diff_model = diff_model_for(fold.ledger_model)
    live = LiveFolds(
        fold.watched,
        config,
        model_port_for(config),
        diff_model,
        answer_threads=fold.answer_threads,
        live_within_s=fold.live_within_s,
        allowed_roots=fold.allowed_roots or (),
        notify=fold.notify,
        evict=fold.evict,  # a settled session keeps only its path until asked (docs/live.md)
    )
    handover = Handover(live, frames.fileno())
    api = LiveApi(
        live, fold.wait_s, diff_model, handover=handover, on_render_thread=_lowered(fold.nice)
    )
    quiet_bad_requests()
    freeze_after_full_collections()  # the sessions' entries and state live as long as serve
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    asyncio.run(_fold_serve(live, api, handover, socket_path, fold))


def _end_with_peer(alive: Connection, socket_path: str, lower: Callable[[], None]) -> None:
    """Block on `alive` (the API process writes nothing to it) until its end, which comes the
    moment that process is gone however it died; then remove the socket and end this process
    at once, whatever its threads are doing (its answers out are asked again at the next
    start, as after any stop). On a thread of its own: it needs no turn of the event loop
    (lowered like every thread but the loop's: it only waits)."""
    lower()
    with contextlib.suppress(OSError):
        while os.read(alive.fileno(), 1):
            pass
    with contextlib.suppress(OSError):
        Path(socket_path).unlink()
        Path(socket_path).parent.rmdir()
    os._exit(1)


async def _fold_serve(
    live: LiveFolds,
    api: LiveApi,
    handover: Handover,
    socket_path: str,
    fold: _FoldSide,
) -> None:
    from aiohttp import web

    stop = threading.Event()
    lower = _lowered(fold.nice)

    def tail() -> None:
        lower()  # and the answer threads it starts inherit the tailer's priority
        live.follow(stop, fold.poll_s)

    tailer = threading.Thread(target=tail, name="tail", daemon=True)
    tailer.start()
    loop = asyncio.get_running_loop()
    # The compact route's ledger passes, and the stop's waits, run there: folds too.
    loop.set_default_executor(ThreadPoolExecutor(initializer=lower))
    # The API process' relays only, bodies whole and bounded: no timeout (an idle pooled
    # connection closed under a relay would fail it).
    runner = web.AppRunner(api.app(None, read_timeout_s=None), access_log=None)
    await runner.setup()
    # Every relayed call the API process holds open is a connection: room for a fleet's at once
    # (aiohttp's 128 refused the 200 bench sessions' live calls when they came together).
    site = web.UnixSite(runner, socket_path, backlog=FOLD_BACKLOG)
    await site.start()
    handover.ready(live.session_count())
    done = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, done.set)
    try:
        await done.wait()
    finally:
        stop.set()
        live.wanted.set()  # wakes the tailer to see `stop`
        await runner.cleanup()
        tailer.join(timeout=10)
        left = await asyncio.to_thread(live.close, fold.shutdown_grace_s)
        if left:
            print(f"{left} flush answers still out: asked again at the next start", file=sys.stderr)
        # Gone with the API process too when that one was killed: no socket left behind.
        with contextlib.suppress(OSError):
            Path(socket_path).unlink()
            Path(socket_path).parent.rmdir()
