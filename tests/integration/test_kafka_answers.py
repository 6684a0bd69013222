"""A slow model delays only the session it answers, on the real broker: the summarizer answers
several flush requests at once (`--answer-threads`, worker/answers.py). A real local HTTP model
holds session A's answer; session B's flush is answered meanwhile, its compaction on the topic
while A's is still held; released, both sessions end as the embedded runtime's, byte for byte.
Answered one at a time (as before), B's request waited behind A's held answer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import unique_topic_prefix
from fake_openai import FakeOpenAI, Reply, Request
from kafka_workers import WorkerProcess, generate_fleet, publish_tree, wait_converged

from sessionfold.events.envelope import PruningCompactionEnvelope, decode
from sessionfold.ports.summarizer_http import summarizer_for
from sessionfold.streams.kafka.topic_reader import read_topic
from sessionfold.streams.kafka.topics import Topics, ensure_topics
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file, session_files
from sessionfold.streams.runtime.config_files import load_config
from sessionfold.streams.runtime.embedded import EmbeddedRuntime

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: Longest the model holds A's answer (the test releases it sooner; without the fix it must
#: still end).
HOLD_S = 90.0
#: How long B's compaction may take to arrive while A's answer is held.
B_WAIT_S = 40.0


class _Holding:
    """The model's answers: once armed, the first request waits for `release`; every other one
    is a summary at once, which depends on the prompt only (so both runtimes get the same)."""

    def __init__(self) -> None:
        self.armed = False
        self.release = threading.Event()
        self.held = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, request: Request) -> Reply:
        with self._lock:
            hold, self.armed = self.armed, False
        if hold:
            self.held.set()
            self.release.wait(HOLD_S)
        return Reply(text=f"- summary of {len(request.prompt)} prompt characters", usage=(400, 30))


@pytest.fixture
def holding() -> Iterator[tuple[_Holding, FakeOpenAI]]:
    """A real HTTP model server that holds the first answer asked once armed."""
    responder = _Holding()
    with FakeOpenAI(default=responder) as server:
        yield responder, server
        responder.release.set()


def _session_id(root: Path) -> str:
    [path] = list(session_files([root]))
    record = next(iter(read_session_file(path)))
    assert not isinstance(record, DeadLetter)
    return record.session_id


def _compacted(bootstrap: str, topics: Topics) -> set[str]:
    """Sessions a pruning compaction was sent for."""
    sessions = set()
    for record in read_topic(bootstrap, topics.compaction_events):
        envelope = decode(record.value)
        if isinstance(envelope, PruningCompactionEnvelope):
            sessions.add(envelope.session_id)
    return sessions


def test_a_held_answer_does_not_hold_another_sessions_flush(
    kafka_bootstrap: str, tmp_path: Path, holding: tuple[_Holding, FakeOpenAI]
) -> None:
    """Session A's first flush is with the model, which holds it; session B, published then,
    gets its compaction while A's answer is still held (one worker, one partition: B's record
    comes after A's, so it is answered past a record not yet acknowledged). Released, A and B
    converge to the embedded runtime's state against the same model."""
    responder, server = holding
    a_root = generate_fleet(tmp_path / "a", 1, 30, seed=5)
    b_root = generate_fleet(tmp_path / "b", 1, 30, seed=7)
    a_id, b_id = _session_id(a_root), _session_id(b_root)
    assert a_id != b_id
    config_path = tmp_path / "pruning.toml"
    # An idle timeout past the hold: A's answer is slow, not failed.
    config_path.write_text('summarizerModel = "vllm/held"\nsummarizerIdleTimeoutMs = 300000\n')
    env = {"SESSIONFOLD_MODEL_BASE_URL": server.base_url}
    prefix = unique_topic_prefix()
    topics = Topics(prefix)
    ensure_topics(kafka_bootstrap, topics, 1)
    worker = WorkerProcess(
        kafka_bootstrap,
        prefix,
        "all",
        1,
        tmp_path,
        env={**env, "SESSIONFOLD_CONFIG": str(config_path)},
    )
    try:
        worker.start()
        worker.wait_web()
        responder.armed = True
        publish_tree(kafka_bootstrap, prefix, 1, [a_root], tmp_path / "a.json")
        assert responder.held.wait(120), f"A's flush never reached the model\n{worker.log_tail()}"
        publish_tree(kafka_bootstrap, prefix, 1, [b_root], tmp_path / "b.json")
        deadline = time.monotonic() + B_WAIT_S
        compacted: set[str] = set()
        while b_id not in compacted and time.monotonic() < deadline:
            time.sleep(0.5)
            compacted = _compacted(kafka_bootstrap, topics)
        assert not responder.release.is_set()
        assert b_id in compacted, f"B's flush waited behind A's held answer\n{worker.log_tail()}"
        assert a_id not in compacted
        responder.release.set()
        config = load_config(config_path, [])
        embedded = EmbeddedRuntime(config, summarizer=summarizer_for(config, env=env))
        for path in session_files([a_root, b_root]):
            for record in read_session_file(path):
                assert not isinstance(record, DeadLetter)
                embedded.publish(record)
        expected = {sid: embedded.session_state(sid, 0) for sid in embedded.sessions()}
        assert set(expected) == {a_id, b_id}
        wait_converged([worker], worker.url, expected, timeout=180)
    finally:
        responder.release.set()
        worker.stop()
