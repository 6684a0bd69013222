"""The live runtime behind `sessionfold serve`: a file folded as it grows renders, at every line,
exactly what `sessionfold context FILE` renders for the file cut there; flush answers are kept
beside the file, so a restart answers no flush twice and `context FILE` shows the model's words."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from format_sessions import TRANSLATED, write_format_session
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.events.envelope import CommandEnvelope, CommandPayload
from sessionfold.events.flush import CompactionPayload, FlushRequestPayload
from sessionfold.ports.summarizer import OfflineSummarizer
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.views import context as context_module
from sessionfold.projections.views.context import extends
from sessionfold.streams.cli.context import view_from_replay
from sessionfold.streams.publishing.session_file import SessionFileReader
from sessionfold.streams.runtime import live as live_module
from sessionfold.streams.runtime.answer_journal import journal_path
from sessionfold.streams.runtime.embedded import fold_files
from sessionfold.streams.runtime.live import LiveFolds
from sessionfold.streams.tools.replay import Collector, replay_files
from sessionfold.streams.tools.synthetic import generate_session, write_session
from sessionfold.streams.web.live_contract import epoch_of


class MarkedModel:
    """The offline summaries with a marker no offline run writes, counting its calls."""

    model = "marked"

    def __init__(self) -> None:
        self.calls = 0

    def summarize(self, request: FlushRequestPayload) -> CompactionPayload:
        self.calls += 1
        answer = OfflineSummarizer().summarize(request)
        results = tuple(
            r.model_copy(update={"text": f"MARKED {r.text}"}) if r.text else r
            for r in answer.results
        )
        return answer.model_copy(update={"results": results})


def _session(tmp_path: Path, seed: int, turns: int = 60) -> Path:
    folder = tmp_path / "src"
    folder.mkdir(exist_ok=True)
    return write_session(folder, generate_session(seed, turns)).path


def _context_json(path: Path, session_id: str) -> bytes:
    """`sessionfold context FILE --format json` for the file as it is."""
    collector = Collector(session_id)
    replayer = replay_files([path], DEFAULT_CONFIG, [session_id], on_folded=collector)
    return orjson.dumps(view_from_replay(replayer, collector, DEFAULT_CONFIG).to_json())


def _grow(source: Path, into: Path) -> tuple[Path, list[bytes]]:
    target = into / source.name
    target.write_bytes(b"")
    return target, source.read_bytes().splitlines(keepends=True)


@pytest.mark.parametrize("seed", [5, 11])
def test_the_live_view_is_the_context_command_at_every_line(tmp_path: Path, seed: int) -> None:
    """Line by line, the live render equals the CLI's render of the file cut at that line."""
    source = _session(tmp_path, seed)
    (tmp_path / "live").mkdir()
    target, lines = _grow(source, tmp_path / "live")
    live = LiveFolds([tmp_path / "live"])
    live.discover()
    pruned = 0
    for line in lines:
        with target.open("ab") as handle:
            handle.write(line)
        live.poll()
        if not live.sessions:
            continue
        (session_id,) = live.sessions
        view = live.view(session_id)
        pruned += view.pruned
        assert orjson.dumps(view.to_json()) == _context_json(target, session_id)
    assert pruned > 0 and epoch_of(live.runtime.store, session_id) > 0  # flushes did land


def test_a_half_written_line_waits_for_its_newline(tmp_path: Path) -> None:
    """A line pi is still writing is not read until it is complete."""
    source = _session(tmp_path, 5, turns=4)
    (tmp_path / "live").mkdir()
    target, lines = _grow(source, tmp_path / "live")
    live = LiveFolds([tmp_path / "live"])
    live.discover()
    target.write_bytes(lines[0] + lines[1][:10])
    live.poll()
    (session_id,) = live.sessions
    assert len(live.sessions[session_id].entries) == 1  # the header only
    with target.open("ab") as handle:
        handle.write(lines[1][10:])
    live.poll()
    assert len(live.sessions[session_id].entries) == 2


