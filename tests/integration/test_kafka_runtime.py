"""The Kafka runtime on the real broker: the same projections as the embedded runtime, through
crashes and rebalances, read back through the state API; metrics that count what was published.

Workers run as subprocesses (`python -m sessionfold.streams.cli worker`), one topic prefix (and
so one Faust app id) per test. The fleet is both real sessions plus 50 generated ones.
"""

from __future__ import annotations

import base64
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import unique_topic_prefix
from kafka import KafkaProducer
from kafka_workers import (
    API_TOKEN,
    WorkerProcess,
    auth,
    canonical,
    generate_fleet,
    metric,
    metric_sum,
    publish_tree,
    wait_converged,
    wait_progress,
)
from typer.testing import CliRunner

from sessionfold.events.envelope import (
    EntryEnvelope,
    EntryPayload,
    LedgerPassEnvelope,
    LedgerRequestEnvelope,
    PruningCompactionEnvelope,
    decode,
    encode,
)
from sessionfold.events.flush import read_compaction
from sessionfold.projections.pruning import index
from sessionfold.streams.cli import app
from sessionfold.streams.kafka import changelog
from sessionfold.streams.kafka.topic_reader import read_topic
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file, session_files
from sessionfold.streams.runtime.embedded import (
    COMPACTION_EVENTS,
    FLUSH_METRICS,
    FLUSH_REQUESTS,
    SESSION_EVENTS,
    EmbeddedRuntime,
    fold_files,
)
from sessionfold.streams.worker.app import Stopwatch
from sessionfold.streams.worker.fault_injection import ENV_TEST_CHANGELOG, ENV_TEST_DELAY

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

DL_SESSION = "dead-letter-test"


@dataclass(frozen=True)
class Embedded:
    """What the embedded runtime makes of the fleet: states, and counts to hold metrics to."""

    states: dict[str, Any]
    runtime: EmbeddedRuntime
    entries: int
    flush_requests: Counter[str]
    ledger_passes: int
    flush_attempts: Counter[tuple[str, str]]
    batch_outcomes: Counter[str]
    model_calls: int


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, shared_sessions: Path) -> Path:
    """Both real sessions and `generate --sessions 50 --turns 60 --seed 3`, in one tree."""
    root = tmp_path_factory.mktemp("kafka-fleet")
    (root / "real").mkdir()
    for name in ("before-compaction.jsonl", "large-session.jsonl"):
        shutil.copy(shared_sessions / name, root / "real" / name)
    generate_fleet(root / "gen", 50, 60, seed=3)
    return root


@pytest.fixture(scope="module")
def embedded(fleet: Path) -> Embedded:
    """`fold_files` on the fleet, and the embedded runtime's logs for the counts."""
    paths = list(session_files([fleet]))
    runtime = EmbeddedRuntime()
    for path in paths:
        for record in read_session_file(path):
            runtime.publish(record)
    attempts = [e.payload for e in runtime.log[FLUSH_METRICS]]
    compactions = [
        read_compaction(e)
        for e in runtime.log[COMPACTION_EVENTS]
        if isinstance(e, PruningCompactionEnvelope)
    ]
    requests = runtime.log[FLUSH_REQUESTS]
    return Embedded(
        states=fold_files(paths)["sessions"],
        runtime=runtime,
        entries=len(runtime.log[SESSION_EVENTS]),
        flush_requests=Counter(e.payload.trigger for e in requests),
        ledger_passes=sum(isinstance(e, LedgerRequestEnvelope) for e in requests),
        flush_attempts=Counter((a.trigger, a.outcome) for a in attempts),
        batch_outcomes=Counter(r.outcome for c in compactions for r in c.results),
        model_calls=sum(c.usage.calls for c in compactions),
    )


