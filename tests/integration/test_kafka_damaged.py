"""Damaged session files through the real Kafka path: `sessionfold publish` (a subprocess), one
`--role all` worker, the state API, `sessionfold replay` from the topics (to the end, and to
points at dead lines), and the dead-letter topic, each equal to what the embedded runtime makes
of the same files.

The fleet is one damaged file per mutation of the fuzz suite (tests/damaged_sessions.py), over
generated v3, v2 and v1 sessions and windows of the two real (v1) sessions, plus a few damages
the fuzz suite has no oracle for (an entry without `parentId`, valid or not). Every file is read
under a small `SESSIONFOLD_MAX_LINE_BYTES`, set for the publish subprocess and for the embedded
read alike, so a huge line is dead-lettered as too long in both.
"""

from __future__ import annotations

import base64
import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import unique_topic_prefix
from damaged_sessions import CORPORA, MUTATIONS, SHARED, Case, Corpus, write_case
from kafka_workers import (
    WorkerProcess,
    canonical,
    metric,
    metric_sum,
    wait_converged,
)
from typer.testing import CliRunner

from sessionfold.events.envelope import EntryEnvelope, PlaceholderEnvelope
from sessionfold.streams.cli import app
from sessionfold.streams.kafka.topic_reader import read_topic
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.session_file import MAX_LINE_ENV, DeadLetter, read_session_file
from sessionfold.streams.runtime.embedded import fold_files
from sessionfold.streams.tools.replay import Point, replay_files, replay_topic
from sessionfold.streams.tools.synthetic import dumps_entry

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: The reader's line cap for this fleet: huge_garbage's 3 MB line is over it, the rest under.
MAX_LINE = 1_000_000
PARTITIONS = 2


def _without_parent(rng: random.Random, corpus: Corpus) -> Case:
    """A valid v3 entry with no `parentId`: a root, as in pi's getTree."""
    objects = [dict(o) for o in corpus.objects]
    del objects[rng.randrange(2, len(objects))]["parentId"]
    return Case([dumps_entry(o).encode() for o in objects])


def _invalid_without_parent(rng: random.Random, corpus: Corpus) -> Case:
    """A schema-invalid entry (readable id) with no `parentId`: hangs under the one before."""
    objects = [dict(o) for o in corpus.objects]
    entry = objects[rng.randrange(2, len(objects))]
    del entry["parentId"]
    entry["timestamp"] = [1]
    return Case([dumps_entry(o).encode() for o in objects])


def _before_header(rng: random.Random, corpus: Corpus) -> Case:
    """Lines before the session header: dead letters of no session (keyed by the file)."""
    return Case([b"not a header", b'{"type":"message"}', *corpus.lines()])


#: (corpus, mutation) pairs of the fleet: every damage the reader knows, v1, v2 and v3.
FLEET: list[tuple[str, str]] = [
    ("gen-v3", "truncated"),
    ("gen-v3", "invalid_utf8"),
    ("gen-v3", "wrong_type"),
    ("gen-v3", "missing_id"),
    ("gen-v3", "duplicate_id"),
    ("gen-v3", "two_objects"),
    ("gen-v3", "bom"),
    ("gen-v3", "deep_array"),
    ("gen-v3", "huge_garbage"),
    ("gen-v3", "not_an_object"),
    ("gen-v3", "unknown_type"),
    ("gen-v3", "parent_cycle"),
    ("gen-v3", "non_finite"),
    ("gen-v3", "lone_surrogate"),
    ("gen-v2", "deep_field"),
    ("gen-v2", "duplicate_id"),
    ("gen-v2", "crlf"),
    ("gen-v1", "truncated"),
    ("gen-v1", "missing_id"),
    ("gen-v1", "nul_byte"),
    ("gen-v1", "blank_lines"),
    ("gen-v1", "lone_surrogate"),
    ("real-before", "wrong_type"),
    ("real-large", "invalid_utf8"),
]

EXTRA: dict[str, Callable[[random.Random, Corpus], Case]] = {
    "without_parent": _without_parent,
    "invalid_without_parent": _invalid_without_parent,
    "before_header": _before_header,
}
FLEET += [("gen-v3", name) for name in EXTRA]


@dataclass(frozen=True)
class Expected:
    """What the embedded runtime makes of the fleet."""

    paths: list[Path]
    records: list[Any]
    fold: dict[str, Any]
    replay: dict[str, Any]

    def count(self, kind: type) -> int:
        """How many records of one kind the reader gave."""
        return sum(isinstance(r, kind) for r in self.records)

    def letters(self) -> list[DeadLetter]:
        """The reader's dead letters, in file order."""
        return [r for r in self.records if isinstance(r, DeadLetter)]


def _damaged_files(root: Path) -> Iterator[Path]:
    for n, (corpus_name, name) in enumerate(FLEET):
        rng = random.Random(f"kafka-damaged/{corpus_name}/{name}")
        corpus = CORPORA[corpus_name](rng)
        case = (EXTRA.get(name) or MUTATIONS[name])(rng, corpus)
        directory = root / f"{n:02d}-{corpus_name}-{name}"
        directory.mkdir()
        yield write_case(directory, case.damaged, case)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One damaged file per (corpus, mutation) of FLEET, each in its own directory."""
    if not SHARED.is_dir():
        pytest.skip(f"real sessions not found at {SHARED}")
    root = tmp_path_factory.mktemp("kafka-damaged")
    paths = list(_damaged_files(root))
    assert len(paths) == len(FLEET)
    return root


@pytest.fixture(scope="module")
def expected(fleet: Path) -> Iterator[Expected]:
    """The reader's records, `fold_files` and the replay of the files, under MAX_LINE."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(MAX_LINE_ENV, str(MAX_LINE))
        paths = sorted(fleet.rglob("*.jsonl"))
        records = [r for path in paths for r in read_session_file(path)]
        yield Expected(paths, records, fold_files(paths), replay_files(paths).result())


