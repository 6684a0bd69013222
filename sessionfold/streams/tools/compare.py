"""Two pruning configurations over the same sessions, turn by turn.

`run_config` replays each session file once per configuration through the embedded runtime and
renders the context view after every assistant message (the view `sessionfold context --turn N`
prints) and at the end. `compare` pairs two runs; `summary` reduces a per-turn series to mean,
p50 (nearest rank), max and final; `write_chart` draws tokens per turn as a PNG with
matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessionfold.events.envelope import Envelope
from sessionfold.projections.pruning import digest
from sessionfold.projections.pruning.config import PruneConfig, build_config, parse_override
from sessionfold.projections.views.context import ContextView, context_at, message_tokens
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.tools.replay import Collector, Replayer, file_envelopes

#: Sessions drawn in one chart (one panel each); the rest are only in the table.
CHART_PANELS = 6


def split_settings(text: str) -> list[str]:
    """`a=1,b.c=[1,2],d="x,y"` -> ["a=1", "b.c=[1,2]", 'd="x,y"']: commas inside brackets,
    braces or quotes do not split."""
    parts: list[str] = []
    depth = 0
    quote: str | None = None
    current: list[str] = []
    for char in text:
        if quote is not None:
            current.append(char)
            if char == quote:
                quote = None
            continue
        if char in "\"'":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    parts.append("".join(current).strip())
    return [p for p in parts if p]


def config_of(settings: Sequence[str], base: PruneConfig | None = None) -> PruneConfig:
    """The defaults with each `k=v` setting over them (ConfigError on a bad one)."""
    layers = [parse_override(s) for text in settings for s in split_settings(text)]
    return build_config(*layers) if base is None else build_config(*layers, base=base)


class TokenCounter:
    """Token estimates of messages, cached for the log's own message objects.

    Messages taken from the log are the same objects at every turn of a replay, so their size
    is computed once; stubs, summaries and synthetics are new at each render and are measured
    each time. The cache keeps the objects it measured alive, so ids are never reused.
    """

    def __init__(self) -> None:
        self._cache: dict[int, tuple[Any, int]] = {}

    def count(self, messages: Iterable[dict[str, Any]], origin: Mapping[int, int]) -> int:
        """Summed tokens of `messages`; messages in `origin` come from the log."""
        total = 0
        for message in messages:
            key = id(message)
            if key in origin:
                hit = self._cache.get(key)
                if hit is None or hit[0] is not message:
                    hit = (message, message_tokens(message))
                    self._cache[key] = hit
                total += hit[1]
            else:
                total += message_tokens(message)
        return total


@dataclass
class SessionRun:
    """One session under one configuration: tokens per turn, at the end, flushes, calls."""

    session_id: str
    tokens: list[int] = field(default_factory=list)  # view tokens after assistant 0, 1, ...
    unpruned: list[int] = field(default_factory=list)
    final: int = 0
    final_unpruned: int = 0
    flushes: int = 0  # flush attempts that processed at least one batch
    attempts: int = 0  # every flush attempt, empty ones included
    model_calls: int = 0
    cost: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The run as stable JSON."""
        return {
            "tokens_per_turn": self.tokens,
            "summary": summary(self.tokens, self.final),
            "flushes": self.flushes,
            "flush_attempts": self.attempts,
            "model_calls": self.model_calls,
            "cost": self.cost,
        }


def summary(series: Sequence[int], final: int) -> dict[str, int | float]:
    """mean, p50 (nearest rank), max of a per-turn series, and the final value."""
    if not series:
        return {"mean": 0, "p50": 0, "max": 0, "final": final}
    ordered = sorted(series)
    rank = max(1, math.ceil(0.5 * len(ordered)))
    return {
        "mean": round(sum(series) / len(series), 1),
        "p50": ordered[rank - 1],
        "max": ordered[-1],
        "final": final,
    }


def _session_ids(path: Path) -> list[str]:
    seen: dict[str, None] = {}
    for record in read_session_file(path):
        if not isinstance(record, DeadLetter):
            seen.setdefault(record.session_id)
    return list(seen)