def _dead_letter_session(bootstrap: str, prefix: str) -> dict[str, Any]:
    """Publish one session whose header is followed by garbage and a newer-schema envelope;
    return its expected state (the header folded, two dead letters)."""
    header = EntryEnvelope(
        session_id=DL_SESSION,
        seq=1,
        payload=EntryPayload(
            entry={"type": "session", "version": 3, "id": DL_SESSION, "cwd": "/tmp"}, line=1
        ),
    )
    newer = {**header.model_dump(mode="json"), "seq": 2, "schema_version": 99}
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    topic = Topics(prefix).session_events
    key = DL_SESSION.encode()
    for value in (encode(header), b"{this is not json", orjson.dumps(newer)):
        producer.send(topic, key=key, value=value)
    producer.flush()
    producer.close()
    runtime = EmbeddedRuntime()
    runtime.publish(header)
    state = runtime.session_state(DL_SESSION)
    state["dead_letters"] = 2
    return state


def _tool_result_of(runtime: EmbeddedRuntime, session_id: str, ref: str) -> dict[str, Any]:
    """The toolResult message a ref stands for, found through the embedded runtime's index."""
    occurrence = index.resolve_ref(runtime.store, session_id, ref)
    assert occurrence is not None
    record = index.record(runtime.store, session_id, occurrence)
    assert record is not None
    for envelope in runtime.log[SESSION_EVENTS]:
        if envelope.session_id == session_id and envelope.seq == record["seq"]:
            return envelope.payload.entry["message"]
    raise AssertionError("ref's entry not in the log")


def test_one_worker_of_all_roles_equals_embedded(
    kafka_bootstrap: str, fleet: Path, embedded: Embedded, tmp_path: Path
) -> None:
    """One `--role all` worker folds the fleet to exactly `fold_files`'s state; its metrics count
    what was published; refs read the originals back; bad records are dead-lettered."""
    prefix = unique_topic_prefix()
    started = time.monotonic()
    published = publish_tree(kafka_bootstrap, prefix, 2, [fleet], tmp_path / "publish.json")
    assert published == embedded.entries
    dl_state = _dead_letter_session(kafka_bootstrap, prefix)
    expected = {**embedded.states, DL_SESSION: dl_state}
    worker = WorkerProcess(kafka_bootstrap, prefix, "all", 2, tmp_path).start()
    try:
        worker.wait_web()
        folded = wait_converged([worker], worker.url, expected, timeout=300)
        print(
            f"\nrole all: published in {time.monotonic() - started - folded:.1f}s, "
            f"converged {folded:.1f}s after the worker started"
        )

        samples = worker.metrics()
        requests = sum(embedded.flush_requests.values())  # ledger passes included
        flushes = requests - embedded.ledger_passes
        assert embedded.ledger_passes == 2  # before-compaction.jsonl's two pi compactions
        assert metric(samples, "sessionfold_events_folded_total", kind="entry") == published + 1
        assert metric_sum(samples, "sessionfold_events_duplicate_total") == 0
        assert metric_sum(samples, "sessionfold_events_missing_total") == 0
        for trigger, count in embedded.flush_requests.items():
            assert metric(samples, "sessionfold_flush_requests_total", trigger=trigger) == count
        assert metric_sum(samples, "sessionfold_flush_requests_total") == requests
        for (trigger, outcome), count in embedded.flush_attempts.items():
            labels = {"trigger": trigger, "outcome": outcome}
            assert metric(samples, "sessionfold_flush_attempts_total", **labels) == count
        assert metric_sum(samples, "sessionfold_flush_attempts_total") == sum(
            embedded.flush_attempts.values()
        )
        assert metric(samples, "sessionfold_compactions_total", outcome="applied") == flushes
        assert metric(samples, "sessionfold_compactions_total", outcome="ledger") == 2
        assert metric(samples, "sessionfold_compactions_total", outcome="ignored") == 0
        assert metric(samples, "sessionfold_summarizer_requests_total", outcome="answered") == (
            requests
        )
        assert metric(samples, "sessionfold_summarizer_call_duration_seconds_count") == requests
        for outcome, count in embedded.batch_outcomes.items():
            assert metric(samples, "sessionfold_summarizer_batches_total", outcome=outcome) == count
        assert metric(samples, "sessionfold_summarizer_model_calls_total") == embedded.model_calls
        assert metric(samples, "sessionfold_dead_letters_total", kind="undecodable") == 1
        assert metric(samples, "sessionfold_dead_letters_total", kind="newer-schema") == 1
        assert metric(samples, "sessionfold_journal_replays_total") == 0
        agent = {
            kind: metric(samples, "sessionfold_fold_agent_seconds_total", kind=kind)
            for kind in Stopwatch.KINDS
        }
        assert agent["folding"] > 0 and agent["awaiting_records"] > 0
        assert sum(agent.values()) <= time.monotonic() - started  # laps of the agent's clock
        assert metric(samples, "sessionfold_active_sessions") == len(expected)
        pending = sum(s["pending_batches"] for s in expected.values())
        assert metric(samples, "sessionfold_pending_batches") == pending
        assert metric(samples, "sessionfold_held_events") == 0
        assert metric(samples, "sessionfold_outstanding_flushes") == 0
        gaps = [s["metrics"]["frontier_gap_tokens"] for s in expected.values()]
        assert metric(samples, "sessionfold_frontier_gap_tokens_count") == len(gaps)
        assert metric(samples, "sessionfold_frontier_gap_tokens_sum") == sum(gaps)
        assert metric(samples, "sessionfold_consumer_lag_records", role="fold") == 0
        assert metric(samples, "sessionfold_worker_info", role="all") == 1
        assert not any("session" in dict(labels) for _, labels in samples)

        letters = [
            orjson.loads(r.value) for r in read_topic(kafka_bootstrap, f"{prefix}dead-letters")
        ]
        assert sorted(letter["reason"] for letter in letters) == ["newer-schema", "undecodable"]
        assert {letter["session_id"] for letter in letters} == {DL_SESSION}
        assert b"{this is not json" in [base64.b64decode(x["raw_b64"]) for x in letters]

        _check_refs_and_errors(worker.url, embedded)
        _check_state_cli(worker.url, embedded)
    finally:
        worker.stop()


