"""Every Prometheus metric a Kafka worker exports, built from one injected CollectorRegistry.

`create(registry)` returns the frozen `Metrics` bundle the runtimes update; nothing else in the
package defines a metric. Names follow ARCHITECTURE.md: `sessionfold_` prefix, base units
(seconds, dollars, tokens), `_total` on counters (prometheus_client appends it), and only the
bounded labels `kind`, `trigger`, `outcome` and `role`: never a session, agent or tool-call id.
Per-session detail is in the flush-metrics topic and the state API.

The fleet gauges (sessions, pending batches, held events, outstanding flushes, the frontier-gap
distribution) and consumer lag are computed when Prometheus scrapes, by `FleetCollector`, from
the sessions the worker owns at that moment. Each worker reports its own partitions, so a `sum`
over workers is the fleet total. docs/metrics.md lists every name for dashboards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

PREFIX = "sessionfold"

#: Summarizer call duration buckets, seconds: the offline port answers in milliseconds, a real
#: model in seconds up to the reference's 180 s ceiling.
DURATION_BUCKETS = (0.005, 0.025, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 180.0)
#: Frontier-gap buckets, tokens (reference §9.2 reports the gap in estimated tokens).
GAP_BUCKETS = (0, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000)


@dataclass(frozen=True, slots=True)
class Metrics:
    """The worker's metrics; one bundle per app, over the registry it was created with."""

    registry: CollectorRegistry
    worker_info: Gauge
    events_folded: Counter
    events_duplicate: Counter
    events_missing: Counter
    fold_agent_seconds: Counter
    flush_requests: Counter
    flush_attempts: Counter
    compactions: Counter
    journal_replays: Counter
    requests_resent: Counter
    records_recovered: Counter
    records_fenced: Counter
    dead_letters: Counter
    summarizer_requests: Counter
    summarizer_batches: Counter
    summarizer_duration: Histogram
    summarizer_in_progress: Gauge
    summarizer_tokens: Counter
    summarizer_cost: Counter
    summarizer_model_calls: Counter


def create(registry: CollectorRegistry) -> Metrics:
    """Register every counter, gauge and histogram on `registry` (a fresh one per app)."""

    def name(short: str) -> str:
        return f"{PREFIX}_{short}"

    def counter(short: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name(short), documentation, labels, registry=registry)

    return Metrics(
        registry=registry,
        worker_info=Gauge(
            name("worker_info"), "1 per running worker, by role.", ["role"], registry=registry
        ),
        events_folded=counter(
            "events_folded",
            "Session events the fold accepted (sequence number above the last), by kind.",
            ["kind"],
        ),
        events_duplicate=counter(
            "events_duplicate",
            "Session events ignored as already folded (redelivery, replay, duplicate publish).",
            ["kind"],
        ),
        events_missing=counter(
            "events_missing",
            "Sequence numbers a session's events skipped, never folded: events lost on the way, "
            "or older than the topic's retention when the session's state began.",
        ),
        fold_agent_seconds=counter(
            "fold_agent_seconds",
            "Seconds the fold agent spent, by kind: folding (records, and handing a batch on), "
            "awaiting_commit (the batch before's writes taken by the producer), awaiting_records "
            "(the next record: the fetch, and the worker's other tasks, which run meanwhile).",
            ["kind"],
        ),
        flush_requests=counter(
            "flush_requests",
            "Flush requests the fold sent to the summarizer, by trigger.",
            ["trigger"],
        ),
        flush_attempts=counter(
            "flush_attempts",
            "Flush attempts finished (one flush-metrics record each), by trigger and outcome.",
            ["trigger", "outcome"],
        ),
        compactions=counter(
            "compactions",
            "Compaction events the fold read, by outcome: applied, ignored (answers nothing "
            "outstanding), ledger (a ledger pass, not the pruning fold's), unreadable.",
            ["outcome"],
        ),
        journal_replays=counter(
            "journal_replays",
            "Journals a crashed worker left behind (outputs maybe unsent) that this one completed.",
        ),
        requests_resent=counter(
            "requests_resent",
            "Outstanding requests a recovered fold worker sent again, by kind: pruning (a "
            "flush), ledger (a pass).",
            ["kind"],
        ),
        records_recovered=counter(
            "state_records_recovered",
            "Changelog records a fold worker read back into its state table in recoveries (at "
            "start and on every assignment): the whole changelog with memory://, what the "
            "local store misses with rocksdb://.",
        ),
        records_fenced=counter(
            "state_records_fenced",
            "Changelog records a recovery left out as the late writes of a worker that had lost "
            "its partitions (a stall past its session timeout): see kafka/fence.py.",
        ),
        dead_letters=counter(
            "dead_letters",
            "Records this worker sent to the dead-letter topic, by kind of fault: undecodable, "
            "newer-schema, key-mismatch, unexpected-kind, invalid-request, fold-error.",
            ["kind"],
        ),
        summarizer_requests=counter(
            "summarizer_requests",
            "Flush requests the summarizer answered, by outcome: answered, error (the model "
            "port raised; answered with an error compaction).",
            ["outcome"],
        ),
        summarizer_batches=counter(
            "summarizer_batches",
            "Batch results in the summarizer's answers, by outcome: summarized, failed, "
            "skipped-trivial, skipped-deduped.",
            ["outcome"],
        ),
        summarizer_duration=Histogram(
            name("summarizer_call_duration_seconds"),
            "Time the model port took to answer one flush request.",
            buckets=DURATION_BUCKETS,
            registry=registry,
        ),
        summarizer_in_progress=Gauge(
            name("summarizer_calls_in_progress"),
            "Model port calls running now.",
            registry=registry,
        ),
        summarizer_tokens=counter(
            "summarizer_tokens",
            "Model tokens the summarizer used, by kind: input, output.",
            ["kind"],
        ),
        summarizer_cost=counter(
            "summarizer_cost_dollars",
            "Model cost the summarizer's port reported, in dollars.",
        ),
        summarizer_model_calls=counter(
            "summarizer_model_calls",
            "Model calls the summarizer's port made (the offline port counts one per batch).",
        ),
    )


