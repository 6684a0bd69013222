"""Claude Code transcripts on the Kafka runtime: a mixed tree (pi sessions and Claude Code
transcripts with their subagents) published once and folded by a worker to exactly the
embedded runtime's state, byte for byte (the state API's JSON against `fold_files`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import unique_topic_prefix
from kafka_workers import (
    WorkerProcess,
    generate_fleet,
    publish_tree,
    wait_converged,
)

from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.publisher import (
    Checkpoints,
    Publisher,
    make_producer,
    publish_paths,
)
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file, session_files
from sessionfold.streams.runtime.embedded import fold_files
from sessionfold.streams.tools.synthetic_claude import write_claude_fleet

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_a_mixed_tree_folds_on_kafka_as_embedded(kafka_bootstrap: str, tmp_path: Path) -> None:
    """pi + Claude Code (4 transcripts, their subagents) published: every entry once, and the
    worker's state of each session equals the embedded fold's; a second publish sends none."""
    root = tmp_path / "tree"
    generate_fleet(root / "pi", 3, 40, seed=5)
    written = write_claude_fleet(root / "claude" / "projects", 4, 40, seed=9)
    assert any("subagents" in str(w.path) for w in written)
    paths = list(session_files([root]))
    envelopes = sum(1 for p in paths for r in read_session_file(p) if not isinstance(r, DeadLetter))
    expected = fold_files(paths)["sessions"]
    assert len(expected) == 3 + len(written)
    prefix = unique_topic_prefix()
    state = tmp_path / "publish.json"
    assert publish_tree(kafka_bootstrap, prefix, 2, [root], state) == envelopes
    producer = make_producer(kafka_bootstrap)
    try:
        again = Publisher(producer, Topics(prefix), Checkpoints.load(state))
        assert publish_paths(again, [root]).published == 0
    finally:
        producer.close()
    worker = WorkerProcess(kafka_bootstrap, prefix, "all", 2, tmp_path).start()
    try:
        worker.wait_web()
        folded = wait_converged([worker], worker.url, expected, timeout=300)
        print(f"\nmixed tree: {len(expected)} sessions, {envelopes} envelopes, {folded:.1f}s")
    finally:
        worker.stop()
