"""Facts kept: values first seen in a span's tool output, used later, held by each summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sessionfold.projections.ledger.facts import facts, values_in
from sessionfold.streams.cli import app

SESSIONS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "sessions"


def test_values_in_finds_paths_hashes_ports_numbers_and_identifiers() -> None:
    """Each kind of value is recognised; slash-joined words inside a word are not paths."""
    text = (
        "wrote /src/app/config.ts and src/lib/x.ts at 3f9a2c1 on localhost:8080, "
        "took 175004 ms (1.31 s) in getThemesDir via first_kept_id; image/jpeg"
    )
    found = values_in(text)
    assert {"/src/app/config.ts", "src/lib/x.ts", "3f9a2c1", "localhost:8080"} <= found
    assert {"175004", "1.31", "getThemesDir", "first_kept_id"} <= found
    assert "/jpeg" not in found


def _message(role: str, **fields: Any) -> dict[str, Any]:
    return {"type": "message", "id": fields.pop("id", role), "message": {"role": role, **fields}}


def test_facts_count_values_each_summary_kept() -> None:
    """A value counts when first shown by a tool before the point and used after it."""
    output = "config at /src/app/config.ts, commit 3f9a2c1e, port 8080"
    entries = [
        _message("user", content="look around", id="m1"),
        _message("toolResult", toolCallId="t", content=[{"type": "text", "text": output}]),
        {"type": "compaction", "id": "c1", "summary": "see /src/app/config.ts"},
        _message(
            "assistant",
            content=[
                {
                    "type": "toolCall",
                    "id": "t2",
                    "name": "read",
                    "arguments": {"path": "/src/app/config.ts", "note": "3f9a2c1e"},
                }
            ],
        ),
    ]
    payloads = [{"record": {"entry": "c1"}, "summary": "R1 ... commit 3f9a2c1e"}]
    [row] = facts(entries, payloads)
    assert (row.point, row.entry, row.values, row.pi, row.ours) == (1, "c1", 2, 1, 1)
    assert row.piChars == len("see /src/app/config.ts")


def test_value_seen_before_the_span_does_not_count() -> None:
    """A value the user named before the tool showed it was not first seen in tool output."""
    entries = [
        _message("user", content="check /etc/hosts"),
        _message("toolResult", toolCallId="t", content=[{"type": "text", "text": "/etc/hosts"}]),
        {"type": "compaction", "id": "c1", "summary": "/etc/hosts"},
        _message("user", content="now edit /etc/hosts"),
    ]
    assert facts(entries, [])[0].values == 0


def test_facts_cli_on_a_real_session_prints_both_compactors() -> None:
    """`sessionfold facts` tabulates pi's and our counts at each compaction, with a total."""
    path = SESSIONS / "before-compaction.jsonl"
    if not path.is_file():
        pytest.skip(f"real session not found in {SESSIONS} (../shared is absent)")
    result = CliRunner().invoke(app, ["facts", str(path), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    [session] = report["sessions"]
    assert len(session["points"]) == 2
    for point in session["points"]:
        assert point["pi"] is not None and point["ours"] is not None
        assert point["pi"] <= point["values"] and point["ours"] <= point["values"]
    assert report["total"]["values"] == sum(p["values"] for p in session["points"])
    human = CliRunner().invoke(app, ["facts", str(path)])
    assert "pi kept" in human.stdout and "all sessions: 2 compaction points" in human.stdout
