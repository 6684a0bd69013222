"""What the ledger reads from Codex shell outputs and user turns (issue 38, items 3 to 6).

Codex writes how a command ended into its output (a JSON wrapper, a freeform or unified exec
header), runs long commands as unified exec sessions polled by `write_stdin`, and its VS Code
extension wraps the user's request in IDE context. Rollout lines go through the real
translator, then the ledger fold.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.events.envelope import EntryEnvelope, EntryPayload
from sessionfold.events.formats.codex import CodexTranslator
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.projections.ledger.render import render
from sessionfold.projections.ledger.state import snapshot
from sessionfold.projections.ledger.text import user_words
from sessionfold.streams.runtime.ledger_loop import fold_records

SID = "019b64e5-57fa-7463-b644-fba7e456f905"
T0 = "2026-01-02T03:04:05.000Z"
META = {
    "timestamp": T0,
    "type": "session_meta",
    "payload": {"id": SID, "timestamp": T0, "cwd": "/w", "model_provider": "openai"},
}


def item(payload: dict[str, Any]) -> dict[str, Any]:
    return {"timestamp": T0, "type": "response_item", "payload": payload}


def user_line(text: str) -> dict[str, Any]:
    content = [{"type": "input_text", "text": text}]
    return item({"type": "message", "role": "user", "content": content})


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    body = {"type": "function_call", "name": name, "call_id": call_id}
    return item({**body, "arguments": json.dumps(arguments)})


def output(call_id: str, out: str) -> dict[str, Any]:
    return item({"type": "function_call_output", "call_id": call_id, "output": out})


def tokens() -> dict[str, Any]:
    """A token_count: it closes the open response, as Codex writes one after each."""
    usage = {"input_tokens": 10, "cached_input_tokens": 0, "output_tokens": 5}
    payload = {"type": "token_count", "info": {"last_token_usage": usage}}
    return {"timestamp": T0, "type": "event_msg", "payload": payload}


def envelopes(lines: list[dict[str, Any]]) -> list[EntryEnvelope]:
    """The rollout's entries (the header left out) as envelopes, seq 1, 2, ..."""
    translator = CodexTranslator()
    entries: list[dict[str, Any]] = []
    for number, line in enumerate([META, *lines], 1):
        entries += translator.feed(line, number)
    entries += translator.close()
    return [
        EntryEnvelope(session_id=SID, seq=seq, payload=EntryPayload(entry=entry))
        for seq, entry in enumerate(entries[1:], 1)
    ]


# --- item 5: IDE context is not the user's words -----------------------------------------------


def _ide(request: str, tabs: list[str]) -> str:
    listed = "".join(f"- {tab}: {tab}\n" for tab in tabs)
    return (
        "# Context from my IDE setup:\n\n## Active file: src/app.py\n\n"
        f"## Open tabs:\n{listed}\n## My request for Codex:\n{request}"
    )


_TABS = st.lists(st.from_regex(r"[a-z]{1,8}/[a-z_]{1,12}\.(py|ts|md)", fullmatch=True), max_size=40)


@settings(max_examples=300)
@given(st.text(min_size=1, max_size=200).filter(str.strip), _TABS)
def test_only_the_request_of_an_ide_wrapped_turn_is_the_users_words(
    request: str, tabs: list[str]
) -> None:
    """Property: the words of an IDE-wrapped turn are its request alone, whatever the tabs."""
    message = {"role": "user", "content": [{"type": "text", "text": _ide(request, tabs)}]}
    assert user_words(message) == user_words({"role": "user", "content": request})


def test_the_now_line_and_rules_quote_the_request_not_the_tabs() -> None:
    """A pass over an IDE-wrapped turn: the rule is the request's words and Now quotes the
    request, even behind 400 open tabs (which cut the request off before)."""
    tabs = [f"pkg/module_{n}.py" for n in range(400)]
    request = "Never push to main without running the tests first."
    run = fold_records(envelopes([user_line(_ide(request, tabs))]), OfflineModel())
    state = snapshot(run.store, SID)
    assert [rule["words"] for rule in state["rules"]] == [request]
    assert state["now"] == f"Last user request (u1): {request}"
    assert "Open tabs" not in render(state)[0]