def test_answers_are_kept_beside_the_file_and_never_asked_twice(tmp_path: Path) -> None:
    """A restart folds the recorded answers (the model is not called again), and `context FILE`
    and `fold FILE` show the model's summaries, not the offline ones a replay would make."""
    source = _session(tmp_path, 5)
    (tmp_path / "live").mkdir()
    target = tmp_path / "live" / source.name
    shutil.copy(source, target)
    model = MarkedModel()
    live = LiveFolds([tmp_path / "live"], summarizer=model)
    live.discover()
    live.poll()
    (session_id,) = live.sessions
    assert model.calls > 0 and journal_path(target).is_file()
    first = orjson.dumps(live.view(session_id).to_json())
    assert b"MARKED" in first

    again = MarkedModel()
    restarted = LiveFolds([tmp_path / "live"], summarizer=again)
    restarted.discover()
    restarted.poll()
    assert again.calls == 0
    assert orjson.dumps(restarted.view(session_id).to_json()) == first
    assert _context_json(target, session_id) == first
    folded = fold_files([target])["sessions"][session_id]
    assert folded == restarted.document(session_id)
    # Without the journal the same file folds to the offline summaries.
    journal_path(target).unlink()
    assert b"MARKED" not in _context_json(target, session_id)


def test_a_torn_last_answer_is_asked_again(tmp_path: Path) -> None:
    """A crash mid-write leaves a torn last line: that request alone is answered again."""
    source = _session(tmp_path, 5)
    (tmp_path / "live").mkdir()
    target = tmp_path / "live" / source.name
    shutil.copy(source, target)
    model = MarkedModel()
    live = LiveFolds([tmp_path / "live"], summarizer=model)
    live.discover()
    live.poll()
    answers = journal_path(target).read_bytes().splitlines(keepends=True)
    assert len(answers) == model.calls >= 2
    journal_path(target).write_bytes(b"".join(answers[:-1]) + answers[-1][:20])
    again = MarkedModel()
    restarted = LiveFolds([tmp_path / "live"], summarizer=again)
    restarted.discover()
    restarted.poll()
    assert again.calls == 1


@settings(max_examples=12, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=4_000), min_size=1, max_size=60))
def test_the_kept_render_is_the_context_command_however_the_file_grows(cuts: list[int]) -> None:
    """Written in chunks that cut lines anywhere, polled after each: `rendered` (kept until
    the session folds more) is always the CLI's render of the complete lines read, and a poll
    of an unchanged file renders nothing new."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        source = _session(tmp_path, 7, turns=14)
        (tmp_path / "live").mkdir()
        target, lines = _grow(source, tmp_path / "live")
        data = b"".join(lines)
        live = LiveFolds([tmp_path / "live"])
        live.discover()
        written = 0
        for cut in [*cuts, len(data)]:
            chunk = data[written : written + cut]
            written += len(chunk)
            with target.open("ab") as handle:
                handle.write(chunk)
            live.poll()
            if not live.sessions:
                continue
            (session_id,) = live.sessions
            rendered = live.rendered(session_id, epoch_of)
            live.poll()  # nothing new: the kept render stays
            assert live.rendered(session_id, epoch_of) is rendered
            complete = data[: data.rfind(b"\n", 0, written) + 1]
            cut_file = tmp_path / "cut" / source.name
            cut_file.parent.mkdir(exist_ok=True)
            cut_file.write_bytes(complete)
            expected = orjson.loads(_context_json(cut_file, session_id))
            assert rendered.messages_json == orjson.dumps(expected["messages"])
            assert rendered.tokens == expected["tokens"]
            # The epoch read with the render: the flush attempts the CLI folds from these lines.
            folded = fold_files([cut_file])["sessions"][session_id]
            assert rendered.epoch == len(folded["flush_attempts"])
            if written == len(data):
                break


def test_a_poll_opens_only_the_files_that_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unchanged files cost a stat per poll, not an open and a read; a grown one is read."""
    opened: list[Path] = []
    lines_of = SessionFileReader.lines

    def counting(self: SessionFileReader, final: bool = True) -> Iterator[list[Any]]:
        opened.append(self.path)
        return lines_of(self, final)

    monkeypatch.setattr(SessionFileReader, "lines", counting)
    (tmp_path / "live").mkdir()
    grown = []
    for seed in (5, 6, 7):
        target, lines = _grow(_session(tmp_path, seed, turns=4), tmp_path / "live")
        target.write_bytes(b"".join(lines[:3]))
        grown.append((target, lines))
    live = LiveFolds([tmp_path / "live"])
    live.discover()
    assert live.poll() == 9 and set(opened) == {target for target, _ in grown}
    opened.clear()
    assert live.poll() == 0 and opened == []
    target, lines = grown[1]
    with target.open("ab") as handle:
        handle.write(lines[3][:5])  # half a line: read, nothing folded yet
    assert live.poll() == 0 and opened == [target]
    opened.clear()
    with target.open("ab") as handle:
        handle.write(lines[3][5:])
    assert live.poll() == 1 and opened == [target]


