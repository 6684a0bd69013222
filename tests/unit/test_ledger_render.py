"""Rendering a ledger state into the compaction summary."""

from __future__ import annotations

import json
from typing import Any

from sessionfold.projections.ledger.render import render


def _state(commands: int = 0, rule: str = "never push to main") -> dict[str, Any]:
    return {
        "rules": [
            {"id": "R1", "u": "u1", "entry": "e1", "words": rule, "lifted": None},
            {
                "id": "R2",
                "u": "u2",
                "entry": "e2",
                "words": "use tabs",
                "lifted": {"by": "u3", "entry": "e3", "span": 1, "replacedBy": "R3"},
            },
        ],
        "decisions": [{"id": "D1", "text": "keep npm", "evidence": ["C1"]}],
        "deadEnds": [],
        "values": [{"id": "V1", "value": "8080", "turn": "C1", "what": "port"}],
        "commands": [
            {"id": f"C{i}", "command": f"echo {i}", "exit": 0, "status": "ok", "error": None}
            for i in range(1, commands + 1)
        ],
        "errors": [{"id": "E1", "tool": "bash", "command": "C1", "head": "boom"}],
        "spans": [{"span": 1, "narrative": "did things"}],
        "now": "testing",
        "world": {"branch": "main"},
    }


def test_rules_come_first_with_the_users_exact_words_json_quoted() -> None:
    """Rules in force lead, quoted exactly; lifted rules name who lifted and what replaced."""
    rule = 'say "hi"\nthen\tstop'
    summary, dropped = render(_state(3, rule))
    assert summary.index("## Rules in force") < summary.index("## Commands")
    assert f"- R1 (u1, entry e1): {json.dumps(rule, ensure_ascii=False)}" in summary
    assert "R2 (lifted by u3, replaced by R3)" in summary
    assert dropped == {}


def test_oldest_commands_give_way_first_and_the_size_holds() -> None:
    """Over the size, the oldest commands are left out first and the omission is said."""
    summary, dropped = render(_state(500), limit=2_000)
    assert len(summary) <= 2_000
    assert dropped["commands"] > 0 and "older commands left out for size" in summary
    assert "C500" in summary and "C1 exit" not in summary
    assert "never push to main" in summary and "## Errors" in summary


def test_nothing_but_a_cut_fits_a_tiny_size() -> None:
    """Even a size smaller than the rules alone is never exceeded."""
    summary, _ = render(_state(10, "x" * 5_000), limit=500)
    assert len(summary) <= 500


def test_control_characters_never_reach_the_summary() -> None:
    """Commands, errors and rule words come out without terminal control characters."""
    state = _state(1, "a\x1b[2Jb\x9b")
    state["commands"][0]["command"] = "printf '\x1b]0;x\x07'"
    state["errors"][0]["head"] = "\u202eevil"
    summary, _ = render(state)
    assert not any(
        (ord(ch) < 32 and ch != "\n") or 0x7F <= ord(ch) <= 0x9F or ch == "\u202e" for ch in summary
    )
