"""The ledger pass end to end: real sessions, determinism, idempotence, records, rebuilds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sessionfold.events.envelope import (
    CompactionEnvelope,
    CompactRequestEnvelope,
    EntryEnvelope,
    EntryPayload,
    OpaquePayload,
)
from sessionfold.events.ledger import LEDGER_PRODUCER, SPAN_RECORD_TYPE
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.ports.ledger.pass_ import run_pass
from sessionfold.projections.ledger.config import LedgerConfig
from sessionfold.projections.ledger.fold import LedgerFold
from sessionfold.projections.ledger.render import render
from sessionfold.projections.ledger.state import canonical_json, load_head, snapshot
from sessionfold.projections.store import DictStore
from sessionfold.streams.publishing.session_file import read_session_file
from sessionfold.streams.runtime.ledger_loop import EmbeddedLedger, fold_records

SESSIONS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "sessions"
REAL = ["before-compaction.jsonl", "large-session.jsonl"]
SID = "sess-p"


def real_session(name: str) -> Path:
    """A real session file from ../shared, or a skip naming where it was looked for."""
    path = SESSIONS / name
    if not path.is_file():
        pytest.skip(f"real session {name} not found in {SESSIONS} (../shared is absent)")
    return path


def envelopes_of(path: Path) -> list[EntryEnvelope]:
    """Every envelope of a session file."""
    return [r for r in read_session_file(path) if isinstance(r, EntryEnvelope)]


def user_texts_from_file(path: Path) -> list[str]:
    """Every user message's text, read from the file with the json module alone."""
    texts = []
    for line in path.read_text().splitlines():
        message = json.loads(line).get("message") or {}
        if message.get("role") == "user":
            content = message["content"]
            if isinstance(content, str):
                texts.append(content)
            else:
                texts.append("\n".join(b["text"] for b in content if b.get("type") == "text"))
    return texts


