"""Other agents' files on the Kafka runtime: a mixed tree (pi sessions, Claude Code transcripts
with their subagents, Codex rollouts) published once, and a Codex rollout published as it grows
(stopped inside lines and responses, each run a new publisher from the checkpoints), folded by a
worker to exactly the embedded runtime's state of the whole files, byte for byte (the state
API's JSON against `fold_files`)."""

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
from sessionfold.streams.tools.synthetic_codex import write_codex_fleet

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _publish_growing(bootstrap: str, prefix: str, path: Path, data: bytes, state: Path) -> int:
    """`data` published as `publish --follow` would while it is written: the file grown to
    each cut (inside a line, inside a response), each run a new publisher from the checkpoint
    file; then the whole file, read to its end. Envelopes published."""
    published = 0
    cuts = [len(data) * k // 7 + 13 for k in range(1, 7)]
    for cut in [*cuts, len(data)]:
        path.write_bytes(data[:cut])
        producer = make_producer(bootstrap)
        try:
            publisher = Publisher(producer, Topics(prefix), Checkpoints.load(state), world=False)
            publisher.publish_file(path, final=cut == len(data))
            publisher.drain()  # a run ends so (publish_paths): acknowledged, checkpointed
            published += publisher.counts.published
        finally:
            producer.close()
    return published


def test_a_mixed_tree_folds_on_kafka_as_embedded(kafka_bootstrap: str, tmp_path: Path) -> None:
    """pi + Claude Code (4 transcripts, their subagents) + Codex (3 rollouts, and one published
    as it grows): every entry once, and the worker's state of each session equals the embedded
    fold's of the whole files; a second publish sends none."""
    root = tmp_path / "tree"
    generate_fleet(root / "pi", 3, 40, seed=5)
    written = write_claude_fleet(root / "claude" / "projects", 4, 40, seed=9)
    assert any("subagents" in str(w.path) for w in written)
    rollouts = write_codex_fleet(root / "codex" / "sessions", 4, 30, seed=13)
    growing = rollouts.pop().path
    data = growing.read_bytes()
    live = tmp_path / "live" / growing.name
    live.parent.mkdir()
    growing.unlink()
    live.write_bytes(data)
    paths = [*session_files([root]), live]
    envelopes = sum(1 for p in paths for r in read_session_file(p) if not isinstance(r, DeadLetter))
    expected = fold_files(paths)["sessions"]
    assert len(expected) == 3 + len(written) + len(rollouts) + 1
    live.write_bytes(b"")
    prefix = unique_topic_prefix()
    state = tmp_path / "publish.json"
    sent = publish_tree(kafka_bootstrap, prefix, 2, [root], state)
    sent += _publish_growing(kafka_bootstrap, prefix, live, data, state)
    assert sent == envelopes
    producer = make_producer(kafka_bootstrap)
    try:
        again = Publisher(producer, Topics(prefix), Checkpoints.load(state))
        assert publish_paths(again, [root, live]).published == 0
    finally:
        producer.close()
    worker = WorkerProcess(kafka_bootstrap, prefix, "all", 2, tmp_path).start()
    try:
        worker.wait_web()
        folded = wait_converged([worker], worker.url, expected, timeout=300)
        print(f"\nmixed tree: {len(expected)} sessions, {envelopes} envelopes, {folded:.1f}s")
    finally:
        worker.stop()