def _publish(bootstrap: str, prefix: str, root: Path, state: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "sessionfold.streams.cli", "publish", str(root)]
    command += ["--bootstrap", bootstrap, "--topic-prefix", prefix, "--no-world"]
    command += ["--partitions", str(PARTITIONS), "--state-file", str(state)]
    env = {**os.environ, MAX_LINE_ENV: str(MAX_LINE)}
    return subprocess.run(command, capture_output=True, env=env, timeout=180, check=False)


def _letter_facts(letter: dict[str, Any]) -> tuple[Any, ...]:
    keys = ("source", "session_id", "line", "error", "reason", "size")
    return (*[letter.get(k) for k in keys], base64.b64decode(letter["raw_b64"]))


def _reader_facts(letter: DeadLetter) -> tuple[Any, ...]:
    described = letter.describe()
    keys = ("source", "session_id", "line", "error", "reason", "size")
    return (*[described[k] for k in keys], letter.raw)


def test_damaged_fleet_on_kafka_equals_embedded(
    kafka_bootstrap: str, fleet: Path, expected: Expected, tmp_path: Path
) -> None:
    """publish → worker → state API, replay and the dead-letter topic all give the embedded
    runtime's result for the damaged fleet; the worker's metrics count what was published."""
    sessions = expected.fold["sessions"]
    assert len(sessions) == len(FLEET)  # one session per file: the corpora's ids are distinct
    letters = expected.letters()
    assert expected.fold["dead_letters"] == 2  # before the header
    errors = Counter(letter.error for letter in letters)
    for error in ("JSONDecodeError", "UnicodeDecodeError", "EntryError", "DuplicateId"):
        assert errors[error] >= 1, errors
    assert errors["DepthError"] == 2
    assert errors["LineTooLong"] == 1
    assert any(p.payload.previous for p in expected.records if isinstance(p, PlaceholderEnvelope))

    prefix = unique_topic_prefix()
    done = _publish(kafka_bootstrap, prefix, fleet, tmp_path / "publish.json")
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 0, stderr
    assert "Traceback" not in stderr
    entries = expected.count(EntryEnvelope)
    places = expected.count(PlaceholderEnvelope)
    assert done.stdout.decode().strip() == (
        f"published {entries + places}, skipped 0, dead-lettered {len(letters)} "
        f"({len(FLEET)} files)"
    )

    on_topic = [orjson.loads(r.value) for r in read_topic(kafka_bootstrap, f"{prefix}dead-letters")]
    assert sorted(map(_letter_facts, on_topic), key=repr) == sorted(
        map(_reader_facts, letters), key=repr
    )

    worker = WorkerProcess(kafka_bootstrap, prefix, "all", PARTITIONS, tmp_path).start()
    try:
        worker.wait_web()
        wait_converged([worker], worker.url, sessions, timeout=150)
        samples = worker.metrics()
        assert metric(samples, "sessionfold_events_folded_total", kind="entry") == entries
        assert metric(samples, "sessionfold_events_folded_total", kind="placeholder") == places
        assert metric_sum(samples, "sessionfold_events_folded_total") == entries + places
        assert metric_sum(samples, "sessionfold_events_duplicate_total") == 0
        assert metric_sum(samples, "sessionfold_dead_letters_total") == 0  # none of its own
        assert metric(samples, "sessionfold_active_sessions") == len(sessions)
        assert metric(samples, "sessionfold_consumer_lag_records", role="fold") == 0
    finally:
        worker.stop()
    log = worker.log_path.read_text(errors="replace")
    assert "Traceback" not in log, worker.log_tail()

    args = ["replay", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix, "--json"]
    replayed = CliRunner().invoke(app, args)
    assert replayed.exit_code == 0, replayed.output
    assert canonical(orjson.loads(replayed.stdout)) == canonical(expected.replay)
    assert canonical(expected.replay) == canonical(expected.fold)
    _check_points_at_dead_lines(kafka_bootstrap, prefix, expected)


def _check_points_at_dead_lines(bootstrap: str, prefix: str, expected: Expected) -> None:
    """--until-seq at each session's first placeholder and just before it: the topics' replay
    counts the same dead letters as the files' (the letter's line decides, not its order)."""
    firsts: dict[str, int] = {}
    for record in expected.records:
        if isinstance(record, PlaceholderEnvelope):
            firsts.setdefault(record.session_id, record.seq)
    assert len(firsts) >= 10
    for session_id, seq in firsts.items():
        for point in (Point("seq", seq), Point("seq", seq - 1)):
            files = replay_files(expected.paths, sessions=[session_id], point=point)
            topics = replay_topic(bootstrap, Topics(prefix), sessions=[session_id], point=point)
            assert canonical(topics.result()) == canonical(files.result()), (session_id, point)
