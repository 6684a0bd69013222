"""`sessionfold worker`: run one Kafka worker (fold, summarize or both) until SIGTERM.

It creates the topics if they are missing, checks that they are co-partitioned, builds the Faust
app (`faust_app.make_app`) and runs it with Faust's worker (logging, signals, graceful leave).
Each role scales by starting more workers with the same topic prefix and app id; give each its
own `--web-port`. A fold worker's web port answers the gateway's model API routes too, with
serve's options (`--anthropic-upstream`, `--openai-upstream`, `--min-freed-tokens`,
`--cache-ttl`; docs/live.md, "Fleet"). `--config`/`--set` are the pruning settings, as for
`sessionfold fold`; every fold worker of one app must run with the same ones, and with the
same API token (requests are proxied between them with the caller's token). The web server
binds 127.0.0.1 unless `--web-bind` widens it; a wider bind without a token is warned about
(docs/security.md).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from kafka.errors import KafkaError
from rich.console import Console

from sessionfold.ports.summarizer import ModelPort, OfflineSummarizer
from sessionfold.projections.pruning.config import PruneConfig
from sessionfold.streams.cli.ledger import diff_model_for
from sessionfold.streams.cli.options import (
    ANTHROPIC_UPSTREAM,
    DEFAULT_BOOTSTRAP,
    DEFAULT_PARTITIONS,
    DEFAULT_PREFIX,
    OPENAI_UPSTREAM,
    AnthropicUpstream,
    ApiToken,
    ApiTokenFile,
    Bootstrap,
    CacheTtl,
    ConfigFile,
    Ledger,
    MinFreedTokens,
    OpenaiUpstream,
    Partitions,
    Settings,
    TopicPrefix,
    access_or_exit,
    api_token_or_exit,
    config_or_exit,
    kafka_failure,
    kafka_security_options,
    upstreams_or_exit,
)
from sessionfold.streams.kafka import clients
from sessionfold.streams.kafka.security import PLAINTEXT, KafkaSecurity
from sessionfold.streams.kafka.topics import Topics, ensure_topics
from sessionfold.streams.logs import DEFAULT_REPEAT_INTERVAL_S, RepeatFilter
from sessionfold.streams.web.auth import exposure_warning
from sessionfold.streams.web.cache_policy import CACHE_TTL_S, MIN_FREED_TOKENS
from sessionfold.streams.web.live_contract import DEFAULT_WAIT_S
from sessionfold.streams.web.live_worker import DEFAULT_CACHED_SESSIONS
from sessionfold.streams.worker import fault_injection
from sessionfold.streams.worker.answers import DEFAULT_ANSWER_THREADS

if TYPE_CHECKING:
    import faust


def register(app: typer.Typer) -> None:
    """Attach the `worker` command to the root app."""

    @app.command("worker")
    @kafka_security_options
    def worker(
        role: Annotated[
            str,
            typer.Option(
                "--role",
                envvar="SESSIONFOLD_WORKER_ROLE",
                help="fold, summarize, or all (both in one process).",
            ),
        ] = "all",
        bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
        topic_prefix: TopicPrefix = DEFAULT_PREFIX,
        partitions: Partitions = DEFAULT_PARTITIONS,
        web_port: Annotated[
            int,
            typer.Option(
                "--web-port",
                envvar="SESSIONFOLD_WEB_PORT",
                min=1,
                max=65535,
                help="Port of the state API and /metrics.",
            ),
        ] = 6066,
        web_bind: Annotated[
            str,
            typer.Option(
                "--web-bind",
                envvar="SESSIONFOLD_WEB_BIND",
                help="Address to listen on (0.0.0.0: every address; set an API token then).",
            ),
        ] = "127.0.0.1",
        web_host: Annotated[
            str | None,
            typer.Option(
                "--web-host",
                envvar="SESSIONFOLD_WEB_HOST",
                help="Host other workers reach this one at (default: the bind address, or the "
                "host name when binding all addresses).",
            ),
        ] = None,
        api_token: ApiToken = None,
        api_token_file: ApiTokenFile = None,
        app_id: Annotated[
            str | None,
            typer.Option(
                "--app-id",
                envvar="SESSIONFOLD_APP_ID",
                help="Faust app id (consumer group, changelog prefix). Default: <prefix>worker.",
            ),
        ] = None,
        store: Annotated[
            str,
            typer.Option(
                "--store",
                envvar="SESSIONFOLD_STORE",
                help="Table store: memory:// (rebuilt from the changelog at start) or "
                "rocksdb:// (kept under --data-dir, one per worker: a restart reads only the "
                "changelog records it lacks).",
            ),
        ] = "memory://",
        data_dir: Annotated[
            Path | None,
            typer.Option(
                "--data-dir",
                envvar="SESSIONFOLD_DATA_DIR",
                help="Where Faust keeps local data (default ~/.local/state/sessionfold/worker).",
            ),
        ] = None,
        processing_guarantee: Annotated[
            str,
            typer.Option(
                "--processing-guarantee",
                envvar="SESSIONFOLD_PROCESSING_GUARANTEE",
                help="at_least_once (with the fold's journal) or exactly_once (Kafka "
                "transactions; best effort in Faust).",
            ),
        ] = "at_least_once",
        config_file: ConfigFile = None,
        settings: Settings = None,
        ledger: Ledger = True,
        ledger_model: Annotated[
            str | None,
            typer.Option(
                "--ledger-model",
                envvar="SESSIONFOLD_MODEL",
                help="The ledger's diff model: offline (default) or provider/model-id over HTTP "
                "(SESSIONFOLD_MODEL_BASE_URL, _API_KEY, _FALLBACK ... apply).",
            ),
        ] = None,
        live_sessions: Annotated[
            int,
            typer.Option(
                "--live-sessions",
                envvar="SESSIONFOLD_LIVE_SESSIONS",
                min=1,
                help="Sessions whose entries the live routes keep in memory (least recently "
                "asked evicted).",
            ),
        ] = DEFAULT_CACHED_SESSIONS,
        live_wait_s: Annotated[
            float,
            typer.Option(
                "--live-wait-s",
                envvar="SESSIONFOLD_LIVE_WAIT_S",
                min=0.0,
                help="How long a live context call waits for its leaf (the body's wait_ms "
                "overrides it).",
            ),
        ] = DEFAULT_WAIT_S,
        answer_threads: Annotated[
            int,
            typer.Option(
                "--answer-threads",
                envvar="SESSIONFOLD_WORKER_ANSWER_THREADS",
                min=0,
                help="Flush requests the summarizer answers at once (one per session at most); "
                "0 or 1: one at a time.",
            ),
        ] = DEFAULT_ANSWER_THREADS,
        loglevel: Annotated[
            str,
            typer.Option(
                "--loglevel",
                envvar="SESSIONFOLD_LOG_LEVEL",
                help="Log level. At debug, Faust and aiokafka log record contents: keep it off "
                "where sessions hold anything private.",
            ),
        ] = "info",
        log_repeat_interval: Annotated[
            float,
            typer.Option(
                "--log-repeat-interval",
                envvar="SESSIONFOLD_LOG_REPEAT_INTERVAL",
                min=0,
                help="Seconds between two lines of one repeated Kafka client warning or error "
                "(a broker outage); the next says how many were held back. 0: every line.",
            ),
        ] = DEFAULT_REPEAT_INTERVAL_S,
        anthropic_upstream: AnthropicUpstream = ANTHROPIC_UPSTREAM,
        openai_upstream: OpenaiUpstream = OPENAI_UPSTREAM,
        min_freed_tokens: MinFreedTokens = MIN_FREED_TOKENS,
        cache_ttl_s: CacheTtl = CACHE_TTL_S,
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        """Run a Kafka worker: fold session events, answer flush requests, serve state."""
        # Faust is imported here: the other subcommands should not pay for it.
        from pydantic import ValidationError

        from sessionfold.streams.kafka.faust_compat import UpstreamChanged, check_upstream
        from sessionfold.streams.worker.app import WorkerSettings, make_app

        err = Console(stderr=True)
        if role not in ("fold", "summarize", "all"):
            err.print("[red]--role must be fold, summarize or all[/]")
            raise typer.Exit(2)
        try:
            check_upstream()
        except UpstreamChanged as exc:
            err.print(f"[red]cannot run on this Faust:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        config = config_or_exit(err, config_file, settings or [])
        token = api_token_or_exit(err, api_token, api_token_file)
        upstreams = upstreams_or_exit(err, anthropic_upstream, openai_upstream)
        topics = Topics(topic_prefix)
        access_or_exit(err, bootstrap, security)
        try:
            ensure_topics(bootstrap, topics, partitions, security=security)
            counts = _partition_counts(bootstrap, topics, security)
        except KafkaError as exc:
            err.print(
                f"[red]error:[/] {kafka_failure(bootstrap, exc)}", highlight=False, soft_wrap=True
            )
            raise typer.Exit(1) from None
        if len(set(counts.values())) != 1:
            listing = ", ".join(f"{name} {n}" for name, n in counts.items())
            err.print(f"[red]topics are not co-partitioned:[/] {listing}")
            raise typer.Exit(2)
        actual = counts[topics.session_events]
        if actual != partitions:
            err.print(f"topics exist with {actual} partitions; using {actual}", highlight=False)
        try:
            worker_settings = WorkerSettings(
                bootstrap=bootstrap,
                topic_prefix=topic_prefix,
                partitions=actual,
                role=role,  # type: ignore[arg-type]
                app_id=app_id,
                web_port=web_port,
                web_bind=web_bind,
                web_host=web_host,
                api_token=token,
                store=store,
                data_dir=data_dir,
                processing_guarantee=processing_guarantee,  # type: ignore[arg-type]
                prune=config,
                ledger=ledger,
                security=security,
                live_sessions=live_sessions,
                live_wait_s=live_wait_s,
                answer_threads=answer_threads,
                upstreams=upstreams,
                min_freed_tokens=min_freed_tokens,
                cache_ttl_s=cache_ttl_s,
            )
        except ValidationError as exc:
            fields = ", ".join(str(e["loc"][0]) for e in exc.errors())
            err.print(f"[red]invalid worker settings:[/] {fields}")
            raise typer.Exit(2) from None
        try:
            diff_model = diff_model_for(ledger_model)
        except ValueError as exc:
            err.print(f"[red]cannot use the ledger model:[/] {exc}", highlight=False)
            raise typer.Exit(2) from None
        warning = exposure_warning(web_bind, token)
        if warning is not None:
            err.print(f"[yellow]warning:[/] {warning}", highlight=False)
        faust_app = make_app(
            worker_settings,
            model_port=model_port_for(config),
            diff_model=diff_model,
            step_hook=fault_injection.fold_hook_for(
                os.environ.get(fault_injection.ENV_TEST_FOLD_HOOK)
            ),
        )
        _run(faust_app, loglevel, log_repeat_interval)


def model_port_for(config: PruneConfig) -> ModelPort:
    """The port `summarizerModel` names (offline unless the HTTP port is available), slowed down
    when the tests' delay variable is set (fault_injection.py)."""
    port: ModelPort = OfflineSummarizer()
    if config.summarizerModel != "offline":
        from sessionfold.ports.summarizer_http import summarizer_for

        port = summarizer_for(config)
    return fault_injection.delayed(port, os.environ.get(fault_injection.ENV_TEST_DELAY))


