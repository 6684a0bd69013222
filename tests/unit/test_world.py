"""World snapshots: the five read-only git commands, and the publisher sending them."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from kafka import KafkaProducer
from kafka.future import Future

from sessionfold.events.envelope import EntryEnvelope, WorldEnvelope, decode
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.publisher import Checkpoints, Publisher, publish_paths
from sessionfold.streams.publishing.world import PATH_CAP, world_facts

GIT_ID = ["-c", "user.name=Test", "-c", "user.email=test@example.invalid"]
GIT_ID += ["-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false"]


def _git(repo: Path, *args: str) -> str:
    """Run git in `repo` as the test's own tool (not under test), returning its stdout."""
    done = subprocess.run(
        ["git", *GIT_ID, *args], cwd=repo, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _repo(path: Path, commit: bool = True) -> Path:
    """A fresh repository at `path`, with one committed file unless `commit` is false."""
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q")
    if commit:
        (path / "a.txt").write_text("a\n")
        _git(path, "add", "a.txt")
        _git(path, "commit", "-q", "-m", "first")
    return path.resolve()


# --- world_facts ------------------------------------------------------------------------


def test_clean_repo(tmp_path: Path) -> None:
    """A clean repository: root, branch, short head, and empty path lists."""
    repo = _repo(tmp_path / "r")
    assert world_facts(repo) == {
        "root": str(repo),
        "branch": "main",
        "head": _git(repo, "rev-parse", "--short", "HEAD"),
        "staged": [],
        "staged_count": 0,
        "untracked": [],
        "untracked_count": 0,
    }


def test_staged_and_untracked(tmp_path: Path) -> None:
    """Staged and untracked paths are listed; ignored ones are not."""
    repo = _repo(tmp_path / "r")
    (repo / ".gitignore").write_text("*.log\n")
    _git(repo, "add", ".gitignore")
    _git(repo, "commit", "-q", "-m", "ignore")
    (repo / "b.txt").write_text("b\n")
    (repo / "a.txt").write_text("changed\n")
    _git(repo, "add", "b.txt", "a.txt")
    (repo / "c.txt").write_text("c\n")
    (repo / "d.log").write_text("d\n")
    facts = world_facts(repo)
    assert facts is not None
    assert (facts["staged"], facts["staged_count"]) == (["a.txt", "b.txt"], 2)
    assert (facts["untracked"], facts["untracked_count"]) == (["c.txt"], 1)


def test_path_lists_are_capped(tmp_path: Path) -> None:
    """A long list keeps its first paths; the count keeps the full number."""
    repo = _repo(tmp_path / "r")
    for n in range(PATH_CAP + 5):
        (repo / f"u{n:02}.txt").write_text("u\n")
    facts = world_facts(repo)
    assert facts is not None
    assert len(facts["untracked"]) == PATH_CAP
    assert facts["untracked_count"] == PATH_CAP + 5


def test_subdirectory_reports_the_whole_repository(tmp_path: Path) -> None:
    """Taken in a subdirectory, the facts cover the repository with paths from its top."""
    repo = _repo(tmp_path / "r")
    (repo / "sub").mkdir()
    (repo / "top.txt").write_text("t\n")
    facts = world_facts(repo / "sub")
    assert facts is not None
    assert facts["root"] == str(repo)
    assert facts["untracked"] == ["top.txt"]


def test_detached_head(tmp_path: Path) -> None:
    """A detached HEAD has no branch fact, but its head."""
    repo = _repo(tmp_path / "r")
    _git(repo, "checkout", "-q", "--detach")
    facts = world_facts(repo)
    assert facts is not None
    assert "branch" not in facts
    assert facts["head"] == _git(repo, "rev-parse", "--short", "HEAD")


def test_repo_without_commits(tmp_path: Path) -> None:
    """Before the first commit: the unborn branch, no head, no staged list, untracked files."""
    repo = _repo(tmp_path / "r", commit=False)
    (repo / "new.txt").write_text("n\n")
    facts = world_facts(repo)
    assert facts == {
        "root": str(repo),
        "branch": "main",
        "untracked": ["new.txt"],
        "untracked_count": 1,
    }


def test_not_a_repository(tmp_path: Path) -> None:
    """A plain directory gives no facts."""
    plain = tmp_path / "plain"
    plain.mkdir()
    assert world_facts(plain) is None


def test_missing_directory(tmp_path: Path) -> None:
    """A directory that does not exist gives no facts and no error."""
    assert world_facts(tmp_path / "gone") is None


def test_git_not_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without git on PATH there are no facts, and no error."""
    repo = _repo(tmp_path / "r")
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert world_facts(repo) is None


def _marker_script(path: Path, marker: Path) -> Path:
    """An executable that creates `marker` and passes its stdin through (a filter's job)."""
    path.write_text(f"#!/bin/sh\ntouch '{marker}'\ncat\n")
    path.chmod(0o755)
    return path


def test_runs_nothing_the_repository_configures(tmp_path: Path) -> None:
    """An fsmonitor hook, a clean filter and a pager configured in the repo never run."""
    repo = _repo(tmp_path / "r")
    markers = tmp_path / "markers"
    markers.mkdir()
    fsmonitor = _marker_script(tmp_path / "fsmonitor.sh", markers / "fsmonitor")
    clean = _marker_script(tmp_path / "clean.sh", markers / "clean")
    pager = _marker_script(tmp_path / "pager.sh", markers / "pager")
    _git(repo, "config", "core.fsmonitor", str(fsmonitor))
    _git(repo, "config", "filter.x.clean", str(clean))
    _git(repo, "config", "core.pager", str(pager))
    (repo / ".gitattributes").write_text("* filter=x\n")
    (repo / "a.txt").touch()  # a tracked file with new stat data: status would re-read it
    facts = world_facts(repo)
    assert facts is not None and facts["branch"] == "main"
    assert list(markers.iterdir()) == []
    # The traps were armed: an ordinary status springs them.
    subprocess.run(["git", "status"], cwd=repo, capture_output=True, check=False)
    assert {p.name for p in markers.iterdir()} >= {"fsmonitor", "clean"}


def test_no_lazy_fetch_through_a_configured_transport(tmp_path: Path) -> None:
    """A partial clone whose promisor remote is a command transport does not run it."""
    source = _repo(tmp_path / "src")
    (source / "d").mkdir()
    (source / "d" / "f.txt").write_text("f\n")
    _git(source, "add", "d")
    _git(source, "commit", "-q", "-m", "tree")
    _git(source, "config", "uploadpack.allowFilter", "true")
    url = f"file://{source}"
    _git(tmp_path, "clone", "-q", "--no-checkout", "--filter=tree:0", url, "clone")
    clone = (tmp_path / "clone").resolve()
    marker = tmp_path / "fetched"
    _git(clone, "config", "protocol.ext.allow", "always")
    _git(clone, "config", "remote.origin.url", f"ext::sh -c touch% {marker}")
    facts = world_facts(clone)
    assert facts is not None and "staged" not in facts  # HEAD's tree is not local
    assert not marker.exists()
    plain = ["git", "diff-index", "--cached", "--name-only", "HEAD"]
    subprocess.run(plain, cwd=clone, capture_output=True, check=False)
    assert marker.exists()  # the trap was armed


# --- the publisher --------------------------------------------------------------------------


class FakeProducer:
    """Records what a KafkaProducer would have sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    def send(self, topic: str, key: bytes, value: bytes) -> Future:
        """Remember one record; it is acknowledged at once (no offsets)."""
        self.sent.append((topic, key, value))
        return Future().success(None)

    def flush(self) -> None:
        """Nothing is in flight."""

    def envelopes(self, topic: str) -> list[Any]:
        """The decoded envelopes sent to `topic`, in order, checking each key."""
        out = []
        for sent_topic, key, value in self.sent:
            if sent_topic == topic:
                envelope = decode(value)
                assert key == envelope.session_id.encode()
                out.append(envelope)
        return out


SID = "s-world-1"
TOPICS = Topics("t.")


def _label(n: int) -> bytes:
    """One session line: a label entry."""
    entry = {"type": "label", "id": f"l{n}", "parentId": None, "targetId": "x", "label": "x"}
    return orjson.dumps(entry) + b"\n"


def _session(path: Path, cwd: str, labels: int) -> Path:
    """A small v3 session file: its header (with `cwd`) and `labels` label entries."""
    header = {"type": "session", "version": 3, "id": SID, "cwd": cwd}
    path.write_bytes(orjson.dumps(header) + b"\n" + b"".join(_label(n) for n in range(labels)))
    return path


def _append(path: Path, start: int, count: int) -> None:
    """Append label lines, as pi does while a session goes on."""
    with path.open("ab") as handle:
        handle.write(b"".join(_label(n) for n in range(start, start + count)))


class Clock:
    """A hand-moved monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _publisher(
    tmp_path: Path, producer: FakeProducer, **options: Any
) -> tuple[Publisher, Callable[[], list[Any]]]:
    """A Publisher on the fake producer, and a way to read back its session events."""
    checkpoints = Checkpoints(tmp_path / "state.json")
    publisher = Publisher(cast(KafkaProducer, producer), TOPICS, checkpoints, **options)
    return publisher, lambda: producer.envelopes(TOPICS.session_events)


def test_world_follows_the_entries_with_the_last_seq(tmp_path: Path) -> None:
    """The snapshot comes after the entries, keyed by session, with the last entry's seq."""
    repo = _repo(tmp_path / "r")
    path = _session(tmp_path / "s.jsonl", str(repo), labels=2)
    publisher, sent = _publisher(tmp_path, FakeProducer())
    counts = publish_paths(publisher, [path])
    envelopes = sent()
    assert [type(e) for e in envelopes] == [EntryEnvelope] * 3 + [WorldEnvelope]
    assert [e.seq for e in envelopes] == [1, 2, 3, 3]
    world = envelopes[-1]
    assert world.session_id == SID
    assert world.payload.facts == world_facts(repo)
    assert (counts.published, counts.world) == (3, 1)
    assert counts.line() == "published 3, skipped 0, dead-lettered 0 (1 files), world snapshots 1"


def test_no_world_for_an_old_transcript(tmp_path: Path) -> None:
    """A file last written long ago gets no snapshot: today's workspace is not its World."""
    repo = _repo(tmp_path / "r")
    path = _session(tmp_path / "s.jsonl", str(repo), labels=2)
    old = time.time() - 2 * 3600
    os.utime(path, (old, old))
    publisher, sent = _publisher(tmp_path, FakeProducer())
    counts = publish_paths(publisher, [path])
    assert all(isinstance(e, EntryEnvelope) for e in sent()) and counts.world == 0


def test_no_world_when_disabled(tmp_path: Path) -> None:
    """With world=False only the entries go out, and the count line has no world part."""
    repo = _repo(tmp_path / "r")
    path = _session(tmp_path / "s.jsonl", str(repo), labels=2)
    publisher, sent = _publisher(tmp_path, FakeProducer(), world=False)
    counts = publish_paths(publisher, [path])
    assert all(isinstance(e, EntryEnvelope) for e in sent())
    assert counts.line() == "published 3, skipped 0, dead-lettered 0 (1 files)"


@pytest.mark.parametrize("cwd", ["/no/such/directory/anywhere", "relative/dir", "plain"])
def test_no_world_without_a_repository(tmp_path: Path, cwd: str) -> None:
    """A cwd that is missing, relative or no repository: no snapshot, no error."""
    (tmp_path / "plain").mkdir()
    if cwd == "plain":
        cwd = str(tmp_path / "plain")
    path = _session(tmp_path / "s.jsonl", cwd, labels=1)
    publisher, sent = _publisher(tmp_path, FakeProducer())
    counts = publish_paths(publisher, [path])
    assert len(sent()) == 2 and all(isinstance(e, EntryEnvelope) for e in sent())
    assert counts.world == 0


def test_follow_sends_again_only_when_the_facts_change(tmp_path: Path) -> None:
    """New lines bring a new snapshot only when the facts differ from the last one sent."""
    repo = _repo(tmp_path / "r")
    path = _session(tmp_path / "s.jsonl", str(repo), labels=1)
    clock = Clock()
    publisher, sent = _publisher(tmp_path, FakeProducer(), world_interval_s=10.0, clock=clock)
    publisher.publish_file(path, final=False)
    assert [e.kind for e in sent()] == ["entry", "entry", "world"]

    _append(path, 1, 1)
    clock.now += 11
    publisher.publish_file(path, final=False, first_visit=False)
    assert [e.kind for e in sent()[3:]] == ["entry"]  # same facts: nothing new to say

    _append(path, 2, 1)
    (repo / "new.txt").write_text("n\n")
    clock.now += 11
    publisher.publish_file(path, final=False, first_visit=False)
    world = sent()[-1]
    assert isinstance(world, WorldEnvelope) and world.seq == 4
    assert world.payload.facts["untracked"] == ["new.txt"]
    assert publisher.counts.world == 2


def test_follow_waits_out_the_interval_then_sends_what_is_owed(tmp_path: Path) -> None:
    """Within the interval no snapshot; the next call after it sends the owed one."""
    repo = _repo(tmp_path / "r")
    path = _session(tmp_path / "s.jsonl", str(repo), labels=1)
    clock = Clock()
    publisher, sent = _publisher(tmp_path, FakeProducer(), world_interval_s=10.0, clock=clock)
    publisher.publish_file(path, final=False)
    _append(path, 1, 2)
    (repo / "new.txt").write_text("n\n")
    clock.now += 1
    publisher.publish_file(path, final=False, first_visit=False)
    assert [e.kind for e in sent()] == ["entry", "entry", "world", "entry", "entry"]

    clock.now += 10
    publisher.publish_file(path, final=False, first_visit=False)  # no new lines
    world = sent()[-1]
    assert isinstance(world, WorldEnvelope) and world.seq == 4
    assert world.payload.facts["untracked"] == ["new.txt"]
    publisher.publish_file(path, final=False, first_visit=False)
    assert publisher.counts.world == 2  # nothing owed any more


def test_resumed_run_reads_the_header_again(tmp_path: Path) -> None:
    """A run that starts past the header still finds the session's cwd."""
    repo = _repo(tmp_path / "r")
    path = _session(tmp_path / "s.jsonl", str(repo), labels=1)
    first, _ = _publisher(tmp_path, FakeProducer())
    publish_paths(first, [path])
    _append(path, 1, 2)
    second, sent = _publisher(tmp_path, FakeProducer())
    second.checkpoints = first.checkpoints
    counts = publish_paths(second, [path])
    assert [(e.kind, e.seq) for e in sent()] == [("entry", 3), ("entry", 4), ("world", 4)]
    assert counts.line().startswith("published 2, skipped 2, dead-lettered 0 (1 files)")