class Refusing:
    """A DiffModel that must never be called."""

    name = "refusing"

    def diff(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """Fail the test: no model call was expected."""
        raise AssertionError("no model call expected")


@pytest.mark.parametrize("name", REAL)
def test_offline_pass_on_a_real_session_quotes_users_verbatim_within_size(name: str) -> None:
    """Every rule quotes its user message verbatim (checked against the file); summaries fit."""
    path = real_session(name)
    run = fold_records(envelopes_of(path), OfflineModel())
    state = snapshot(run.store, run.session_id)
    by_entry = {
        e.payload.entry["id"]: e.payload.entry["message"]
        for e in envelopes_of(path)
        if e.payload.entry.get("type") == "message"
    }
    file_texts = user_texts_from_file(path)
    assert state["rules"], "the offline reading finds rules in this session"
    for rule in state["rules"]:
        message = by_entry[rule["entry"]]
        assert message["role"] == "user"
        content = message["content"]
        text = (
            content
            if isinstance(content, str)
            else "\n".join(b["text"] for b in content if b.get("type") == "text")
        )
        assert rule["words"] in text
        assert any(rule["words"] in raw for raw in file_texts)
        assert text[rule["start"] : rule["end"]] == rule["words"]
    assert run.payloads
    for payload in run.payloads:
        assert 0 < len(payload["summary"]) <= 12_000
        assert payload["record"]["model"] == "offline"
        assert payload["record"]["v"] == 1 and payload["stateFormat"] == 1
    for rule in state["rules"]:
        assert json.dumps(rule["words"], ensure_ascii=False) in run.payloads[-1]["summary"]


@pytest.mark.parametrize("limit", [2_000, 5_000])
def test_summary_stays_within_a_smaller_configured_size(limit: int) -> None:
    """A smaller summary size is honoured too, by leaving out the oldest lines first."""
    path = real_session("before-compaction.jsonl")
    run = fold_records(envelopes_of(path), OfflineModel(), config=LedgerConfig(summary_chars=limit))
    for payload in run.payloads:
        assert len(payload["summary"]) <= limit
        assert payload["record"]["capFit"].get("commands", 0) > 0


def test_same_input_gives_the_same_state_byte_for_byte() -> None:
    """Folding a real session twice gives byte-identical canonical JSON, payloads included."""
    path = real_session("before-compaction.jsonl")
    first = fold_records(envelopes_of(path), OfflineModel())
    second = fold_records(envelopes_of(path), OfflineModel())
    assert canonical_json(dict(first.store)) == canonical_json(dict(second.store))
    assert canonical_json(first.payloads) == canonical_json(second.payloads)


def test_every_envelope_twice_with_passes_changes_nothing() -> None:
    """Feeding every envelope of a real session twice leaves the same store and passes."""
    path = real_session("before-compaction.jsonl")
    envelopes = envelopes_of(path)
    once = fold_records(envelopes, OfflineModel())
    twice = fold_records([e for e in envelopes for _ in range(2)], OfflineModel())
    assert canonical_json(dict(once.store)) == canonical_json(dict(twice.store))
    assert len(once.payloads) == len(twice.payloads)


def test_summary_is_the_render_of_the_state_and_span_states_are_kept() -> None:
    """The payload's summary renders the folded state; `at_span` gives each span's own."""
    path = real_session("before-compaction.jsonl")
    run = fold_records(envelopes_of(path), OfflineModel())
    for payload in run.payloads:
        state = snapshot(run.store, run.session_id, at_span=payload["span"])
        assert render(state)[0] == payload["summary"]
    assert [p["record"]["trigger"] for p in run.payloads] == ["compaction", "compaction", "end"]


def _session_entry(seq: int, body: dict[str, Any]) -> EntryEnvelope:
    entry = {"id": f"e{seq}", "parentId": None, "timestamp": "t", **body}
    return EntryEnvelope(session_id=SID, seq=seq, payload=EntryPayload(entry=entry))


def _user(seq: int, text: str) -> EntryEnvelope:
    content = [{"type": "text", "text": text}]
    return _session_entry(seq, {"type": "message", "message": {"role": "user", "content": content}})


def test_span_record_entries_rebuild_the_state_without_a_model() -> None:
    """Our compaction entry and span record in a transcript rebuild the same state, no call."""
    live = EmbeddedLedger(OfflineModel())
    live.feed(_user(1, "never push to main"))
    live.feed(CompactRequestEnvelope(session_id=SID, seq=2))
    [payload] = live.payloads
    details = {"producer": LEDGER_PRODUCER, "stateFormat": 1, "request": payload["request"]}
    compaction = {"type": "compaction", "summary": payload["summary"], "details": details}
    record = {
        "type": "custom",
        "customType": SPAN_RECORD_TYPE,
        "data": {"v": 1, "payload": payload},
    }
    transcript = [_user(1, "never push to main"), _session_entry(3, compaction)]
    transcript.append(_session_entry(4, record))
    rebuilt = fold_records(transcript, Refusing())
    original, again = snapshot(live.fold.store, SID), snapshot(rebuilt.store, SID)
    assert again["rules"] == original["rules"] and again["spans"] == original["spans"]
    # The live session: pi's compaction entry and the span record change nothing more.
    live.feed(_session_entry(3, compaction))
    live.feed(_session_entry(4, record))
    assert snapshot(live.fold.store, SID)["spans"] == original["spans"]


def test_compaction_envelope_is_applied_once_per_request() -> None:
    """A pass result on the compaction-events topic is folded; a second answer is ignored."""
    store = DictStore()
    fold = LedgerFold(store)
    fold.apply(_user(1, "always run the tests"))
    [request] = fold.apply(CompactRequestEnvelope(session_id=SID, seq=2))
    payload = run_pass(request, OfflineModel())
    envelope = CompactionEnvelope(session_id=SID, seq=1, payload=OpaquePayload(**payload))
    fold.apply(envelope)
    after = canonical_json(dict(store))
    fold.apply(envelope)
    assert canonical_json(dict(store)) == after
    assert [r["words"] for r in snapshot(store, SID)["rules"]] == ["always run the tests"]


def test_newer_payload_format_is_refused_by_name() -> None:
    """A pass result of a newer stateFormat is refused and recorded; the barrier is released."""
    store = DictStore()
    fold = LedgerFold(store)
    fold.apply(_user(1, "always run the tests"))
    [request] = fold.apply(CompactRequestEnvelope(session_id=SID, seq=2))
    payload = {**run_pass(request, OfflineModel()), "stateFormat": 2}
    fold.apply_pass(payload)
    state = snapshot(store, SID)
    assert state["rules"] == [] and state["anomalies"][0]["code"] == "state-format-newer"
    assert load_head(store, SID)["pending"] is None


class Nameless:
    """A model without a name: the pass itself throws when it closes."""

    def diff(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """Answer nothing useful."""
        return {"labels": [], "narrative": "n"}


def test_a_pass_that_throws_falls_back_and_the_session_goes_on() -> None:
    """When the pass throws, a fallback answer closes nothing and releases the barrier."""
    ledger = EmbeddedLedger(Nameless())  # type: ignore[arg-type]
    ledger.feed(_user(1, "never push"))
    ledger.feed(CompactRequestEnvelope(session_id=SID, seq=2))
    ledger.feed(_user(3, "next"))
    [payload] = ledger.payloads
    assert payload["fallback"] == "pass-error:AttributeError"
    head = load_head(ledger.fold.store, SID)
    assert head["span"] == 0 and head["pending"] is None and head["n"]["u"] == 2