def _partition_counts(bootstrap: str, topics: Topics, security: KafkaSecurity) -> dict[str, int]:
    consumer = clients.reader(bootstrap, "sessionfold-worker-setup", security)
    try:
        return {name: len(consumer.partitions_for_topic(name) or ()) for name in topics.all()}
    finally:
        consumer.close()


def _run(faust_app: faust.App, loglevel: str, repeat_interval_s: float) -> None:
    from faust import Worker

    from sessionfold.streams.logs import worker_logging_config

    repeat = RepeatFilter(repeat_interval_s) if repeat_interval_s > 0 else None
    if repeat is not None:
        # The recovery line is due a quiet period after the last failure, whether or not
        # anything is logged then.
        faust_app.timer(_REPEAT_TICK_S)(_ticker(repeat))

    class _Worker(Worker):
        def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
            super().on_setup_root_logger(logger, level)
            if repeat is not None:
                repeat.attach(logger)  # Faust has just replaced the root's handlers

    worker = _Worker(
        faust_app,
        loglevel=loglevel,
        redirect_stdouts=False,
        logging_config=worker_logging_config(),  # log lines show their extra= facts
    )
    # No terminal spinner: to drive it Faust lowers the root logger to DEBUG, and every library
    # then builds debug records (some with message values) for nothing.
    worker.spinner = None
    worker.execute_from_commandline()


_REPEAT_TICK_S = 1.0


def _ticker(repeat: RepeatFilter) -> Callable[[], Awaitable[None]]:
    async def tick_repeat_filter() -> None:
        repeat.tick()

    return tick_repeat_filter
