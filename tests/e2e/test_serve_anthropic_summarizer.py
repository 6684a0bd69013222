"""`sessionfold serve` with its summarizer on the Anthropic Messages API, end to end, the
Messages API a scripted server on 127.0.0.1:

- a real pi session file (from ../shared, copied to a temporary folder: serve keeps its answers
  beside it) folded by a serve process whose `summarizerModel` is `anthropic/claude-haiku-4-5`
  and whose `ANTHROPIC_BASE_URL` names the scripted server: the batch summaries in serve's
  context answer are the scripted model's text;
- the real Claude Code CLI through serve's gateway (its own `ANTHROPIC_BASE_URL` is serve, its
  model another scripted server), serve's summarizer on the scripted Messages server
  (`SESSIONFOLD_MODEL_BASE_URL`): the stubs Claude Code's model gets carry that model's
  summaries.

Every request the summarizer's server got is a valid streamed Messages request carrying the key
from serve's environment (never the agent's), and serve's log holds neither key nor text.
"""

from __future__ import annotations

import itertools
import json
import shutil
import time
from pathlib import Path

import httpx
import pydantic
import pytest
from agent_clis import CLAUDE, claude_env, run_claude
from anthropic.types.message_create_params import MessageCreateParamsStreaming
from fake_anthropic import FakeMessages, Reply, Request
from scripted_models import AnthropicModel, Call, Turn, Usage
from serve_process import serving

from sessionfold.events.migration import v1_entry_id
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.streams.cli.context import view_from_replay
from sessionfold.streams.tools.replay import Collector, replay_files

TOKEN = "t" * 32
KEY = "sk-ant-e2e-SECRET-0123456789"
MARK = "SCRIPTED-HAIKU-SUMMARY"
FOOTER = "Summarized tool refs"


def _pi_array(path: Path, session_id: str) -> list[dict[str, object]]:
    """The array pi sends at the file's end: its context, nothing pruned."""
    collector = Collector(session_id)
    replayer = replay_files([path], DEFAULT_CONFIG, [session_id], on_folded=collector)
    return view_from_replay(replayer, collector, DEFAULT_CONFIG).unpruned


@pytest.mark.slow
def test_serve_summarizes_with_the_anthropic_provider(
    shared_sessions: Path, tmp_path: Path
) -> None:
    """The context answer's batch summaries are the scripted Messages model's; its requests
    are Messages requests with the environment's key; serve's log holds neither key nor text."""
    watched = tmp_path / "sessions"
    watched.mkdir()
    path = watched / "large-session.jsonl"
    shutil.copyfile(shared_sessions / "large-session.jsonl", path)  # written now: live
    lines = path.read_bytes().splitlines()
    session_id = json.loads(lines[0])["id"]
    leaf = v1_entry_id(session_id, len(lines) - 1)
    pi_array = _pi_array(path, session_id)
    numbers = itertools.count(1)

    def reply(request: Request) -> Reply:
        return Reply(text=f"{MARK}-{next(numbers)}: what the batch did.", usage=(900, 40, 0, 0))

    env = {
        "ANTHROPIC_BASE_URL": "",
        "ANTHROPIC_API_KEY": KEY,
        "SESSIONFOLD_MODEL_BASE_URL": "",
        "SESSIONFOLD_MODEL_API_KEY": "",
        "OPENAI_API_KEY": "sk-openai-not-for-anthropic",
    }
    args = ["--set", "summarizerModel=anthropic/claude-haiku-4-5", "--live-within", "3600"]
    with FakeMessages(default=reply) as model:
        env["ANTHROPIC_BASE_URL"] = model.base_url
        with serving(watched, TOKEN, args=args, env=env) as serve:
            body = {"leaf": leaf, "messages": pi_array, "wait_ms": 120_000}
            answer = httpx.post(
                f"{serve.url}/sessions/{session_id}/context",
                json=body,
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=180,
            ).json()
            err = serve.stop().decode()
        requests = list(model.requests)
    assert answer["stale"] is False and answer["changed"] is True, answer.get("reason")
    summaries = [json.dumps(m) for m in answer["messages"] if FOOTER in json.dumps(m)]
    assert summaries, "the answer carries batch summaries"
    for summary in summaries:
        assert MARK in summary  # the model's text, never the offline summarizer's
    answered = {int(s.split(f"{MARK}-")[1].split(":")[0]) for s in summaries}
    assert answered <= set(range(1, len(requests) + 1))
    _assert_messages_requests(requests)
    assert KEY not in err and MARK not in err


