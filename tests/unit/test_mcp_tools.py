"""`sessionfold mcp`'s tools without the SDK (cli/mcp_tools.py): the originals behind refs whole
and paged, the session found from what each agent gives its MCP servers, serve asked first,
another session's refs refused, failures that quote no transcript."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.views.recall import NOT_FOUND, page, recall_text
from sessionfold.streams.cli import mcp_tools
from sessionfold.streams.cli.mcp_tools import SessionSource, ToolFailure
from sessionfold.streams.tools.replay import Collector, replay_files
from sessionfold.streams.tools.synthetic import generate_session, write_session

#: No serve answers here (a port nothing listens on), so every tool folds the file.
NO_SERVE = {"SESSIONFOLD_SERVE_URL": "http://127.0.0.1:9"}


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(st.characters(codec="utf-8"), max_size=2000)
    | st.lists(st.text(max_size=30), max_size=80).map("\n".join),
    limit=st.integers(1, 300),
)
def test_pages_joined_are_the_text(text: str, limit: int) -> None:
    """Following `next_offset` from 0 gives pages of at most `limit` characters, each but the
    last non-empty, that join into the text exactly."""
    pages, offset = [], 0
    while True:
        part = page(text, offset, limit)
        assert len(part.text) <= limit and part.total == len(text) and part.offset == offset
        pages.append(part.text)
        if part.next_offset is None:
            break
        assert part.next_offset > offset
        offset = part.next_offset
    assert "".join(pages) == text


@settings(max_examples=100, deadline=None)
@given(text=st.text(min_size=1, max_size=3000), limit=st.integers(1, 500))
def test_paged_notes_join_back_and_say_the_next_offset(text: str, limit: int) -> None:
    """The tool's pages, their notes taken off, join into the text; each note names the offset
    the next call gives; a text that fits is returned bare."""
    pieces, offset = [], 0
    while True:
        answer = mcp_tools.paged(text, offset, limit)
        if offset == 0 and len(text) <= limit:
            assert answer == text
            return
        body, _, note = answer.rpartition("\n\n[Page: ")
        pieces.append(body)
        if note.endswith("Last page.]"):
            break
        offset = int(note.rpartition("offset=")[2].rstrip(".]"))
    assert "".join(pieces) == text


def test_bad_pages_are_refused() -> None:
    """An offset past the end, a negative one and a zero limit are the caller's errors."""
    for offset, limit in ((10, 5), (-1, 5), (0, 0)):
        with pytest.raises(ToolFailure):
            mcp_tools.paged("0123456789", offset, limit)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Any, dict[int, Any]]:
    """A synthetic pi session whose fold summarized outputs, with its replayed store and log."""
    path = write_session(tmp_path_factory.mktemp("s"), generate_session(5, 60)).path
    session_id = orjson.loads(path.read_bytes().splitlines()[0])["id"]
    collector = Collector(session_id)
    replayer = replay_files([path], DEFAULT_CONFIG, [session_id], on_folded=collector)
    log = {item.seq: item.entry for item in collector.entries}
    return path, session_id, replayer.runtime.store, log


def _refs(store: Any, session_id: str) -> list[str]:
    prefix = f"{session_id}/pr/i/"
    return [v["ref"] for k, v in store.items() if k.startswith(prefix) and v.get("ref")]


def test_a_recall_is_every_original_whole(session: Any) -> None:
    """Recalled from the file, every ref gives views/recall.py's text with each output whole,
    page after page; the first page is the head of the text."""
    path, session_id, store, log = session
    refs = _refs(store, session_id)
    assert len(refs) > 3
    source = SessionSource("claude-code", session_file=path, env=NO_SERVE)
    whole, found = recall_text(store, session_id, refs, log.get, whole=True)
    assert found == len(refs)
    pieces, offset = [], 0
    while True:
        answer = mcp_tools.recall(source, refs, offset, 700)
        body, _, note = answer.rpartition("\n\n[Page: ")
        pieces.append(body)
        if note.endswith("Last page.]"):
            break
        offset = int(note.rpartition("offset=")[2].rstrip(".]"))
    assert "".join(pieces) == whole
    assert (
        mcp_tools.recall(source, refs[:1])
        == recall_text(store, session_id, refs[:1], log.get, whole=True)[0]
    )


