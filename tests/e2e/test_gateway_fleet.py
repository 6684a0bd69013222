"""The real Claude Code CLI pointed at a Kafka fold worker's gateway (docs/live.md, "Fleet"): its
transcripts are published by `sessionfold publish --follow`, the worker folds them, and the
worker's gateway rewrites the calls with the plan of the session's owner. Three prompts, each
reading a large output: the last request reaches the scripted model with the fold's stubs for
the summarized results (the text `sessionfold context` computes for the file) and the others as
the agent sent them; every prompt finishes; the plan cache got 304s. The same for the real
Codex CLI (Responses).

Needs `npm ci` in integrations/agents and the real broker.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from agent_clis import CLAUDE, CODEX, claude_env, codex_env, run_claude, run_codex
from conftest import unique_topic_prefix
from kafka_workers import WorkerProcess, auth, metric, quiet
from scripted_models import AnthropicModel, Call, ResponsesModel
from serve_process import CLI
from test_gateway_clis import (
    TOKEN,
    _assert_stubbed_as_planned,
    _codex_through,
    _outputs_sent,
    _reading_script,
    _results_sent,
)

from sessionfold.streams.kafka.topics import Topics, ensure_topics
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file

pytestmark = [
    pytest.mark.skipif(
        not (CLAUDE.exists() and CODEX.exists()),
        reason="integrations/agents has no node_modules: run npm ci there",
    ),
    pytest.mark.kafka,
    pytest.mark.slow,
]

READY_TIMEOUT_S = 240.0


def _settled(worker: WorkerProcess, transcript: Path, session: str) -> None:
    """Until the worker folded the whole transcript as it is now (publish --follow polls it)
    and nothing is outstanding."""
    lines = len(transcript.read_bytes().splitlines())
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        answer = httpx.get(f"{worker.url}/sessions/{session}", headers=auth(TOKEN), timeout=30)
        if answer.status_code == 200 and quiet([worker], 1):
            time.sleep(1.0)  # one more poll of the publisher: nothing new may follow
            if len(transcript.read_bytes().splitlines()) == lines and quiet([worker], 1):
                return
        time.sleep(0.5)
    raise AssertionError(f"the worker never settled\n{worker.log_tail()}")


def _follow(bootstrap: str, prefix: str, root: Path, tmp_path: Path) -> subprocess.Popen[bytes]:
    """`sessionfold publish ROOT --follow` on the test's topics."""
    publish = [*CLI, "publish", str(root), "--follow", "--bootstrap", bootstrap]
    publish += ["--topic-prefix", prefix, "--state-file", str(tmp_path / "publish.json")]
    return subprocess.Popen(publish, stderr=subprocess.PIPE)


@contextmanager
def _worker_fed_by(
    root: Path, upstream: dict[str, str], tmp_path: Path, bootstrap: str
) -> Iterator[WorkerProcess]:
    """A fold worker (role all, the test's API token; no grace turns, no minimum freed, so its
    gateway stubs at once) on fresh topics, fed by `publish ROOT --follow`; `upstream`: the
    gateway's upstream variable. The publisher must end without a traceback."""
    (tmp_path / "pruning.toml").write_text("recoveryGraceTurns = 0\n")
    prefix = unique_topic_prefix()
    ensure_topics(bootstrap, Topics(prefix), 1)
    env = {
        **upstream,
        "SESSIONFOLD_MIN_FREED_TOKENS": "0",
        "SESSIONFOLD_CONFIG": str(tmp_path / "pruning.toml"),
    }
    worker = WorkerProcess(bootstrap, prefix, "all", 1, tmp_path, env=env, api_token=TOKEN)
    follow = _follow(bootstrap, prefix, root, tmp_path)
    try:
        worker.start().wait_web(READY_TIMEOUT_S)
        yield worker
    finally:
        follow.terminate()
        _, err = follow.communicate(timeout=60)
        worker.stop()
    assert b"Traceback" not in err


def test_claude_code_gets_the_folds_stubs_through_a_workers_gateway(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    projects = home / ".claude" / "projects"
    projects.mkdir(parents=True)
    calls = [Call(f"toolu_0{n}big", "Bash", {"command": f"seq {n} 3000"}) for n in range(1, 4)]
    with AnthropicModel(_reading_script(calls)) as model:
        upstream = {"SESSIONFOLD_ANTHROPIC_UPSTREAM": model.url}
        with _worker_fed_by(projects, upstream, tmp_path, kafka_bootstrap) as worker:
            agent = claude_env(home, worker.url)
            agent["ANTHROPIC_CUSTOM_HEADERS"] = f"X-Sessionfold-Token: {TOKEN}"
            session = run_claude(work, agent, "read the first")["session_id"]
            transcript = next(projects.glob(f"*/{session}.jsonl"))
            for prompt in ("read the second", "read the third"):
                _settled(worker, transcript, session)
                run_claude(work, agent, prompt, "--resume", session)
            samples = worker.metrics()
        assert model.unscripted == [] and model.pending()["turn"] == 0
        turns = model.of_kind("turn")
    stubbed = _assert_stubbed_as_planned(transcript, turns, calls, _results_sent)
    assert any("**Summarized tool refs**" in text for text in stubbed.values())  # the summary
    answers = "sessionfold_gateway_plan_answers_total"
    assert metric(samples, answers, answer="full") >= 1
    assert metric(samples, answers, answer="unchanged") >= 1  # a turn's calls share a plan
    assert b"sk-scripted" not in worker.log_path.read_bytes()


def test_codex_gets_the_folds_stubs_through_a_workers_gateway(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    """As for Claude Code: three prompts of one Codex session (`codex exec resume --last`)
    through the worker's gateway; the last request carries the fold's stubs."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    sessions = home / ".codex" / "sessions"
    sessions.mkdir(parents=True)
    calls = [Call(f"call_{n}big", "exec_command", {"cmd": f"seq {n} 3000"}) for n in range(1, 4)]
    with ResponsesModel(_reading_script(calls)) as model:
        upstream = {"SESSIONFOLD_OPENAI_UPSTREAM": model.url}
        with _worker_fed_by(sessions, upstream, tmp_path, kafka_bootstrap) as worker:
            _codex_through(home, worker.url)
            agent = codex_env(home)
            run_codex(work, agent, "read the first")
            (rollout,) = sessions.glob("*/*/*/rollout-*.jsonl")
            session = next(
                str(r.session_id)
                for r in read_session_file(rollout)
                if not isinstance(r, DeadLetter)
            )
            for prompt in ("read the second", "read the third"):
                _settled(worker, rollout, session)
                run_codex(work, agent, "resume", "--last", prompt)
            samples = worker.metrics()
        assert model.unscripted == [] and model.pending()["turn"] == 0
        turns = model.of_kind("turn")
    _assert_stubbed_as_planned(rollout, turns, calls, _outputs_sent)
    answers = "sessionfold_gateway_plan_answers_total"
    assert metric(samples, answers, answer="full") >= 1
    assert metric(samples, answers, answer="unchanged") >= 1
    assert b"Bearer scripted" not in worker.log_path.read_bytes()
