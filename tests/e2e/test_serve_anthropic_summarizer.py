"""`sessionfold serve` with its summarizer on the Anthropic Messages API, end to end: a real pi
session file (from ../shared, copied to a temporary folder: serve keeps its answers beside it)
folded by a serve process whose `summarizerModel` is `anthropic/claude-haiku-4-5`, the Messages
API a scripted server on 127.0.0.1 that `ANTHROPIC_BASE_URL` names. The batch summaries in
serve's context answer are the scripted model's text, and every request the server got is a
valid streamed Messages request carrying the key from serve's environment."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import httpx
import pydantic
from anthropic.types.message_create_params import MessageCreateParamsStreaming
from fake_anthropic import FakeMessages, Reply, Request
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
    assert requests
    for request in requests:
        assert request.path == "/v1/messages"
        assert request.headers["x-api-key"] == KEY
        assert request.headers["anthropic-version"] == "2023-06-01"
        assert "authorization" not in request.headers
        pydantic.TypeAdapter(MessageCreateParamsStreaming).validate_python(request.body)
        assert request.body["model"] == "claude-haiku-4-5"
    assert KEY not in err and MARK not in err
