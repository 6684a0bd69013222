"""Publishing to the real broker: exactly once, in order, resumable, restart-proof."""

from __future__ import annotations

import shutil
import threading
import time
from collections import defaultdict
from pathlib import Path
from uuid import uuid4

import orjson
import pytest
from kafka_workers import generate_fleet
from typer.testing import CliRunner

from sessionfold.events.envelope import EntryEnvelope, PlaceholderEnvelope, decode
from sessionfold.streams.cli import app
from sessionfold.streams.kafka.topic_reader import read_topic
from sessionfold.streams.kafka.topics import Topics, ensure_topics
from sessionfold.streams.publishing.publisher import (
    Checkpoints,
    Publisher,
    make_producer,
    publish_paths,
)
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file, session_files

pytestmark = pytest.mark.kafka


def _expected(paths: list[Path]) -> tuple[dict[str, list[int]], int]:
    """Sequence numbers per session, and the dead-letter count, read straight from the files."""
    seqs: dict[str, list[int]] = defaultdict(list)
    letters = 0
    for path in session_files(paths):
        for record in read_session_file(path):
            if isinstance(record, DeadLetter):
                letters += 1
            else:
                seqs[record.session_id].append(record.seq)
    return dict(seqs), letters


def _published(bootstrap: str, topics: Topics) -> dict[str, list[int]]:
    """Sequence numbers per session as they arrive on the topic, in partition order."""
    seqs: dict[str, list[int]] = defaultdict(list)
    for record in read_topic(bootstrap, topics.session_events):
        envelope = decode(record.value)
        assert isinstance(envelope, EntryEnvelope | PlaceholderEnvelope)
        assert record.key == envelope.session_id.encode()
        seqs[envelope.session_id].append(envelope.seq)
    return dict(seqs)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, shared_sessions: Path) -> Path:
    """Both real sessions and a generated fleet of 100 sessions in one directory tree."""
    root = tmp_path_factory.mktemp("fleet")
    (root / "real").mkdir()
    for name in ("before-compaction.jsonl", "large-session.jsonl"):
        shutil.copy(shared_sessions / name, root / "real" / name)
    generate_fleet(root / "gen", 100, 40, seed=7)
    return root


