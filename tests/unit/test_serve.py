"""`sessionfold serve` as a pi agent meets it: a real server process over a growing session file,
asked over HTTP with its token. The context route answers what `sessionfold context FILE --format
json` prints for the file at the asked leaf, byte for byte; the other routes answer as the CLI."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from serve_process import CLI, serving

from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.views.context import apply_patch
from sessionfold.streams.cli.context import view_from_replay
from sessionfold.streams.tools.replay import Collector, replay_files
from sessionfold.streams.tools.synthetic import generate_session, write_session

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path, list[bytes]]]:
    """A serve process watching an empty directory; the session to grow there, line by line."""
    source = write_session(tmp_path, generate_session(5, 60)).path
    lines = source.read_bytes().splitlines(keepends=True)
    watched = tmp_path / "sessions"
    watched.mkdir()
    with serving(watched, TOKEN) as serve:
        yield serve.url, watched / source.name, lines
        serve.stop()  # exits 0, no traceback


def _cli_view(path: Path, session_id: str) -> tuple[bytes, list[dict[str, object]]]:
    """`sessionfold context FILE --format json` of the file now, and pi's own array there."""
    collector = Collector(session_id)
    replayer = replay_files([path], DEFAULT_CONFIG, [session_id], on_folded=collector)
    view = view_from_replay(replayer, collector, DEFAULT_CONFIG)
    return orjson.dumps(view.to_json()), view.unpruned


def test_context_answers_what_the_context_command_renders(
    served: tuple[str, Path, list[bytes]],
) -> None:
    """At every user message (where pi calls its model next) the answer is the CLI's render;
    an unchanged context says so and sends no array; the token is asked for."""
    url, path, lines = served
    session_id = orjson.loads(lines[0])["id"]
    changed = unchanged = 0
    with httpx.Client(base_url=url, headers=AUTH, timeout=30) as client:
        for line in lines:
            with path.open("ab") as handle:
                handle.write(line)
            entry = orjson.loads(line)
            if entry.get("type") != "message" or entry["message"]["role"] != "user":
                continue
            expected, pi_array = _cli_view(path, session_id)
            body = {"leaf": entry["id"], "messages": pi_array}
            sent = client.post(f"/sessions/{session_id}/context", json=body)
            # what the extension sends: the array's identities, not its text; the same answer
            shape = [[m["role"], m.get("toolCallId")] for m in pi_array]
            slim = {"leaf": entry["id"], "shape": shape}
            assert client.post(f"/sessions/{session_id}/context", json=slim).content == sent.content
            slim["answer"] = "patch"
            patched = client.post(f"/sessions/{session_id}/context", json=slim).json()
            answer = sent.json()
            if answer["changed"]:
                # the patch applied to pi's array yields the same array, byte for byte
                got = apply_patch(patched.pop("patch"), pi_array)
                assert orjson.dumps(got) == orjson.dumps(answer["messages"])
            assert patched == {k: v for k, v in answer.items() if k != "messages"}
            assert answer["stale"] is False and answer["reason"] is None
            cli = orjson.loads(expected)
            assert answer["tokens"] == cli["tokens"]
            if answer["changed"]:
                changed += 1
                assert orjson.dumps(answer["messages"]) == orjson.dumps(cli["messages"])
            else:
                unchanged += 1
                assert "messages" not in answer and cli["messages"] == pi_array
        assert changed > 0 and unchanged > 0
        status = client.get(f"/sessions/{session_id}/status").json()
        assert status["known"] and status["epoch"] > 0 and status["footer"].startswith("prune: ")
        assert httpx.post(f"{url}/sessions/{session_id}/context", json=body).status_code == 401


def test_a_leaf_never_written_answers_stale_and_an_unknown_session_at_once(
    served: tuple[str, Path, list[bytes]],
) -> None:
    """The wait is bounded; past it the answer says it is stale, and pi keeps its array."""
    url, path, lines = served
    path.write_bytes(b"".join(lines[:10]))
    session_id = orjson.loads(lines[0])["id"]
    with httpx.Client(base_url=url, headers=AUTH, timeout=30) as client:
        started = time.monotonic()
        body = {"leaf": "not-yet", "messages": [], "wait_ms": 300}
        answer = client.post(f"/sessions/{session_id}/context", json=body).json()
        assert answer["stale"] is True and answer["changed"] is False
        assert 0.3 <= time.monotonic() - started < 5
        started = time.monotonic()
        body = {"leaf": "first", "messages": [], "wait_ms": 20_000}
        unknown = client.post("/sessions/nobody/context", json=body).json()
        assert unknown["reason"] == "unknown-session" and unknown["changed"] is False
        assert time.monotonic() - started < 5  # a new session's first call: no file to wait for
        bad = client.post(f"/sessions/{session_id}/context", content=b"[1]")
        assert bad.status_code == 400