def test_whole_outputs_are_not_cut_to_pis_defaults(
    session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pi's tool text cuts an output past its byte bound and says so; the MCP tool's text
    (`whole`) keeps every output as the log holds it."""
    from sessionfold.projections.views import recall

    path, session_id, store, log = session
    refs = _refs(store, session_id)
    monkeypatch.setattr(recall, "MAX_BYTES", 40)
    cut, _ = recall_text(store, session_id, refs, log.get)
    whole, _ = recall_text(store, session_id, refs, log.get, whole=True)
    assert "[Output truncated:" in cut and "[Output truncated:" not in whole
    source = SessionSource("codex", session_file=path, env=NO_SERVE)
    assert mcp_tools.recall(source, refs, limit=mcp_tools.MAX_LIMIT).startswith(whole[:1000])


def test_another_sessions_ref_is_refused(session: Any, tmp_path: Path) -> None:
    """A call naming another session is refused, whatever the ref; a tool call id of another
    session's file is not found in this one."""
    path, session_id, store, _log = session
    ref = _refs(store, session_id)[0]
    source = SessionSource("codex", session_file=path, env=NO_SERVE)
    with pytest.raises(ToolFailure, match="not this agent's session"):
        mcp_tools.recall(source, [ref], named="another-session")
    with pytest.raises(ToolFailure, match="not this agent's session"):
        mcp_tools.ledger(source, named="another-session")
    with pytest.raises(ToolFailure, match="not this agent's session"):
        mcp_tools.named_sessions("a", "b")
    other = write_session(tmp_path, generate_session(6, 30)).path
    other_id = orjson.loads(other.read_bytes().splitlines()[0])["id"]
    collector = Collector(other_id)
    replayed = replay_files([other], DEFAULT_CONFIG, [other_id], on_folded=collector)
    theirs = {
        v["id"] for k, v in replayed.runtime.store.items() if k.startswith(f"{other_id}/pr/i/")
    }
    ours = {v["id"] for k, v in store.items() if k.startswith(f"{session_id}/pr/i/")}
    foreign = sorted(theirs - ours)
    assert foreign
    assert mcp_tools.recall(source, foreign[:1]) == f"## toolRef: {foreign[0]}\n{NOT_FOUND}"


def test_the_session_comes_from_what_each_agent_gives(session: Any, tmp_path: Path) -> None:
    """Claude Code: `CLAUDE_CODE_SESSION_ID` and its projects folder; Codex: the id its call's
    `_meta` names, or the newest rollout of the working directory; `--session` pins it."""
    path, session_id, _store, _log = session
    home = tmp_path / "home"
    claude_file = home / ".claude" / "projects" / "-w" / f"{session_id}.jsonl"
    claude_file.parent.mkdir(parents=True)
    claude_file.write_bytes(path.read_bytes())
    env = {"HOME": str(home), "CLAUDE_CODE_SESSION_ID": session_id}
    assert SessionSource("claude-code", env=env).resolve(None) == (session_id, claude_file)
    assert SessionSource("claude-code", env={"HOME": str(home)}, cwd=Path("/w")).resolve(None) == (
        session_id,
        claude_file,
    )
    rollout = home / ".codex" / "sessions" / "2026" / "12" / "06" / "rollout-x-abc-1.jsonl"
    rollout.parent.mkdir(parents=True)
    rollout.write_text(
        json.dumps({"type": "session_meta", "payload": {"id": "abc-1", "cwd": "/w"}})
    )
    codex = SessionSource("codex", env={"HOME": str(home)}, cwd=Path("/w"))
    meta = {"sessionId": "abc-1", "x-codex-turn-metadata": {"session_id": "abc-1"}}
    assert codex.resolve(mcp_tools.call_session(meta)) == ("abc-1", rollout)
    assert codex.resolve(None) == ("abc-1", rollout)
    pinned = SessionSource("codex", session_id="abc-1", env={"HOME": str(home)})
    with pytest.raises(ToolFailure, match="not this agent's session"):
        pinned.resolve("abc-2")
    with pytest.raises(ToolFailure, match="no transcript"):
        SessionSource("codex", env={"HOME": str(home)}, cwd=Path("/elsewhere")).resolve(None)
    with pytest.raises(ToolFailure, match="no transcript"):
        SessionSource("claude-code", session_id="../../etc/passwd", env=env).resolve(None)


def test_bad_ids_are_the_callers_error(session: Any) -> None:
    """No ids, too many, a non-string or an overlong one: a ToolFailure that says the bounds."""
    source = SessionSource("codex", session_file=session[0], env=NO_SERVE)
    for ids in ([], ["t1"] * 101, [3], ["x" * 257], "t1"):
        with pytest.raises(ToolFailure, match="toolCallIds"):
            mcp_tools.recall(source, ids)


class _Serve(BaseHTTPRequestHandler):
    """A serve stand-in: answers the recall and session routes from `answers`."""

    answers: ClassVar[dict[str, Any]] = {}
    seen: ClassVar[list[tuple[str, str, dict[str, Any] | None, str | None]]] = []

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def _answer(self, body: dict[str, Any] | None) -> None:
        self.seen.append((self.command, self.path, body, self.headers.get("Authorization")))
        answer = self.answers.get(self.path)
        data = json.dumps(answer).encode()
        self.send_response(200 if answer is not None else 404)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        """GET /sessions/{id}."""
        self._answer(None)

    def do_POST(self) -> None:
        """POST /sessions/{id}/recall."""
        self._answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))


