"""Fault injection for the integration tests: off unless its environment variables are set.

The integration tests start real workers as subprocesses and make one stall in the middle of a
fold or answer slowly, so this code has to ship in the package the worker runs; it lives here,
apart from the runtime, and does nothing in a worker started without the variables.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import orjson

from sessionfold.ports.summarizer import ModelPort
from sessionfold.streams.kafka.changelog import Writer
from sessionfold.streams.worker.agents import SourceRecord

#: Seconds the summarizer sleeps before each answer, so a test can kill it mid-call.
ENV_TEST_DELAY = "SESSIONFOLD_TEST_SUMMARIZER_DELAY"
#: `freeze:SESSION:SEQ` (the worker SIGSTOPs itself in the middle of folding that session event,
#: the first time) or `sleep:SESSION:SEQ:SECONDS` (that step takes that long).
ENV_TEST_FOLD_HOOK = "SESSIONFOLD_TEST_FOLD_HOOK"
#: `RECORD_BYTES:SNAPSHOT_RECORDS:SNAPSHOT_MIN_BYTES`: the fold's changelog records are cut at
#: that size and snapshots come that often, so a kill lands between a journal's parts or in a
#: snapshot (kafka/changelog.py).
ENV_TEST_CHANGELOG = "SESSIONFOLD_TEST_CHANGELOG"


class DelayedPort:
    """A model port that sleeps before answering: lets tests kill a summarizer mid-call."""

    def __init__(self, port: ModelPort, seconds: float) -> None:
        self.port = port
        self.seconds = seconds

    def summarize(self, request: Any) -> Any:
        """Sleep, then answer with the wrapped port."""
        time.sleep(self.seconds)
        return self.port.summarize(request)


def delayed(port: ModelPort, seconds: str | None) -> ModelPort:
    """`port`, slowed by `seconds` (ENV_TEST_DELAY's value) when set."""
    return DelayedPort(port, float(seconds)) if seconds else port


def fold_hook_for(spec: str | None) -> Callable[[SourceRecord], None] | None:
    """The fold step hook `spec` (ENV_TEST_FOLD_HOOK's value) names, or None."""
    if not spec:
        return None
    action, session, seq, *rest = spec.split(":")
    key, done = session.encode(), []

    def hook(record: SourceRecord) -> None:
        if done or record.key != key or orjson.loads(record.value or b"{}").get("seq") != int(seq):
            return
        done.append(True)
        if action == "freeze":
            os.kill(os.getpid(), signal.SIGSTOP)  # a stall of the whole process, GIL and all
        else:
            time.sleep(float(rest[0]))

    return hook


def tune_changelog(writer: Writer) -> None:
    """Set the changelog writer's record size and snapshot thresholds from ENV_TEST_CHANGELOG,
    when set."""
    spec = os.environ.get(ENV_TEST_CHANGELOG)
    if spec:
        limit, records, min_bytes = (int(n) for n in spec.split(":"))
        writer.limit = limit
        writer.snapshot_records = records
        writer.snapshot_min_bytes = min_bytes
