"""`sessionfold ledger FILE`: state, spans, anomalies, span N, JSON, sanitized output."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sessionfold.streams.cli import app

SESSIONS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "sessions"
RUNNER = CliRunner()


def write_session(path: Path, entries: list[dict[str, Any]]) -> Path:
    """A v3 session file: header, then entries chained by parentId."""
    lines = [{"type": "session", "version": 3, "id": "cli-sess", "timestamp": "t", "cwd": "/w"}]
    parent = None
    for index, body in enumerate(entries, start=1):
        entry_id = f"{index:08x}"
        lines.append({"id": entry_id, "parentId": parent, "timestamp": "t", **body})
        parent = entry_id
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def user(text: str) -> dict[str, Any]:
    """A user message entry body."""
    return {
        "type": "message",
        "message": {"role": "user", "content": [{"type": "text", "text": text}]},
    }


def bash(call: str, command: str, output: str, code: int) -> list[dict[str, Any]]:
    """A bash call and its result."""
    block = {"type": "toolCall", "id": call, "name": "bash", "arguments": {"command": command}}
    result = {
        "role": "toolResult",
        "toolCallId": call,
        "toolName": "bash",
        "content": [{"type": "text", "text": f"{output}\n\nCommand exited with code {code}"}],
        "isError": code != 0,
    }
    return [
        {"type": "message", "message": {"role": "assistant", "content": [block]}},
        {"type": "message", "message": result},
    ]


def has_control(text: str) -> bool:
    """True when text holds a character that could drive a terminal."""
    return any(
        (ord(ch) < 32 and ch not in "\n") or 0x7F <= ord(ch) <= 0x9F or ch == "\u202e"
        for ch in text
    )


@pytest.fixture(autouse=True)
def ledger_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every run here logs under the test's own directory, never the user's state dir."""
    path = tmp_path / "log" / "ledger.jsonl"
    monkeypatch.setenv("SESSIONFOLD_LEDGER_LOG", str(path))
    return path


@pytest.fixture
def session_file(tmp_path: Path) -> Path:
    """Two spans (a pi compaction between them) with a rule, a lift and a hostile command."""
    return write_session(
        tmp_path / "s.jsonl",
        [
            user("never use tabs in python files"),
            *bash("t1", "printf '\x1b]0;pwned\x07'", "\x1b[2Jcleared\x9b", 1),
            {
                "type": "compaction",
                "summary": "pi's",
                "firstKeptEntryId": "00000001",
                "tokensBefore": 5,
            },
            user("the tabs rule no longer applies \u202e"),
        ],
    )


def test_default_output_is_the_rendered_state(session_file: Path) -> None:
    """With no option, the rendered state of the whole file is printed."""
    result = RUNNER.invoke(app, ["ledger", str(session_file)])
    assert result.exit_code == 0, result.output
    assert "## Lifted rules" in result.stdout and "R1 (lifted by u2)" in result.stdout
    assert not has_control(result.stdout)


def test_json_lists_rules_with_words_entry_and_lifted(session_file: Path) -> None:
    """`--json` gives rules as {id, words, entry, lifted}: exact words, the message's entry id."""
    result = RUNNER.invoke(app, ["ledger", str(session_file), "--json"])
    assert result.exit_code == 0, result.output
    assert not has_control(result.stdout)
    state = json.loads(result.stdout)
    assert state["rules"] == [
        {"id": "R1", "words": "never use tabs in python files", "entry": "00000001", "lifted": True}
    ]
    assert state["lifts"][0]["by"] == "u2"
    assert state["commands"][0]["exit"] == 1 and state["errors"][0]["command"] == "C1"
    assert len(state["summary"]) == state["summaryChars"] <= 12_000