# --- scrape-time gauges -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """What the sessions a worker owns add up to right now."""

    sessions: int = 0
    pending_batches: int = 0
    held_events: int = 0
    outstanding_flushes: int = 0
    gaps: Sequence[int] = ()


class FleetCollector(Collector):
    """Gauges and the frontier-gap histogram, computed from the owned sessions at scrape time.

    `fleet` returns None on a worker without fold state (role summarize): those families are
    then left out. `lag` returns unread records per role.
    """

    def __init__(
        self,
        fleet: Callable[[], FleetSnapshot | None],
        lag: Callable[[], Mapping[str, int]],
    ) -> None:
        self._fleet = fleet
        self._lag = lag

    def describe(self) -> Iterator[Metric]:
        """The families, without samples (so registering does not call `collect`)."""
        yield from _fleet_families()
        yield _lag_family()

    def collect(self) -> Iterator[Metric]:
        """The current values."""
        snapshot = self._fleet()
        if snapshot is not None:
            sessions, pending, held, outstanding, gap = _fleet_families()
            sessions.add_metric([], snapshot.sessions)
            pending.add_metric([], snapshot.pending_batches)
            held.add_metric([], snapshot.held_events)
            outstanding.add_metric([], snapshot.outstanding_flushes)
            buckets, total = gap_buckets(snapshot.gaps)
            gap.add_metric([], buckets=buckets, sum_value=total)
            yield from (sessions, pending, held, outstanding, gap)
        lag = _lag_family()
        for role, value in sorted(self._lag().items()):
            lag.add_metric([role], value)
        yield lag


def gap_buckets(gaps: Sequence[int]) -> tuple[list[tuple[str, float]], float]:
    """Cumulative histogram buckets (and the sum) of the sessions' frontier gaps."""
    buckets: list[tuple[str, float]] = []
    for bound in GAP_BUCKETS:
        buckets.append((str(float(bound)), float(sum(1 for g in gaps if g <= bound))))
    buckets.append(("+Inf", float(len(gaps))))
    return buckets, float(sum(gaps))


def _fleet_families() -> tuple[
    GaugeMetricFamily,
    GaugeMetricFamily,
    GaugeMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
]:
    return (
        GaugeMetricFamily(
            f"{PREFIX}_active_sessions",
            "Sessions whose state lives on this worker's partitions (sum over workers: fleet).",
        ),
        GaugeMetricFamily(
            f"{PREFIX}_pending_batches",
            "Captured tool-call batches not flushed yet, over this worker's sessions.",
        ),
        GaugeMetricFamily(
            f"{PREFIX}_held_events",
            "Session events held by the flush barriers, pruning and ledger (their depth).",
        ),
        GaugeMetricFamily(
            f"{PREFIX}_outstanding_flushes",
            "Sessions waiting for the compaction that answers their flush request or ledger pass.",
        ),
        HistogramMetricFamily(
            f"{PREFIX}_frontier_gap_tokens",
            "Frontier gap of each session (reference §9.2), one observation per session.",
        ),
    )


def _lag_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        f"{PREFIX}_consumer_lag_records",
        "Records on this worker's assigned input partitions not read yet, by role.",
        labels=["role"],
    )