def test_a_poll_announces_each_files_session_once_its_lines_are_folded(tmp_path: Path) -> None:
    """A caller waiting for a session's leaf is told when its file's lines are folded, before
    the poll reads the next file: not once every file of a busy fleet is done."""
    (tmp_path / "live").mkdir()
    grown = []
    for seed in (5, 6, 7):
        target, lines = _grow(_session(tmp_path, seed, turns=4), tmp_path / "live")
        target.write_bytes(b"".join(lines[:3]))
        grown.append((target, orjson.loads(lines[0])["id"]))
    live = LiveFolds([tmp_path / "live"])
    live.discover()
    announced: list[tuple[str, int]] = []
    live.on_lines = lambda session_id: announced.append((session_id, len(live.sessions)))
    assert live.poll() == 9
    # Each announcement came when only the files read so far were folded.
    assert [folded for _, folded in announced] == [1, 2, 3]
    assert {session for session, _ in announced} == {session for _, session in grown}
    announced.clear()
    assert live.poll() == 0 and announced == []  # nothing folded, nothing announced


def _counted_tokens(monkeypatch: pytest.MonkeyPatch, *modules: Any) -> list[object]:
    """The messages whose tokens `modules` count from now on (their `message_tokens`)."""
    counted: list[object] = []
    real = live_module.message_tokens

    def counting(message: Any) -> int:
        counted.append(message)
        return real(message)

    for module in modules:
        monkeypatch.setattr(module, "message_tokens", counting)
    return counted


def test_a_render_counts_the_tokens_of_a_log_message_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token counts of the log's own messages are kept across renders: a render after one
    more line counts that line's message and what the render made itself, not the array."""
    source = _session(tmp_path, 5)
    (tmp_path / "live").mkdir()
    target, lines = _grow(source, tmp_path / "live")
    target.write_bytes(b"".join(lines[:-1]))
    live = LiveFolds([tmp_path / "live"])
    live.discover()
    live.poll()
    (session_id,) = live.sessions
    live.rendered(session_id, epoch_of)
    # ContextView.tokens counts through the context module's name.
    counted = _counted_tokens(monkeypatch, live_module, context_module)
    with target.open("ab") as handle:
        handle.write(lines[-1])
    live.poll()
    rendered = live.rendered(session_id, epoch_of)
    view = rendered.view
    # what the render made: stubs, summaries, and the placeholder results of both lists
    made = [m for m in [*view.messages, *view.unpruned_sent] if id(m) not in view.origin]
    assert len(counted) <= len(made) + 1 < len(view.unpruned)
    assert rendered.tokens == view.tokens