@pytest.fixture
def fake_serve() -> Iterator[str]:
    """A serve stand-in on 127.0.0.1; its URL."""
    _Serve.answers, _Serve.seen = {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Serve)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_serve_answers_first_with_the_token(session: Any, fake_serve: str) -> None:
    """serve's whole text is used when it finds every id (asked with the token, `whole`);
    when it misses one, or does not know the session, the file is folded here."""
    path, session_id, store, log = session
    refs = _refs(store, session_id)[:2]
    env = {"SESSIONFOLD_SERVE_URL": fake_serve, "SESSIONFOLD_API_TOKEN": "tok-123 "}
    source = SessionSource("claude-code", session_file=path, env=env)
    route = f"/sessions/{session_id}/recall"
    _Serve.answers[route] = {"text": "from serve", "found": 2}
    assert mcp_tools.recall(source, refs) == "from serve"
    assert _Serve.seen[-1] == ("POST", route, {"ids": refs, "whole": True}, "Bearer tok-123")
    _Serve.answers[route] = {"text": "from serve", "found": 1}
    here = recall_text(store, session_id, refs, log.get, whole=True)[0]
    assert mcp_tools.recall(source, refs) == here
    _Serve.answers.clear()
    assert mcp_tools.recall(source, refs) == here


def test_the_ledger_tool_reads_serves_view_or_the_file(session: Any, fake_serve: str) -> None:
    """The ledger tool renders serve's ledger view when serve has the session, else the
    file's, offline; never an error for an empty ledger."""
    from sessionfold.projections.ledger.hook import hook_context
    from sessionfold.streams.cli.hook import embedded_view

    path, session_id, _store, _log = session
    source = SessionSource(
        "claude-code", session_file=path, env={"SESSIONFOLD_SERVE_URL": fake_serve}
    )
    view = embedded_view(path, to_end=True)
    assert view is not None
    expected = hook_context(view, None) or mcp_tools.EMPTY_LEDGER
    assert mcp_tools.ledger(source) == mcp_tools.paged(expected, 0, mcp_tools.DEFAULT_LIMIT)
    _Serve.answers[f"/sessions/{session_id}"] = {"ledger": view}
    assert mcp_tools.ledger(source) == mcp_tools.paged(expected, 0, mcp_tools.DEFAULT_LIMIT)
    assert _Serve.seen[-1][:2] == ("GET", f"/sessions/{session_id}")


