"""One reading of a recall ref (views/recall.py `resolve`): `tN`, `id@timestamp`, `eN` and a bare
tool call id, the last naming its newest occurrence (reference §10.4: pi-condense falls back to
the bare id). The recall routes and `sessionfold context --ref` read refs through it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.projections.pruning import index
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.pruning.digest import message_of
from sessionfold.projections.views import chains
from sessionfold.projections.views.recall import NOT_FOUND, recall_text, resolve
from sessionfold.streams.tools.replay import Collector, replay_files
from sessionfold.streams.tools.synthetic import generate_session, write_session


def _replayed(path: Path) -> tuple[Any, str, dict[int, dict[str, Any]]]:
    session_id = orjson.loads(path.read_bytes().splitlines()[0])["id"]
    collector = Collector(session_id)
    replayer = replay_files([path], DEFAULT_CONFIG, [session_id], on_folded=collector)
    log = {item.seq: item.entry for item in collector.entries}
    return replayer.runtime.store, session_id, log


def _indexed(store: Any, session_id: str) -> dict[str, dict[str, Any]]:
    """Every index record of the session, by occurrence key."""
    prefix = f"{session_id}/pr/i/"
    return {k[len(prefix) :]: v for k, v in store.items() if k.startswith(prefix)}


def _timestamp(occ: str) -> int:
    return int(occ.rpartition("@")[2])


def test_a_bare_tool_call_id_recalls_what_its_ref_recalls(tmp_path: Path) -> None:
    """Every indexed call recalled by its raw tool call id answers with the same original as
    its `tN` ref and its occurrence key (the issue: `{"ids": ["faux_call_3"]}` found nothing)."""
    path = write_session(tmp_path, generate_session(5, 60)).path
    store, session_id, log = _replayed(path)
    records = {occ: row for occ, row in _indexed(store, session_id).items() if row.get("ref")}
    assert records
    newest: dict[str, str] = {}  # bare id -> its indexed occurrence with the newest timestamp
    for occ, row in sorted(_indexed(store, session_id).items(), key=lambda i: _timestamp(i[0])):
        newest[row["id"]] = occ
    for occ, row in records.items():
        by_ref, found = recall_text(store, session_id, [row["ref"]], log.get)
        assert found == 1
        for wanted in (occ, row["id"]) if newest[row["id"]] == occ else (occ,):
            text, found = recall_text(store, session_id, [wanted], log.get)
            assert found == 1, wanted
            assert text == by_ref.replace(f"## toolRef: {row['ref']}", f"## toolRef: {wanted}")
        assert chains.resolve_ref(store, session_id, row["id"]) == row["seq"]


def test_a_log_ref_recalls_the_output_at_that_position(tmp_path: Path) -> None:
    """`eN`, the ref the context gives an output nothing indexed, recalls it too."""
    path = write_session(tmp_path, generate_session(3, 40)).path
    store, session_id, log = _replayed(path)
    results = [
        seq for seq, entry in log.items() if (message_of(entry) or {}).get("role") == "toolResult"
    ]
    assert results
    for seq in results:
        message = message_of(log[seq])
        text, found = recall_text(store, session_id, [f"e{seq}"], log.get)
        assert found == 1
        assert text.startswith(f"## toolRef: e{seq}\nTool: {message['toolName']}\nArgs: ")
    user = next(s for s, e in log.items() if (message_of(e) or {}).get("role") == "user")
    text, found = recall_text(store, session_id, [f"e{user}", "e99999", "nobody"], log.get)
    assert found == 0 and text.count(NOT_FOUND) == 3


def _reused(tmp_path: Path, uses: int) -> Path:
    """A synthetic session whose every tool call is renamed `faux_call_3` in the first `uses`
    assistant messages that make calls (one call each kept): an id the model reused."""
    lines = write_session(tmp_path, generate_session(9, 40)).path.read_bytes().splitlines()
    entries = [orjson.loads(line) for line in lines]
    renamed: dict[str, str] = {}
    done = 0
    for entry in entries:
        message = entry.get("message") if entry.get("type") == "message" else None
        if not message:
            continue
        if message.get("role") == "assistant" and done < uses:
            calls = [b for b in message.get("content", []) if b.get("type") == "toolCall"]
            if len(calls) == 1:
                renamed[calls[0]["id"]] = "faux_call_3"
                calls[0]["id"] = "faux_call_3"
                done += 1
        elif message.get("role") == "toolResult" and message.get("toolCallId") in renamed:
            message["toolCallId"] = renamed.pop(message["toolCallId"])
    path = tmp_path / "reused.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in copy.deepcopy(entries)) + b"\n")
    return path


@settings(max_examples=8, deadline=None)
@given(uses=st.integers(min_value=1, max_value=30))
def test_a_reused_id_recalls_its_newest_occurrence(tmp_path_factory: Any, uses: int) -> None:
    """Property: a bare id resolves to its indexed occurrence with the newest timestamp,
    whichever occurrences were indexed (newer ones not yet summarized are not its answer)."""
    path = _reused(tmp_path_factory.mktemp("reused"), uses)
    store, session_id, _ = _replayed(path)
    occurrences = [
        occ for occ, row in _indexed(store, session_id).items() if row["id"] == "faux_call_3"
    ]
    resolved = resolve(store, session_id, "faux_call_3")
    if not occurrences:
        assert resolved is None
        return
    newest = max(occurrences, key=_timestamp)
    assert resolved is not None
    assert resolved.row == index.record(store, session_id, newest)


def test_an_id_reused_across_summarized_batches_recalls_the_newest(tmp_path: Path) -> None:
    """The issue's case: `faux_call_3` names several summarized outputs; recall answers the
    newest of them, and `context --ref`'s reading (chains.resolve_ref) the same."""
    store, session_id, log = _replayed(_reused(tmp_path, 20))
    occurrences = sorted(
        (occ for occ, row in _indexed(store, session_id).items() if row["id"] == "faux_call_3"),
        key=_timestamp,
    )
    assert len(occurrences) >= 2
    text, found = recall_text(store, session_id, ["faux_call_3"], log.get)
    newest = index.record(store, session_id, occurrences[-1])
    assert found == 1 and newest is not None
    assert chains.resolve_ref(store, session_id, "faux_call_3") == newest["seq"]
    assert text.startswith(f"## toolRef: faux_call_3\nTool: {newest['tool']}\n")