def test_recall_compact_and_refs(served: tuple[str, Path, list[bytes]]) -> None:
    """Recall returns the original output of a ref; compact returns the ledger's summary, as
    `sessionfold ledger compact FILE --json` makes it."""
    url, path, lines = served
    path.write_bytes(b"".join(lines))
    session_id = orjson.loads(lines[0])["id"]
    with httpx.Client(base_url=url, headers=AUTH, timeout=30) as client:
        last = orjson.loads(lines[-1])["id"]
        client.post(f"/sessions/{session_id}/context", json={"leaf": last, "messages": []})
        original = client.get(f"/sessions/{session_id}/refs/t1").json()
        recalled = client.post(f"/sessions/{session_id}/recall", json={"ids": ["t1", "t999"]})
        text = recalled.json()["text"]
        assert recalled.json()["found"] == 1
        assert text.startswith("## toolRef: t1\nTool: ") and "## toolRef: t999\n(not found" in text
        first_text = next(b["text"] for b in original["content"] if b["type"] == "text")
        assert first_text[:200] in text
        # `whole` (the MCP server's ask): every output as the log holds it, not cut
        whole = client.post(f"/sessions/{session_id}/recall", json={"ids": ["t1"], "whole": True})
        assert whole.json()["found"] == 1 and first_text in whole.json()["text"]
        bad = client.post(f"/sessions/{session_id}/recall", json={"ids": ["t1"], "whole": "yes"})
        assert bad.status_code == 400
        compact = client.post(f"/sessions/{session_id}/compact", json={}).json()
        cli = subprocess.run(
            [*CLI, "ledger", "compact", str(path), "--json"],
            capture_output=True,
            check=True,
            env={**os.environ, "SESSIONFOLD_LEDGER_LOG": "off"},
        )
        expected = orjson.loads(cli.stdout)
        assert compact["status"] == "summary"
        assert compact["summary"] == expected["payload"]["summary"]
        assert [
            {"type": "compaction", "summary": compact["summary"], "details": compact["details"]},
            compact["span_record"],
        ] == expected["entries"]


def test_a_context_array_over_a_mebibyte_is_read(served: tuple[str, Path, list[bytes]]) -> None:
    """pi's array for a long session is megabytes (past aiohttp's 1 MiB default body limit):
    the call is answered, not refused with a 413."""
    url, path, lines = served
    path.write_bytes(b"".join(lines))
    session_id = orjson.loads(lines[0])["id"]
    big = [{"role": "user", "content": "x" * 1024}] * 3000  # 3 MB
    body = {"leaf": orjson.loads(lines[-1])["id"], "messages": big}
    answer = httpx.post(f"{url}/sessions/{session_id}/context", json=body, headers=AUTH, timeout=60)
    assert answer.status_code == 200, answer.status_code
    assert answer.json()["reason"] == "mismatch" and answer.json()["stale"] is False


def test_a_call_for_a_leaf_just_written_polls_at_once(tmp_path: Path) -> None:
    """pi writes the leaf entry, then asks: the call has the tailer read it now, not at its next
    poll (here 8 s away), so a live call costs the fold and the render, not the poll interval."""
    lines = write_session(tmp_path, generate_session(6, 20)).path.read_bytes().splitlines(True)
    watched = tmp_path / "sessions"
    watched.mkdir()
    path = watched / "session.jsonl"
    path.write_bytes(b"".join(lines[:-1]))
    session_id = orjson.loads(lines[0])["id"]
    with serving(watched, TOKEN, poll_ms=8000) as serve:
        with httpx.Client(base_url=serve.url, headers=AUTH, timeout=30) as client:
            before = orjson.loads(lines[-2])["id"]
            client.post(f"/sessions/{session_id}/context", json={"leaf": before, "shape": []})
            time.sleep(0.5)  # the tailer's 8 s wait has begun
            leaf = orjson.loads(lines[-1])["id"]
            with path.open("ab") as handle:
                handle.write(lines[-1])
            started = time.monotonic()
            body = {"leaf": leaf, "shape": [], "wait_ms": 20_000}
            answer = client.post(f"/sessions/{session_id}/context", json=body).json()
            assert time.monotonic() - started < 2.5
            assert answer["stale"] is False and answer["reason"] == "mismatch"
        serve.stop()