def _check_refs_and_errors(url: str, embedded: Embedded) -> None:
    summarized = [s for s, st in embedded.states.items() if st["stats"]["summaries"] > 0]
    assert summarized
    session_id = summarized[0]
    original = _tool_result_of(embedded.runtime, session_id, "t1")
    response = httpx.get(f"{url}/sessions/{session_id}/refs/t1", timeout=30, headers=auth())
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["content"] == original["content"]
    assert body["tool_call_id"] == original["toolCallId"]
    assert body["location"]["topic"].endswith("session-events")

    flushes = httpx.get(f"{url}/sessions/{session_id}/flushes", timeout=30, headers=auth()).json()
    assert flushes["flush_attempts"] == embedded.states[session_id]["flush_attempts"]
    assert (flushes["outstanding"], flushes["held_events"]) == (None, 0)

    missing = httpx.get(f"{url}/sessions/no-such-session", timeout=30, headers=auth())
    assert missing.status_code == 404
    assert missing.json()["error"] == "unknown session"
    no_ref = httpx.get(f"{url}/sessions/{session_id}/refs/t999999", timeout=30, headers=auth())
    assert (no_ref.status_code, no_ref.json()["error"]) == (404, "unknown ref")


def _check_state_cli(url: str, embedded: Embedded) -> None:
    session_id = next(iter(embedded.states))
    runner = CliRunner(env={"SESSIONFOLD_API_TOKEN": API_TOKEN})
    result = runner.invoke(app, ["state", session_id, "--url", url, "--json"])
    assert result.exit_code == 0, result.output
    assert canonical(orjson.loads(result.stdout)) == canonical(embedded.states[session_id])
    table = runner.invoke(app, ["state", session_id, "--url", url])
    assert table.exit_code == 0 and "pending batches" in table.stdout
    unknown = runner.invoke(app, ["state", "no-such-session", "--url", url])
    assert unknown.exit_code == 1