def test_span_shows_the_state_as_it_was_at_that_span(session_file: Path) -> None:
    """`--span 1` shows the rule in force, as it stood before the lift."""
    result = RUNNER.invoke(app, ["ledger", str(session_file), "--span", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rules"][0]["lifted"] is False
    human = RUNNER.invoke(app, ["ledger", str(session_file), "--span", "1"])
    assert "## Rules in force" in human.stdout and "Lifted" not in human.stdout


def test_spans_and_anomalies_are_listed(session_file: Path) -> None:
    """`--spans` lists each span's trigger, ids and narrative; `--anomalies` says none."""
    spans = RUNNER.invoke(app, ["ledger", str(session_file), "--spans"])
    assert spans.exit_code == 0, spans.output
    assert "span 1: compaction at entry 00000004" in spans.stdout
    assert "span 2: end" in spans.stdout and "commands C1-C1" in spans.stdout
    assert not has_control(spans.stdout)
    anomalies = RUNNER.invoke(app, ["ledger", str(session_file), "--anomalies"])
    assert anomalies.exit_code == 0 and "no anomalies" in anomalies.stdout


def test_usage_errors_exit_2(session_file: Path) -> None:
    """Two views at once, a span past the last one, or a missing file are usage errors."""
    assert (
        RUNNER.invoke(app, ["ledger", str(session_file), "--spans", "--anomalies"]).exit_code == 2
    )
    assert RUNNER.invoke(app, ["ledger", str(session_file), "--span", "9"]).exit_code == 2
    assert RUNNER.invoke(app, ["ledger", str(session_file.with_name("none.jsonl"))]).exit_code == 2


def test_file_without_a_session_fails(tmp_path: Path) -> None:
    """A file with no session header exits 1."""
    path = tmp_path / "empty.jsonl"
    path.write_text('{"type": "message"}\n')
    assert RUNNER.invoke(app, ["ledger", str(path)]).exit_code == 1


def test_real_session_json_rules_quote_the_file() -> None:
    """On a real session every `--json` rule's words stand in a user message of the file."""
    path = SESSIONS / "large-session.jsonl"
    if not path.is_file():
        pytest.skip(f"real session not found in {SESSIONS} (../shared is absent)")
    result = RUNNER.invoke(app, ["ledger", str(path), "--json"])
    assert result.exit_code == 0, result.output
    texts = [
        "\n".join(b.get("text", "") for b in m["content"])
        for line in path.read_text().splitlines()
        if (m := json.loads(line).get("message")) and m.get("role") == "user"
    ]
    rules = json.loads(result.stdout)["rules"]
    assert rules and all(any(r["words"] in t for t in texts) for r in rules)


# --- the model port and `ledger compact` ------------------------------------------------------


def test_compact_prints_the_compaction_of_a_pass_at_the_end(session_file: Path) -> None:
    """`ledger compact FILE` runs a pass over the open span and prints its summary; `--json`
    gives the payload and the two pi entries (compaction, span record) it becomes."""
    human = RUNNER.invoke(app, ["ledger", "compact", str(session_file)])
    assert human.exit_code == 0, human.output
    assert human.stdout.startswith("# Session state") and not has_control(human.stdout)
    result = RUNNER.invoke(app, ["ledger", "compact", str(session_file), "--json"])
    data = json.loads(result.stdout)
    assert data["payload"]["record"]["trigger"] == "compact-request"
    compaction, span_record = data["entries"]
    assert (
        compaction["type"] == "compaction" and compaction["summary"] == data["payload"]["summary"]
    )
    assert compaction["details"]["producer"] == "sessionfold-ledger"
    assert span_record["customType"] == "sessionfold-ledger.span"
    assert span_record["data"]["v"] == 1


def test_compact_with_nothing_new_exits_1(tmp_path: Path) -> None:
    """A file whose last span is empty has nothing to compact."""
    path = write_session(tmp_path / "empty.jsonl", [])
    assert RUNNER.invoke(app, ["ledger", "compact", str(path)]).exit_code == 1


def test_compact_and_views_do_not_mix(session_file: Path) -> None:
    """`compact` takes no view option; a third argument is a usage error."""
    args = ["ledger", "compact", str(session_file), "--spans"]
    assert RUNNER.invoke(app, args).exit_code == 2
    assert RUNNER.invoke(app, ["ledger", "x", "y", "z"]).exit_code == 2


def test_model_option_drives_the_http_diff_model(
    session_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--model NAME` (or SESSIONFOLD_MODEL) uses the OpenAI-compatible port: the fake server
    answers every pass and the span records name the model."""
    from fake_openai import FakeOpenAI, json_answer

    def respond(request: Any) -> Any:
        ids = sorted(set(re.findall(r"^- (u\d+) \(", request.prompt, re.M)))
        items = [{"message": m, "label": "rule"} for m in ids]
        return json_answer({"labels": items, "narrative": "by the fake"})

    with FakeOpenAI(respond) as fake:
        monkeypatch.setenv("SESSIONFOLD_MODEL_BASE_URL", fake.base_url)
        monkeypatch.setenv("SESSIONFOLD_MODEL_STREAM", "0")
        result = RUNNER.invoke(app, ["ledger", str(session_file), "--spans", "--json"])
        assert result.exit_code == 0, result.output
        assert not fake.requests  # offline by default
        result = RUNNER.invoke(
            app, ["ledger", str(session_file), "--spans", "--json", "--model", "fake-model"]
        )
        assert result.exit_code == 0, result.output
        spans = json.loads(result.stdout)["spans"]
        assert [s["model"] for s in spans] == ["fake-model", "fake-model"]
        assert [s["narrative"] for s in spans] == ["by the fake", "by the fake"]
        monkeypatch.setenv("SESSIONFOLD_MODEL", "env-model")
        result = RUNNER.invoke(app, ["ledger", "compact", str(session_file), "--json"])
        assert json.loads(result.stdout)["payload"]["record"]["model"] == "env-model"
        assert fake.models()[-1] == "env-model"


def test_a_model_that_cannot_be_configured_is_a_usage_error(
    session_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unknown provider with no base URL exits 2 and names the setting."""
    monkeypatch.delenv("SESSIONFOLD_MODEL_BASE_URL", raising=False)
    result = RUNNER.invoke(app, ["ledger", str(session_file), "--model", "nowhere/model"])
    assert result.exit_code == 2 and "SESSIONFOLD_MODEL_BASE_URL" in result.output


def test_turns_mode_is_opt_in_from_the_command_line(session_file: Path) -> None:
    """`--narrative-mode turns` runs the conversation (five calls a pass, offline here)."""
    result = RUNNER.invoke(
        app, ["ledger", str(session_file), "--spans", "--json", "--narrative-mode", "turns"]
    )
    assert result.exit_code == 0, result.output
    spans = json.loads(result.stdout)["spans"]
    assert [(s["narrativeKind"], s["calls"]) for s in spans] == [("turns", 5), ("turns", 5)]
    bad = RUNNER.invoke(app, ["ledger", str(session_file), "--narrative-mode", "chatty"])
    assert bad.exit_code == 2