def test_a_grown_render_counts_only_the_new_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A render grown from the last one (no flush between) counts the tokens of what it added
    (the new messages, stubbed or not), never the stubs and summaries it kept; the counts are
    still the whole array's."""
    source = _session(tmp_path, 8)
    (tmp_path / "live").mkdir()
    target, lines = _grow(source, tmp_path / "live")
    target.write_bytes(b"".join(lines[:40]))
    live = LiveFolds([tmp_path / "live"], journals=False)
    live.discover()
    live.poll()
    (session_id,) = live.sessions
    live.rendered(session_id, epoch_of)
    counted = _counted_tokens(monkeypatch, live_module)
    grown = 0
    for line in lines[40:]:
        before = live.rendered(session_id, epoch_of)
        memo = live.sessions[session_id].memo
        was = memo.grown
        with target.open("ab") as handle:
            handle.write(line)
        live.poll()
        counted.clear()
        rendered = live.rendered(session_id, epoch_of)
        assert rendered.tokens == rendered.view.tokens
        kept = extends(rendered.view.messages, before.view.messages)
        if memo.grown > was and before.view.pruned and kept:  # the render grew the last one
            grown += 1
            added = len(rendered.view.unpruned) - len(before.view.unpruned)
            assert len(counted) <= 2 * added
    assert grown > 10


def test_a_fold_that_adds_no_entry_drops_the_kept_render(tmp_path: Path) -> None:
    """A record folded with no log entry (a manual flush command: its answer moves the epoch)
    still changes the answer: the kept render is not given again."""
    source = _session(tmp_path, 5)
    (tmp_path / "live").mkdir()
    target, lines = _grow(source, tmp_path / "live")
    target.write_bytes(b"".join(lines[:10]))
    live = LiveFolds([tmp_path / "live"], journals=False)
    live.discover()
    live.poll()
    (session_id,) = live.sessions
    assert live.document(session_id)["pending_batches"]  # a flush has batches to answer
    kept = live.rendered(session_id, epoch_of)
    (tail,) = live.tails.values()
    seq = live.sessions[session_id].entries[-1].seq + 1
    flush = CommandEnvelope(session_id=session_id, seq=seq, payload=CommandPayload(name="flush"))
    with live.lock:
        live._feed(tail, flush)
    rendered = live.rendered(session_id, epoch_of)
    assert rendered is not kept
    assert rendered.epoch == epoch_of(live.runtime.store, session_id) == kept.epoch + 1


def _next_turn(data: bytes) -> bytes:
    """The first line of the turn after a Claude Code transcript's last: a user prompt."""
    lines = [orjson.loads(line) for line in data.splitlines()]
    last = next(line for line in reversed(lines) if isinstance(line.get("uuid"), str))
    prompt = {
        "parentUuid": last["uuid"],
        "sessionId": last["sessionId"],
        "type": "user",
        "uuid": "00000000-0000-4000-8000-000000000001",
        "timestamp": last["timestamp"],
        "message": {"role": "user", "content": "next"},
    }
    return orjson.dumps(prompt) + b"\n"


@pytest.mark.parametrize("file_format", TRANSLATED)
def test_a_growing_file_of_another_format_folds_to_the_fold_of_the_whole_file(
    tmp_path: Path, file_format: str
) -> None:
    """A Codex rollout or a Claude Code transcript written line by line, each line in two
    writes: the live state is `fold`'s of the whole file. A tail holds the group still open
    (Claude Code's last turn until the next one starts: here the next prompt is written)."""
    source = write_format_session(tmp_path / "src", file_format, seed=7, turns=5)
    data = source.read_bytes()
    (tmp_path / "live").mkdir()
    target = tmp_path / "live" / source.name
    target.write_bytes(b"")
    live = LiveFolds([tmp_path / "live"], journals=False)
    live.discover()
    tail = _next_turn(data) if file_format == "claude-code" else b""
    for line in [*data.splitlines(keepends=True), tail]:
        half = len(line) // 2
        for piece in (line[:half], line[half:]):
            with target.open("ab") as handle:
                handle.write(piece)
            live.poll()
    expected = fold_files([source])["sessions"]
    assert list(live.sessions) == list(expected)
    for session_id, state in expected.items():
        document = live.document(session_id)
        assert orjson.dumps(document, option=orjson.OPT_SORT_KEYS) == orjson.dumps(
            state, option=orjson.OPT_SORT_KEYS
        )
        assert state["counts"]["messages"]["toolResult"] > 0