def test_publish_fleet_exactly_once_in_order(
    kafka_bootstrap: str, fleet: Path, tmp_path: Path
) -> None:
    """Every envelope arrives once, in per-session order; a re-run publishes nothing."""
    prefix = f"t{uuid4().hex[:8]}."
    state = tmp_path / "state.json"
    args = ["publish", str(fleet), "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]
    args += ["--partitions", "3", "--state-file", str(state)]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    expected, letters = _expected([fleet])
    total = sum(len(v) for v in expected.values())
    assert f"published {total}, skipped 0, dead-lettered {letters}" in first.stdout
    assert len(expected) == 102
    assert _published(kafka_bootstrap, Topics(prefix)) == expected

    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "published 0," in second.stdout
    assert _published(kafka_bootstrap, Topics(prefix)) == expected


def test_follow_publishes_appended_lines(
    kafka_bootstrap: str, shared_sessions: Path, tmp_path: Path
) -> None:
    """With follow, lines appended to a file after the start are published too."""
    source = (shared_sessions / "large-session.jsonl").read_bytes().splitlines(keepends=True)
    path = tmp_path / "live" / "s.jsonl"
    path.parent.mkdir()
    path.write_bytes(b"".join(source[:10]))
    topics = Topics(f"t{uuid4().hex[:8]}.")
    ensure_topics(kafka_bootstrap, topics, partitions=1)
    producer = make_producer(kafka_bootstrap)
    publisher = Publisher(producer, topics, Checkpoints(tmp_path / "state.json"))
    stop = threading.Event()
    worker = threading.Thread(
        target=publish_paths,
        args=(publisher, [path.parent]),
        kwargs={"follow": True, "poll_seconds": 0.1, "should_stop": stop.is_set},
    )
    worker.start()
    try:
        with path.open("ab") as handle:
            handle.write(b"".join(source[10:30]))
            handle.write(source[30][:15])  # a line still being written
            handle.flush()
            time.sleep(0.5)
            handle.write(source[30][15:])
        deadline = time.monotonic() + 30
        while publisher.counts.published < 31 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        worker.join(30)
        producer.close()
    seqs = _published(kafka_bootstrap, topics)
    assert list(seqs.values()) == [list(range(1, 32))]


@pytest.mark.slow
def test_broker_restart_mid_publish_loses_nothing(fleet: Path, tmp_path: Path) -> None:
    """Stopping and restarting the broker in the middle of a publish loses and doubles nothing."""
    from sessionfold.streams.tools import broker

    config = broker.BrokerConfig(port=broker.free_port_pair(), data_dir=tmp_path / "kafka")
    broker.up(config)
    try:
        bootstrap = config.bootstrap
        topics = Topics(f"t{uuid4().hex[:8]}.")
        ensure_topics(bootstrap, topics, partitions=2)
        producer = make_producer(bootstrap)
        publisher = Publisher(producer, topics, Checkpoints(tmp_path / "state.json"))
        failure: list[BaseException] = []

        def run() -> None:
            try:
                publish_paths(publisher, [fleet])
            except BaseException as exc:  # surfaced to the test thread below
                failure.append(exc)

        worker = threading.Thread(target=run)
        worker.start()
        deadline = time.monotonic() + 60
        while publisher.counts.published < 2000 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.is_alive(), "publish finished before the restart: make the fleet bigger"
        broker.stop(config)
        broker.up(config)
        worker.join(240)
        producer.close()
        assert not failure, repr(failure)
        expected, _letters = _expected([fleet])
        assert _published(bootstrap, topics) == expected
    finally:
        broker.stop(config)


def test_dead_letters_reach_their_topic(kafka_bootstrap: str, tmp_path: Path) -> None:
    """An unreadable line goes to the dead-letter topic with its place, cause and bytes."""
    import base64

    import orjson

    header = b'{"type":"session","version":3,"id":"dl-1"}'
    good = b'{"type":"label","id":"a","parentId":null,"targetId":"a","label":"x"}'
    path = tmp_path / "d.jsonl"
    path.write_bytes(header + b"\n" + b"{broken\n" + good + b"\n")
    prefix = f"t{uuid4().hex[:8]}."
    args = ["publish", str(path), "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]
    result = CliRunner().invoke(app, [*args, "--state-file", str(tmp_path / "s.json")])
    assert result.exit_code == 0, result.output
    assert "published 3, skipped 0, dead-lettered 1" in result.stdout  # header, gap, label
    letters = [
        orjson.loads(r.value) for r in read_topic(kafka_bootstrap, Topics(prefix).dead_letters)
    ]
    assert len(letters) == 1
    letter = letters[0]
    assert (letter["line"], letter["session_id"], letter["size"]) == (2, "dl-1", 7)
    assert base64.b64decode(letter["raw_b64"]) == b"{broken"
    events = [decode(r.value) for r in read_topic(kafka_bootstrap, Topics(prefix).session_events)]
    assert [(e.kind.value, e.seq) for e in events] == [
        ("entry", 1),
        ("placeholder", 2),
        ("entry", 3),
    ]
    assert events[1].payload.id is None and events[1].payload.line == 2


def test_an_array_where_a_type_is_named_is_a_dead_letter(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """An entry `type`, message `role` or block `type` that is an array or object is a dead
    letter with a placeholder; publish goes on to the next file of the tree (it stopped there)."""
    head = b'{"type":"session","version":3,"id":"%s"}'
    user = b'{"type":"message","id":"a1","parentId":null,"message":{"role":"user","content":"hi"}}'
    bad = [
        b'{"type":[],"id":"a2","parentId":"a1","timestamp":"2025-01-01T00:00:02.000Z"}',
        b'{"type":"message","id":"a3","parentId":"a2","message":{"role":{},"content":"hi"}}',
        b'{"type":"message","id":"a4","parentId":"a3","message":{"role":"user",'
        b'"content":[{"type":["text"],"text":"hi"}]}}',
    ]
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "a.jsonl").write_bytes(b"\n".join([head % b"tag-a", user, *bad]) + b"\n")
    (tmp_path / "tree" / "b.jsonl").write_bytes(b"\n".join([head % b"tag-b", user]) + b"\n")
    prefix = f"t{uuid4().hex[:8]}."
    args = ["publish", str(tmp_path / "tree"), "--bootstrap", kafka_bootstrap]
    result = CliRunner().invoke(
        app, [*args, "--topic-prefix", prefix, "--state-file", str(tmp_path / "s.json")]
    )
    assert result.exit_code == 0, result.output
    assert "published 7, skipped 0, dead-lettered 3" in result.stdout
    assert _published(kafka_bootstrap, Topics(prefix)) == {
        "tag-a": [1, 2, 3, 4, 5],
        "tag-b": [1, 2],
    }


def test_entry_whose_envelope_outgrows_the_topics(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A line under 16 MiB whose envelope would pass 17 MiB: its dead letter reaches the
    dead-letter topic and a placeholder takes its seq, so session-events has no gap and holds
    exactly what the embedded runtime folds."""
    import base64

    from damaged_sessions import outgrowing_line

    from sessionfold.streams.publishing.session_file import DEAD_LETTER_RAW_BYTES

    header = b'{"type":"session","version":3,"id":"big-1"}'
    big = outgrowing_line("b", "a")
    lines = [header, _label("a", None), big, _label("c", "b")]
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    prefix = f"t{uuid4().hex[:8]}."
    args = ["publish", str(path), "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]
    result = CliRunner().invoke(app, [*args, "--state-file", str(tmp_path / "s.json")])
    assert result.exit_code == 0, result.output
    assert "published 4, skipped 0, dead-lettered 1" in result.stdout
    topics = Topics(prefix)
    events = [decode(r.value) for r in read_topic(kafka_bootstrap, topics.session_events)]
    events = [e for e in events if e.kind.value != "world"]  # a snapshot takes no seq
    assert [(e.kind.value, e.seq) for e in events] == [
        ("entry", 1),
        ("entry", 2),
        ("placeholder", 3),
        ("entry", 4),
    ]
    assert events == [r for r in read_session_file(path) if not isinstance(r, DeadLetter)]
    letters = [orjson.loads(r.value) for r in read_topic(kafka_bootstrap, topics.dead_letters)]
    assert [(x["line"], x["error"], x["size"]) for x in letters] == [(3, "EntryTooLarge", len(big))]
    assert base64.b64decode(letters[0]["raw_b64"]) == big[:DEAD_LETTER_RAW_BYTES]


def _label(entry_id: str, parent: str | None) -> bytes:
    entry = {"type": "label", "id": entry_id, "parentId": parent, "targetId": "a", "label": "x"}
    return orjson.dumps(entry)


def test_limits_bom_deep_and_long_lines(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A BOM, a line nested too deep and one over the cap: the good lines go out numbered in
    order, the bad ones to the dead-letter topic, and a resumed run starts at the right byte."""
    import base64

    import orjson

    from sessionfold.streams.publishing.session_file import BOM, RAW_PREFIX_BYTES

    monkeypatch.setenv("SESSIONFOLD_MAX_LINE_BYTES", "300")
    header = b'{"type":"session","version":3,"id":"lim-1"}'

    def label(n: int) -> bytes:
        return orjson.dumps(
            {"type": "label", "id": f"l{n}", "parentId": None, "targetId": "a", "label": "x"}
        )

    deep = b"[" * 140 + b"]" * 140  # under the cap, past the nesting limit
    long = orjson.dumps({"type": "custom", "customType": "big", "data": "z" * 1000})
    path = tmp_path / "lim.jsonl"
    path.write_bytes(BOM + header + b"\n" + deep + b"\n" + long + b"\n" + label(1) + b"\n")
    prefix = f"t{uuid4().hex[:8]}."
    args = ["publish", str(path), "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]
    args += ["--state-file", str(tmp_path / "s.json"), "--no-world"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "published 4, skipped 0, dead-lettered 2" in first.stdout  # 2 placeholders
    with path.open("ab") as handle:
        handle.write(label(2) + b"\n")
    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "published 1, skipped 4, dead-lettered 0" in second.stdout
    topics = Topics(prefix)
    assert _published(kafka_bootstrap, topics) == {"lim-1": [1, 2, 3, 4, 5]}
    letters = [orjson.loads(r.value) for r in read_topic(kafka_bootstrap, topics.dead_letters)]
    by_line = {letter["line"]: letter for letter in letters}
    assert by_line[2]["reason"] == "nested too deep"
    assert by_line[3]["reason"] == "line too long" and by_line[3]["size"] == len(long)
    raw = base64.b64decode(by_line[3]["raw_b64"])
    assert long.startswith(raw) and 0 < len(raw) <= RAW_PREFIX_BYTES