def test_fold_and_summarize_workers_survive_fold_crashes(
    kafka_bootstrap: str, fleet: Path, embedded: Embedded, tmp_path: Path
) -> None:
    """Two fold workers and a summarize worker fold the fleet to `fold_files`'s state while one
    fold worker is SIGKILLed and restarted three times; every flush request is applied once."""
    prefix = unique_topic_prefix()
    topics = Topics(prefix)
    published = publish_tree(kafka_bootstrap, prefix, 3, [fleet], tmp_path / "publish.json")
    workers = [
        WorkerProcess(kafka_bootstrap, prefix, "fold", 3, tmp_path, name="fold-a"),
        WorkerProcess(kafka_bootstrap, prefix, "fold", 3, tmp_path, name="fold-b"),
        WorkerProcess(kafka_bootstrap, prefix, "summarize", 3, tmp_path, name="summarize"),
    ]
    victim, survivor = workers[0], workers[1]
    started = time.monotonic()
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.wait_web()
        kills = []
        for fraction in (0.2, 0.45, 0.7):
            progress = wait_progress(
                kafka_bootstrap, f"{prefix}worker", topics, published, fraction
            )
            victim.kill()
            kills.append(progress)
            victim.start()
            _wait_working(victim)
        assert min(kills) < published, "the fold finished before the first kill"
        folded = wait_converged(workers, survivor.url, embedded.states, timeout=420)
        print(
            f"\nfold+summarize with {len(kills)} SIGKILLs at committed offsets {kills}: "
            f"converged {time.monotonic() - started:.1f}s after start ({folded:.1f}s after the "
            f"last restart)"
        )
        owned = [metric(w.metrics(), "sessionfold_active_sessions") for w in workers[:2]]
        assert all(n > 0 for n in owned), f"one fold worker owns nothing: {owned}"
        _check_exactly_once(kafka_bootstrap, topics, embedded)
    finally:
        for worker in workers:
            worker.stop()


def test_fold_workers_killed_between_journal_parts_and_in_snapshots_recover(
    kafka_bootstrap: str, fleet: Path, embedded: Embedded, tmp_path: Path
) -> None:
    """The same with changelog records cut at 2 KiB and a snapshot every 3 records
    (kafka/changelog.py): a kill lands between the parts of a journal or in a snapshot, and the
    restarted worker, recovering from those records, still folds to `fold_files`'s state."""
    prefix = unique_topic_prefix()
    topics = Topics(prefix)
    published = publish_tree(kafka_bootstrap, prefix, 3, [fleet], tmp_path / "publish.json")
    small = {ENV_TEST_CHANGELOG: "2048:3:4096"}
    workers = [
        WorkerProcess(kafka_bootstrap, prefix, "fold", 3, tmp_path, name="fold-a", env=small),
        WorkerProcess(kafka_bootstrap, prefix, "summarize", 3, tmp_path, name="summarize"),
    ]
    victim = workers[0]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.wait_web()
        kills = []
        for fraction in (0.3, 0.6):
            kills.append(
                wait_progress(kafka_bootstrap, f"{prefix}worker", topics, published, fraction)
            )
            victim.kill()
            victim.start()
            _wait_working(victim)
        assert min(kills) < published, "the fold finished before the first kill"
        wait_converged(workers, victim.url, embedded.states, timeout=420)
        _check_exactly_once(kafka_bootstrap, topics, embedded)
    finally:
        for worker in workers:
            worker.stop()
    kinds: Counter[str] = Counter()
    for record in read_topic(kafka_bootstrap, f"{prefix}worker-state-changelog"):
        read = changelog.decode_record(record.value)
        assert read is not None, "a changelog record not in the journal format"
        kinds["snapshot" if read.kind == changelog.SNAPSHOT else "journal"] += 1
        kinds["in parts"] += read.parts > 1
    print(f"\nchangelog records with kills at {kills}: {dict(kinds)}")
    assert kinds["snapshot"] > 0 and kinds["in parts"] > 0