def test_failures_quote_no_transcript(tmp_path: Path) -> None:
    """A transcript that vanished or is not a session: the failure names no line of it."""
    secret = "SECRET-WORDS-OF-A-TOOL-OUTPUT"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(secret + "\n")
    for source in (
        SessionSource("codex", session_file=tmp_path / "gone.jsonl", env=NO_SERVE),
        SessionSource("codex", session_file=bad, session_id="x", env=NO_SERVE),
    ):
        try:
            text = mcp_tools.recall(source, ["t1"])
        except Exception as exc:  # the server turns any failure into a tool error
            assert secret not in str(exc)
        else:
            assert secret not in text


def test_a_bad_setting_is_the_calls_error_not_the_starts(session: Any) -> None:
    """The settings are read at the first fold (the start stays fast): a bad key is a tool
    error that names it, and the same settings serve uses give the same refs."""
    path, session_id, store, _log = session
    bad = SessionSource("codex", session_file=path, overrides=["noSuchKey=1"], env=NO_SERVE)
    with pytest.raises(ToolFailure, match="noSuchKey"):
        mcp_tools.recall(bad, ["t1"])
    same = SessionSource("codex", session_file=path, overrides=["enabled=true"], env=NO_SERVE)
    ref = _refs(store, session_id)[0]
    assert NOT_FOUND not in mcp_tools.recall(same, [ref])


@settings(max_examples=200, deadline=None)
@given(
    pinned=st.text(st.sampled_from("abc-_.0"), min_size=1, max_size=8),
    named=st.none() | st.text(st.sampled_from("abc-_.0"), min_size=1, max_size=8),
    how=st.sampled_from(["--session", "environment"]),
)
def test_a_call_is_answered_only_for_the_pinned_session(
    pinned: str, named: str | None, how: str
) -> None:
    """Whichever way the session is pinned (the argument, Claude Code's environment), a call
    naming any other session is refused before a transcript is looked for; one naming the same
    session, or none, goes on to the search."""
    env = {"HOME": "/nonexistent"}
    if how == "environment":
        source = SessionSource("claude-code", env={**env, "CLAUDE_CODE_SESSION_ID": pinned})
    else:
        source = SessionSource("claude-code", session_id=pinned, env=env)
    expected = "not this agent's session" if named not in (None, pinned) else "no transcript"
    with pytest.raises(ToolFailure, match=expected):
        source.resolve(named)


def test_install_allows_exactly_the_tools_the_server_registers(tmp_path: Path) -> None:
    """Claude Code's settings that `sessionfold install` writes allow each tool of the server
    by its registered name: a tool renamed on one side only would be refused by `claude -p`."""
    import asyncio

    from sessionfold.streams.cli.mcp import build_server
    from sessionfold.streams.tools.install.changes import AddItem
    from sessionfold.streams.tools.install.plans import NAME, plan

    server = build_server(SessionSource("claude-code"))
    registered = {tool.name for tool in asyncio.run(server.list_tools())}
    made = plan("claude-code", "user", ["/bin/sessionfold"], {"HOME": str(tmp_path)}, tmp_path)
    allowed = {
        edit.item
        for file in made.files
        for edit in file.edits
        if isinstance(edit, AddItem) and edit.path == ("permissions", "allow")
    }
    assert allowed == {f"mcp__{NAME}__{name}" for name in registered}
