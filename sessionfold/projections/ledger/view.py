"""The ledger state as readers see it: `sessionfold ledger --json`, `fold --json`, the state API.

The snapshot (state.py) with the rules in their documented form (`{id, words, entry, lifted}`),
the lifts and where each rule's words sit, and the rendered summary with its size.
"""

from __future__ import annotations

from typing import Any

from sessionfold.projections.ledger.config import LedgerConfig
from sessionfold.projections.ledger.render import render
from sessionfold.projections.ledger.state import load_head, snapshot
from sessionfold.projections.store import Store


def ledger_view(
    store: Store, session_id: str, config: LedgerConfig, at_span: int | None = None
) -> dict[str, Any] | None:
    """The session's ledger state, JSON-ready; None when the ledger never saw the session."""
    if load_head(store, session_id) is None:
        return None
    state = snapshot(store, session_id, at_span=at_span)
    summary, cap_fit = render(state, config.summary_chars, config.render_command_chars)
    rules = state.pop("rules")
    return {
        **state,
        "rules": [
            {"id": r["id"], "words": r["words"], "entry": r["entry"], "lifted": bool(r["lifted"])}
            for r in rules
        ],
        "lifts": [{"rule": r["id"], "u": r["u"], **r["lifted"]} for r in rules if r.get("lifted")],
        "ruleSources": [
            {"id": r["id"], "u": r["u"], "start": r["start"], "end": r["end"]} for r in rules
        ],
        "summary": summary,
        "summaryChars": len(summary),
        "capFit": cap_fit,
    }
