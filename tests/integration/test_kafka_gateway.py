"""The gateway on the Kafka workers (docs/live.md, "Fleet"), on the real broker: generated Claude
Code transcripts and a Codex rollout are published to session-events and folded by two `--role
all` workers (two partitions: each owns one), and `sessionfold serve` tails the same files.
They are published as `publish --follow` reads them (a transcript's last response waits for the
line after it, as serve's tailer waits).

- every session's plan route answers on each worker (the owner's answer, proxied to the other)
  the bytes serve's plan route answers;
- a Messages request (Claude Code's) and a Responses request (Codex's) built from each
  transcript, posted to either worker's gateway, reach the scripted upstream as the same bytes
  serve's gateway sends for the same file, rewritten (results stubbed);
- the same call again costs the plan route a 304, not the plan (the plan cache's counts; a
  call whose plan missed the 250 ms on the loaded machine is counted, and made again);
- with the session's owner frozen, the other worker's gateway sends the call unchanged (the
  plan does not come within the gateway's 250 ms: `plan-timeout`, counted).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from conftest import unique_topic_prefix
from kafka_workers import (
    API_TOKEN,
    WorkerProcess,
    auth,
    metric,
    parse_metrics,
    quiet,
)
from scripted_models import AnthropicModel, ResponsesModel, ScriptedModel, Turn
from serve_process import serving

from sessionfold.streams.kafka.topics import Topics, ensure_topics, partition_of
from sessionfold.streams.publishing.publisher import Checkpoints, Publisher, make_producer
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file, session_files
from sessionfold.streams.tools.synthetic_claude import (
    generate_claude_session,
    write_claude_session,
)
from sessionfold.streams.tools.synthetic_codex import generate_codex_session, write_codex_session

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

READY_TIMEOUT_S = 300.0
PARTITIONS = 2
TURNS = 60
PLAN_ANSWERS = "sessionfold_gateway_plan_answers_total"


def _session_id(path: Path) -> str:
    for record in read_session_file(path):
        if not isinstance(record, DeadLetter):
            return str(record.session_id)
    raise AssertionError(f"{path} holds no session")


def _claude_body(path: Path) -> bytes:
    """A Messages request of the transcript's conversation (its main chain's messages)."""
    messages = []
    for line in path.read_bytes().splitlines():
        entry = orjson.loads(line)
        message = entry.get("message")
        main = entry.get("type") in ("user", "assistant") and not entry.get("isSidechain")
        if main and isinstance(message, dict):
            messages.append({"role": message["role"], "content": message["content"]})
    body = {"model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": True}
    return orjson.dumps({**body, "messages": messages})


def _codex_body(path: Path, session_id: str) -> bytes:
    """A Responses request of the rollout's items, keyed to its session as Codex keys it."""
    items = [
        line["payload"]
        for line in map(orjson.loads, path.read_bytes().splitlines())
        if line.get("type") == "response_item"
    ]
    body = {"model": "gpt-5", "stream": True, "prompt_cache_key": session_id}
    return orjson.dumps({**body, "input": items})