def _wait_working(worker: WorkerProcess) -> None:
    """Wait until a restarted worker holds sessions or has folded something, so that the next
    kill hits it working rather than starting up."""
    worker.wait_web()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        samples = worker.metrics()
        busy = metric(samples, "sessionfold_active_sessions") + sum(
            metric_sum(samples, name)
            for name in (
                "sessionfold_events_folded_total",
                "sessionfold_events_duplicate_total",
                "sessionfold_compactions_total",
            )
        )
        if busy > 0:
            return
        time.sleep(0.3)


def _check_exactly_once(bootstrap: str, topics: Topics, embedded: Embedded) -> None:
    """Each request was applied once (state), and answered and recorded on the topics."""
    applied = Counter(
        attempt["request_id"]
        for state in embedded.states.values()
        for attempt in state["flush_attempts"]
    )
    assert max(applied.values()) == 1
    requests, passes = _request_ids(bootstrap, topics.flush_requests)
    answered, pass_results = _request_ids(bootstrap, topics.compaction_events)
    assert requests <= answered
    assert requests <= set(applied)
    # Every ledger pass asked for was answered and closed exactly one span.
    spans = [
        span["request"]
        for state in embedded.states.values()
        if state.get("ledger")
        for span in state["ledger"]["spans"]
    ]
    assert len(spans) == len(set(spans)) == 2
    assert passes == set(spans) <= pass_results
    records: dict[str, list[bytes]] = {}
    for r in read_topic(bootstrap, topics.flush_metrics):
        body = orjson.loads(r.value)
        records.setdefault(body["payload"]["request_id"], []).append(canonical(body))
    assert set(records) == set(applied)
    # At least once on the topic: a crash may send a record again, always the same record.
    assert all(len(set(copies)) == 1 for copies in records.values())
    duplicates = sum(len(copies) - 1 for copies in records.values())
    print(f"flush-metrics records: {len(records)} requests, {duplicates} re-sent copies")


def _request_ids(bootstrap: str, topic: str) -> tuple[set[str], set[str]]:
    """Request ids on a flush-requests or compaction-events topic: pruning, ledger."""
    pruning, ledger = set(), set()
    for record in read_topic(bootstrap, topic):
        envelope = decode(record.value)
        if isinstance(envelope, LedgerRequestEnvelope | LedgerPassEnvelope):
            ledger.add(envelope.payload.request)
        else:
            pruning.add(envelope.payload.request_id)
    return pruning, ledger


def test_summarizer_killed_mid_call_answers_after_restart(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A summarizer SIGKILLed in the middle of a model call leaves the request unanswered; the
    restarted one answers it, and the session ends as the embedded runtime folds it."""
    root = generate_fleet(tmp_path / "sessions", 2, 30, seed=11)
    paths = list(session_files([root]))
    assert not any(isinstance(r, DeadLetter) for p in paths for r in read_session_file(p))
    expected = fold_files(paths)["sessions"]
    prefix = unique_topic_prefix()
    topics = Topics(prefix)
    publish_tree(kafka_bootstrap, prefix, 1, [root], tmp_path / "publish.json")
    fold = WorkerProcess(kafka_bootstrap, prefix, "fold", 1, tmp_path)
    summarize = WorkerProcess(kafka_bootstrap, prefix, "summarize", 1, tmp_path)
    try:
        fold.start()
        summarize.start(env={ENV_TEST_DELAY: "300"})
        fold.wait_web()
        summarize.wait_web()
        deadline = time.monotonic() + 120
        while metric(summarize.metrics(), "sessionfold_summarizer_calls_in_progress") < 1:
            assert time.monotonic() < deadline, summarize.log_tail()
            time.sleep(0.3)
        summarize.kill()
        assert list(read_topic(kafka_bootstrap, topics.compaction_events)) == []
        first = next(iter(read_topic(kafka_bootstrap, topics.flush_requests)))
        request_id = orjson.loads(first.value)["payload"]["request_id"]
        summarize.start()
        wait_converged([fold, summarize], fold.url, expected, timeout=180)
        answers = [
            orjson.loads(r.value)["payload"]["request_id"]
            for r in read_topic(kafka_bootstrap, topics.compaction_events)
        ]
        assert request_id in answers
    finally:
        fold.stop()
        summarize.stop()