def _assert_messages_requests(requests: list[Request]) -> None:
    """Valid streamed Messages requests for the haiku model, with the environment's key."""
    assert requests
    for request in requests:
        assert request.path == "/v1/messages"
        assert request.headers["x-api-key"] == KEY
        assert request.headers["anthropic-version"] == "2023-06-01"
        assert "authorization" not in request.headers
        pydantic.TypeAdapter(MessageCreateParamsStreaming).validate_python(request.body)
        assert request.body["model"] == "claude-haiku-4-5"


def _summarized(url: str, session: str, call: str, timeout_s: float = 30.0) -> None:
    """Wait until serve's rewrite plan for the session holds `call`'s summary."""
    deadline = time.monotonic() + timeout_s
    while True:
        plan = httpx.get(
            f"{url}/sessions/{session}/plan", headers={"Authorization": f"Bearer {TOKEN}"}
        ).json()
        if call in (plan.get("results") or {}):
            return
        assert time.monotonic() < deadline, f"{call} was not summarized"
        time.sleep(0.1)


def _results_sent(body: dict[str, object]) -> dict[str, str]:
    """tool_use id -> the text of its tool_result, as one request carried it."""
    found: dict[str, str] = {}
    for message in body.get("messages", []):  # type: ignore[attr-defined]
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                text = block.get("content")
                found[block["tool_use_id"]] = text if isinstance(text, str) else json.dumps(text)
    return found


@pytest.mark.slow
@pytest.mark.skipif(
    not CLAUDE.exists(), reason="integrations/agents has no node_modules: run npm ci there"
)
def test_claude_code_through_the_gateway_gets_the_haiku_summaries(tmp_path: Path) -> None:
    """Three prompts, each reading a large output, through serve's gateway: once the first
    turns' batches are flushed, Claude Code's model gets their results as stubs whose summaries
    are the summarizer model's text; that model was called with serve's key, not the agent's."""
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    projects = home / ".claude" / "projects"
    projects.mkdir(parents=True)
    calls = [Call(f"toolu_0{n}big", "Bash", {"command": f"seq {n} 3000"}) for n in range(1, 4)]
    script = []
    for call in calls:
        script += [
            Turn(calls=(call,), usage=Usage(100, 5)),
            Turn(text="read it", usage=Usage(9, 2)),
        ]
    numbers = itertools.count(1)

    def reply(request: Request) -> Reply:
        return Reply(text=f"{MARK}-{next(numbers)}: printed numbers.", usage=(300, 20, 0, 0))

    settings = ["--set", "recoveryGraceTurns=0", "--min-freed-tokens", "0"]
    model_args = ["--set", "summarizerModel=anthropic/claude-haiku-4-5"]
    with AnthropicModel(script) as agent_model, FakeMessages(default=reply) as summarizer:
        env = {
            "ANTHROPIC_API_KEY": KEY,
            "ANTHROPIC_BASE_URL": "",
            "SESSIONFOLD_MODEL_BASE_URL": summarizer.base_url,
        }
        args = ["--anthropic-upstream", agent_model.url, *settings, *model_args]
        with serving(projects, TOKEN, args=args, env=env) as serve:
            agent = claude_env(home, serve.url)  # the agent's key is sk-scripted
            agent["ANTHROPIC_CUSTOM_HEADERS"] = f"X-Sessionfold-Token: {TOKEN}"
            session = run_claude(work, agent, "read the first")["session_id"]
            serve.folded(next(projects.glob(f"*/{session}.jsonl")))
            run_claude(work, agent, "read the second", "--resume", session)
            # The second prompt flushed the first turn; the gateway takes what is summarized
            # when a call comes (it never waits for a flush): wait for the model's answer.
            _summarized(serve.url, session, calls[0].id)
            run_claude(work, agent, "read the third", "--resume", session)
            err = serve.stop().decode()
        assert agent_model.pending()["turn"] == 0
        turns = agent_model.of_kind("turn")
        requests = list(summarizer.requests)
    stubs = [t for t in _results_sent(turns[-1].body).values() if t.startswith("[Summarized")]
    assert stubs, "no result reached the agent's model as a stub"
    assert any(MARK in stub and FOOTER in stub for stub in stubs)
    _assert_messages_requests(requests)
    assert all("sk-scripted" not in json.dumps(r.headers) for r in requests)
    assert KEY not in err and "sk-scripted" not in err and MARK not in err