def _post(url: str, path: str, body: bytes, session_id: str) -> None:
    """One model call through a gateway, its whole answer read."""
    headers = {
        "content-type": "application/json",
        "x-sessionfold-token": API_TOKEN,
        "x-claude-code-session-id": session_id,
        "x-api-key": "sk-scripted",
        "authorization": "Bearer scripted",
    }
    if path != "/v1/messages":
        del headers["x-claude-code-session-id"]  # Codex's session is the body's cache key
    answer = httpx.post(f"{url}{path}", content=body, headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text


def _sent(model: ScriptedModel, url: str, path: str, body: bytes, session_id: str) -> bytes:
    """The bytes the upstream got for one call through the gateway at `url`."""
    before = len(model.requests)
    model.add(Turn(text="ok"))
    _post(url, path, body, session_id)
    assert len(model.requests) == before + 1
    return model.requests[-1].raw


def _rewritten(
    model: ScriptedModel,
    url: str,
    route: str,
    body: bytes,
    session_id: str,
) -> bytes:
    """The bytes the upstream got for the first call the gateway at `url` rewrote. On a loaded
    machine a plan may miss the gateway's 250 ms: that call goes unchanged (counted
    `plan-timeout`, checked here) and is made again."""
    for _attempt in range(10):
        timeouts = _timeouts(url)
        sent = _sent(model, url, route, body, session_id)
        if sent != body:
            return sent
        assert _timeouts(url) > timeouts, "a call went unchanged, not for the plan's time"
    raise AssertionError("the gateway never rewrote the call")


def _timeouts(url: str) -> float:
    samples = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
    return metric(samples, "sessionfold_gateway_unchanged_total", reason="plan-timeout")


def _plan(url: str, session_id: str, timeout: float = 60) -> bytes | None:
    answer = httpx.get(f"{url}/sessions/{session_id}/plan", headers=auth(), timeout=timeout)
    return answer.content if answer.status_code == 200 else None


def _claude_sessions(root: Path, count: int = 3) -> None:
    """`count` generated transcripts whose sessions fall on both partitions."""
    found: dict[int, list[Path]] = {}
    for seed in range(1, 40):
        path = write_claude_session(root / f"c{seed}", generate_claude_session(seed, TURNS))[0].path
        part = partition_of(_session_id(path), PARTITIONS)
        last = sum(map(len, found.values())) == count - 1
        if last and part in found and len(found) < PARTITIONS:
            shutil.rmtree(root / f"c{seed}")  # the last one must cover the other partition
            continue
        found.setdefault(part, []).append(path)
        if sum(map(len, found.values())) == count:
            return
    raise AssertionError("no seeds put sessions on every partition")


def _publish_following(bootstrap: str, prefix: str, root: Path, state: Path) -> None:
    """One pass of `sessionfold publish --follow ROOT`: each file read as a growing one, so a
    transcript's last response waits for the line after it, as serve's tailer waits."""
    topics = Topics(prefix)
    ensure_topics(bootstrap, topics, PARTITIONS)
    producer = make_producer(bootstrap)
    try:
        publisher = Publisher(producer, topics, Checkpoints(state))
        for path in session_files([root]):
            publisher.publish_file(path, False, True, [])
        publisher.drain()
    finally:
        producer.close()


@pytest.fixture
def fleet(
    kafka_bootstrap: str, tmp_path: Path
) -> Iterator[tuple[list[WorkerProcess], AnthropicModel, ResponsesModel, str, Path]]:
    """The published files, two workers and serve on them, the scripted upstreams."""
    root = tmp_path / "sessions"
    _claude_sessions(root / "claude")
    write_codex_session(root / "codex", generate_codex_session(7, TURNS))
    prefix = unique_topic_prefix()
    _publish_following(kafka_bootstrap, prefix, root, tmp_path / "publish.json")
    sessions = {_session_id(p) for p in session_files([root])}
    with AnthropicModel() as anthropic, ResponsesModel() as responses:
        env = {
            "SESSIONFOLD_ANTHROPIC_UPSTREAM": anthropic.url,
            "SESSIONFOLD_OPENAI_UPSTREAM": responses.url,
        }
        workers = [
            WorkerProcess(kafka_bootstrap, prefix, "all", PARTITIONS, tmp_path, f"w{n}", env)
            for n in (1, 2)
        ]
        args = ["--anthropic-upstream", anthropic.url, "--openai-upstream", responses.url]
        try:
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.wait_web(READY_TIMEOUT_S)
            with serving(root, API_TOKEN, args=args) as serve:
                _wait_quiet(workers, len(sessions))
                yield workers, anthropic, responses, serve.url, root
                serve.stop()
        finally:
            for worker in workers:
                worker.resume()
                worker.stop()


def _wait_quiet(workers: list[WorkerProcess], sessions: int) -> None:
    """Until the workers hold every session, nothing is outstanding, and each owns some."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            owned = [metric(w.metrics(), "sessionfold_active_sessions") for w in workers]
            if quiet(workers, sessions) and all(owned):
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    tails = "\n".join(f"--- {w.name}\n{w.log_tail(25)}" for w in workers)
    raise AssertionError(f"the workers never settled\n{tails}")


def _wait_same_plan(workers: list[WorkerProcess], serve_url: str, session_id: str) -> bytes:
    """Until every worker's plan route answers serve's plan of the session (serve tails the
    files at its own pace); that plan."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    plans: list[bytes | None] = []
    while time.monotonic() < deadline:
        served = _plan(serve_url, session_id)
        plans = [_plan(w.url, session_id) for w in workers]
        if served is not None and orjson.loads(served)["known"] and plans == [served] * 2:
            return served
        time.sleep(0.5)
    raise AssertionError(f"plans differ: {plans}")


def _answers(worker: WorkerProcess) -> dict[str, float]:
    samples = worker.metrics()
    return {kind: metric(samples, PLAN_ANSWERS, answer=kind) for kind in ("full", "unchanged")}


def test_a_workers_gateway_sends_what_serves_does_and_fails_open_without_the_owner(
    fleet: tuple[list[WorkerProcess], AnthropicModel, ResponsesModel, str, Path],
) -> None:
    workers, anthropic, responses, serve_url, root = fleet
    calls: list[tuple[ScriptedModel, str, bytes, str]] = []
    for path in sorted((root / "claude").rglob("*.jsonl")):
        if "subagents" not in path.parts:
            calls.append((anthropic, "/v1/messages", _claude_body(path), _session_id(path)))
    (rollout,) = (root / "codex").glob("*.jsonl")
    codex_session = _session_id(rollout)
    calls.append((responses, "/v1/responses", _codex_body(rollout, codex_session), codex_session))

    rewritten = 0
    for model, route, body, session_id in calls:
        plan = orjson.loads(_wait_same_plan(workers, serve_url, session_id))
        if plan["results"]:
            expected = _rewritten(model, serve_url, route, body, session_id)
            rewritten += 1
        else:  # nothing stubbed yet: the call goes as it came, from serve as from the workers
            expected = _sent(model, serve_url, route, body, session_id)
            assert expected == body
        for worker in workers:  # one owns the session, the other asks the owner
            before = _answers(worker)
            for _call in range(2):
                if plan["results"]:
                    assert _rewritten(model, worker.url, route, body, session_id) == expected
                else:
                    assert _sent(model, worker.url, route, body, session_id) == expected
            after = _answers(worker)
            # the first plan this worker got was sent whole, every one after it was a 304
            assert after["full"] - before["full"] == 1, (worker.name, before, after)
            assert after["unchanged"] - before["unchanged"] >= 1, (worker.name, before, after)
    assert rewritten >= 2 and calls[-1][1] == "/v1/responses"
    assert plan["results"]  # the Codex session's, rewritten as Claude Code's are

    # The owner of a session frozen: the other worker's gateway passes the call unchanged.
    frozen, asking = workers
    frozen.pause()
    try:
        owned_by_frozen = []
        for model, route, body, session_id in calls:
            try:
                _plan(asking.url, session_id, timeout=2)
            except httpx.TimeoutException:
                owned_by_frozen.append((model, route, body, session_id))
                break  # within the owner's session timeout: no rebalance yet
        assert owned_by_frozen, "the frozen worker owned none of the sessions"
        model, route, body, session_id = owned_by_frozen[0]
        assert _sent(model, asking.url, route, body, session_id) == body
    finally:
        frozen.resume()
    samples = asking.metrics()
    failed_open = sum(
        metric(samples, "sessionfold_gateway_unchanged_total", reason=reason)
        for reason in ("plan-timeout", "plan-unavailable")  # the latter if a rebalance began
    )
    assert failed_open >= 1