def run_session(
    path: Path,
    session_id: str,
    config: PruneConfig,
    on_turn: Callable[[int, ContextView], None] | None = None,
) -> SessionRun:
    """Replay one session of a file, rendering its view after every assistant message."""
    collector = Collector(session_id)
    counter = TokenCounter()
    run = SessionRun(session_id)
    replayer = Replayer(config, [session_id])
    state = {"turns": 0}

    def render() -> ContextView:
        runtime = replayer.runtime
        return context_at(
            collector.entries,
            runtime.store,
            session_id,
            config,
            collector.compact_points(runtime),
        )

    def folded(envelope: Envelope) -> None:
        collector(envelope)
        if envelope.session_id != session_id:
            return
        turns = digest.head(replayer.runtime.store, session_id)["turns"]
        if turns <= state["turns"]:
            return
        state["turns"] = turns
        view = render()
        run.tokens.append(counter.count(view.messages, view.origin))
        run.unpruned.append(counter.count(view.unpruned_sent, view.origin))
        if on_turn is not None:
            on_turn(turns - 1, view)

    replayer.on_folded = folded
    for record in file_envelopes([path]):
        replayer.feed(record)
    view = render()
    run.final = counter.count(view.messages, view.origin)
    run.final_unpruned = counter.count(view.unpruned_sent, view.origin)
    state_json = replayer.runtime.session_state(session_id)
    attempts = state_json["flush_attempts"]
    run.attempts = len(attempts)
    run.flushes = sum(1 for a in attempts if a["processed_batches"] > 0)
    run.model_calls = int(state_json["stats"]["calls"])
    run.cost = float(state_json["stats"]["cost"])
    return run


def run_config(paths: Sequence[Path], config: PruneConfig) -> list[SessionRun]:
    """Every session of every file under one configuration, in file order."""
    runs = []
    for path in paths:
        for session_id in _session_ids(path):
            runs.append(run_session(path, session_id, config))
    return runs


@dataclass
class Comparison:
    """Two runs of the same sessions, and the settings that made them."""

    a_settings: list[str]
    b_settings: list[str]
    a: list[SessionRun]
    b: list[SessionRun]

    def totals(self, runs: Sequence[SessionRun]) -> dict[str, Any]:
        """Totals over sessions: the per-turn summary of all turns pooled, and the counts."""
        pooled = [t for run in runs for t in run.tokens]
        return {
            "summary": summary(pooled, sum(run.final for run in runs)),
            "flushes": sum(run.flushes for run in runs),
            "flush_attempts": sum(run.attempts for run in runs),
            "model_calls": sum(run.model_calls for run in runs),
            "cost": sum(run.cost for run in runs),
        }

    def unpruned(self) -> dict[str, Any]:
        """pi's context without pruning (the same under both configurations)."""
        pooled = [t for run in self.a for t in run.unpruned]
        return {
            "summary": summary(pooled, sum(run.final_unpruned for run in self.a)),
            "sessions": {
                run.session_id: {
                    "tokens_per_turn": run.unpruned,
                    "summary": summary(run.unpruned, run.final_unpruned),
                }
                for run in self.a
            },
        }

    def to_json(self) -> dict[str, Any]:
        """`sessionfold compare --json`."""
        return {
            "a": {
                "settings": self.a_settings,
                "sessions": {r.session_id: r.to_json() for r in self.a},
                "totals": self.totals(self.a),
            },
            "b": {
                "settings": self.b_settings,
                "sessions": {r.session_id: r.to_json() for r in self.b},
                "totals": self.totals(self.b),
            },
            "unpruned": self.unpruned(),
        }


def compare(
    paths: Sequence[Path], a_settings: Sequence[str], b_settings: Sequence[str]
) -> Comparison:
    """Run configurations A and B over the same session files."""
    config_a = config_of(a_settings)
    config_b = config_of(b_settings)
    return Comparison(
        list(a_settings),
        list(b_settings),
        run_config(paths, config_a),
        run_config(paths, config_b),
    )


def _label(settings: Sequence[str], name: str) -> str:
    text = ", ".join(settings) or "defaults"
    return f"{name}: {text}" if len(text) <= 60 else f"{name}: {text[:57]}..."


def write_chart(comparison: Comparison, path: Path) -> Path:
    """Tokens the model sees per turn, A against B (and pi unpruned, dashed), one panel per
    session (at most CHART_PANELS), written as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    shown = list(zip(comparison.a, comparison.b, strict=True))[:CHART_PANELS]
    rows = max(1, len(shown))
    figure, axes = plt.subplots(rows, 1, figsize=(9, 3.2 * rows), squeeze=False)
    for (run_a, run_b), (axis,) in zip(shown, axes, strict=False):
        turns = range(len(run_a.tokens))
        axis.plot(turns, run_a.unpruned, "--", color="0.6", label="pi, unpruned")
        axis.plot(turns, run_a.tokens, color="tab:blue", label=_label(comparison.a_settings, "A"))
        axis.plot(turns, run_b.tokens, color="tab:orange", label=_label(comparison.b_settings, "B"))
        axis.set_title(f"session {run_a.session_id}", fontsize=9, loc="left")
        axis.set_xlabel("turn (assistant message)")
        axis.set_ylabel("tokens the model sees")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="upper left")
    if len(comparison.a) > CHART_PANELS:
        figure.suptitle(f"first {CHART_PANELS} of {len(comparison.a)} sessions", fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=110)
    plt.close(figure)
    return path
