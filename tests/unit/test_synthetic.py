"""Synthetic pi sessions: deterministic, well-formed, and shaped like the real files."""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sessionfold.events.entries import parse_entry
from sessionfold.streams.cli import app
from sessionfold.streams.tools.synthetic import (
    MAX_TOOL_OUTPUT,
    RULES,
    Entry,
    generate_fleet,
    generate_session,
    session_bytes,
    session_file_name,
    session_seeds,
    write_fleet,
)

FLEET_SEED = 7
FLEET_SESSIONS = 20
FLEET_TURNS = 200
HEX8 = re.compile(r"^[0-9a-f]{8}$")
FILE_NAME = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-\d{3}Z_[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-"
    r"[89ab][0-9a-f]{3}-[0-9a-f]{12}\.jsonl$"
)


@pytest.fixture(scope="module")
def fleet() -> list[list[Entry]]:
    """20 sessions of 200 assistant messages: enough for the distribution checks."""
    return list(generate_fleet(FLEET_SEED, FLEET_SESSIONS, FLEET_TURNS))


def messages(session: list[Entry], role: str | None = None) -> Iterator[dict[str, Any]]:
    for entry in session[1:]:
        if entry["type"] == "message" and (role is None or entry["message"]["role"] == role):
            yield entry["message"]


def tool_calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [block for block in message["content"] if block["type"] == "toolCall"]


def user_texts(session: list[Entry]) -> list[str]:
    return [m["content"][0]["text"] for m in messages(session, "user")]


def nearest_rank(values: list[int], fraction: float) -> int:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def parse_iso(stamp: str) -> datetime:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp), stamp
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


# --- determinism ---------------------------------------------------------------------------


def test_same_seed_writes_byte_identical_files(tmp_path: Path) -> None:
    first = write_fleet(tmp_path / "a", sessions=3, turns=40, seed=11)
    second = write_fleet(tmp_path / "b", sessions=3, turns=40, seed=11)
    assert [w.path.name for w in first] == [w.path.name for w in second]
    for one, two in zip(first, second, strict=True):
        assert one.path.read_bytes() == two.path.read_bytes()


def test_another_seed_gives_other_sessions() -> None:
    one = session_bytes(next(generate_fleet(11, 1, 40)))
    two = session_bytes(next(generate_fleet(12, 1, 40)))
    assert one != two


def test_a_session_does_not_depend_on_fleet_size() -> None:
    assert session_seeds(5, 3) == session_seeds(5, 8)[:3]


@pytest.mark.parametrize("turns", [0, -3])
def test_turns_must_be_positive(turns: int) -> None:
    with pytest.raises(ValueError):
        generate_session(1, turns)


# --- file format ---------------------------------------------------------------------------


def test_every_line_is_compact_json_with_a_trailing_newline(fleet: list[list[Entry]]) -> None:
    data = session_bytes(fleet[0])
    assert data.endswith(b"\n") and not data.endswith(b"\n\n")
    for line in data.decode("utf-8").split("\n")[:-1]:
        value = json.loads(line)
        assert line == json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_header_is_version_3_and_names_the_file(fleet: list[list[Entry]]) -> None:
    for session in fleet:
        header = session[0]
        assert set(header) == {"type", "version", "id", "timestamp", "cwd"}
        assert header["type"] == "session" and header["version"] == 3
        assert FILE_NAME.match(session_file_name(header))
        assert session[1]["type"] == "model_change"
        assert session[2]["type"] == "thinking_level_change"
        assert session[3]["type"] == "message"


def test_entries_validate_against_the_v3_models(fleet: list[list[Entry]]) -> None:
    for entry in fleet[0]:
        parse_entry(entry)


def test_ids_are_unique_and_chain_to_the_previous_entry(fleet: list[list[Entry]]) -> None:
    for session in fleet:
        entries = session[1:]
        ids = [entry["id"] for entry in entries]
        assert all(HEX8.match(entry_id) for entry_id in ids)
        assert len(set(ids)) == len(ids)
        assert entries[0]["parentId"] is None
        for previous, entry in itertools.pairwise(entries):
            assert entry["parentId"] == previous["id"]


def test_timestamps_never_go_backwards(fleet: list[list[Entry]]) -> None:
    for session in fleet:
        stamps = [parse_iso(entry["timestamp"]) for entry in session]
        assert stamps == sorted(stamps)
        for message in messages(session):
            assert isinstance(message["timestamp"], int)


@pytest.mark.parametrize("turns", [1, 2, 7, 50])
def test_assistant_count_is_exactly_turns(turns: int) -> None:
    for session in generate_fleet(3, 4, turns):
        assert sum(1 for _ in messages(session, "assistant")) == turns


def test_fleet_has_exactly_turns_assistant_messages(fleet: list[list[Entry]]) -> None:
    for session in fleet:
        assert sum(1 for _ in messages(session, "assistant")) == FLEET_TURNS


def test_tool_results_answer_a_call_of_the_latest_assistant(fleet: list[list[Entry]]) -> None:
    for session in fleet:
        open_calls: dict[str, str] = {}
        for message in messages(session):
            if message["role"] == "assistant":
                open_calls = {call["id"]: call["name"] for call in tool_calls(message)}
            elif message["role"] == "toolResult":
                assert open_calls.pop(message["toolCallId"]) == message["toolName"]
                assert [block["type"] for block in message["content"]] == ["text"]


def test_assistant_messages_carry_usage_and_cost(fleet: list[list[Entry]]) -> None:
    for message in messages(fleet[0], "assistant"):
        usage = message["usage"]
        counts = [usage[key] for key in ("input", "output", "cacheRead", "cacheWrite")]
        assert usage["totalTokens"] == sum(counts)
        assert set(usage["cost"]) == {"input", "output", "cacheRead", "cacheWrite", "total"}
        assert {"api", "provider", "model", "stopReason"} <= set(message)
        if message["stopReason"] in ("aborted", "error"):
            assert message["errorMessage"]


def test_context_grows_over_a_session(fleet: list[list[Entry]]) -> None:
    for session in fleet:
        prompts = [
            m["usage"]["totalTokens"] - m["usage"]["output"]
            for m in messages(session, "assistant")
            if m["usage"]["totalTokens"]
        ]
        assert prompts == sorted(prompts)
        assert prompts[0] >= 8_000
        assert prompts[-1] > prompts[0] + 20_000


# --- shape of the content ------------------------------------------------------------------


def test_tool_output_sizes_match_the_real_files(fleet: list[list[Entry]]) -> None:
    sizes = [len(m["content"][0]["text"]) for s in fleet for m in messages(s, "toolResult")]
    assert 100 <= nearest_rank(sizes, 0.5) <= 400
    assert 1_800 <= nearest_rank(sizes, 0.9) <= 6_000
    assert 30_000 <= max(sizes) <= MAX_TOOL_OUTPUT


def test_tool_mix_matches_the_real_files(fleet: list[list[Entry]]) -> None:
    names = Counter(
        call["name"] for s in fleet for m in messages(s, "assistant") for call in tool_calls(m)
    )
    total = sum(names.values())
    share = {name: count / total for name, count in names.items()}
    assert 0.40 <= share["bash"] <= 0.50
    assert 0.23 <= share["edit"] <= 0.33
    assert 0.19 <= share["read"] <= 0.29
    assert 0.01 <= share["write"] <= 0.06


def test_arguments_look_like_the_tools(fleet: list[list[Entry]]) -> None:
    keys = {"bash": {"command"}, "read": {"path"}, "edit": {"path", "oldText", "newText"}}
    keys["write"] = {"path", "content"}
    for session in fleet[:3]:
        for message in messages(session, "assistant"):
            for call in tool_calls(message):
                assert keys[call["name"]] <= set(call["arguments"])
                assert set(call) == {"type", "id", "name", "arguments"}


def test_rules_are_stated_and_some_withdrawn_later(fleet: list[list[Entry]]) -> None:
    stated_sessions = 0
    withdrawals = 0
    for session in fleet:
        texts = user_texts(session)
        for rule in RULES:
            stated = [i for i, t in enumerate(texts) if any(s in t for s in rule.statements)]
            lifted = [i for i, t in enumerate(texts) if any(w in t for w in rule.withdrawals)]
            if lifted:
                assert stated and stated[0] < lifted[0]
                withdrawals += 1
        stated_sessions += any(
            any(s in t for s in rule.statements) for rule in RULES for t in texts
        )
    assert stated_sessions == len(fleet)
    assert withdrawals >= len(fleet) // 2
    ordinary = [t for s in fleet for t in user_texts(s) if not re.search("never|always|now on", t)]
    assert len(ordinary) > withdrawals * 3


def test_thinking_blocks_appear_on_some_messages(fleet: list[list[Entry]]) -> None:
    thinking = [
        block
        for s in fleet
        for m in messages(s, "assistant")
        for block in m["content"]
        if block["type"] == "thinking"
    ]
    assert thinking
    assert any(block.get("thinkingSignature") for block in thinking)


def test_chains_end_in_text_and_some_runs_are_long(fleet: list[list[Entry]]) -> None:
    longest = 0
    for session in fleet:
        run = 0
        for message in messages(session, "assistant"):
            if message["stopReason"] == "toolUse":
                run += 1
                longest = max(longest, run)
            else:
                run = 0
            if message["stopReason"] == "stop":
                assert [block["type"] for block in message["content"]][-1] == "text"
                assert not tool_calls(message)
    assert longest >= 25


def test_aborted_turns_and_orphan_calls_occur(fleet: list[list[Entry]]) -> None:
    stops = Counter(m["stopReason"] for s in fleet for m in messages(s, "assistant"))
    assistants = FLEET_SESSIONS * FLEET_TURNS
    assert 0.01 <= stops["aborted"] / assistants <= 0.08
    assert stops["error"] >= 1
    empty = [m for s in fleet for m in messages(s, "assistant") if not m["content"]]
    assert any(m["stopReason"] == "aborted" for m in empty)
    orphans: Counter[str] = Counter()  # calls never answered, by the stopReason of their message
    for session in fleet:
        pending: set[str] = set()
        stop = ""
        for message in [*messages(session), {"role": "assistant", "content": [], "stopReason": ""}]:
            if message["role"] == "assistant":
                orphans[stop] += len(pending)
                pending = {call["id"] for call in tool_calls(message)}
                stop = message["stopReason"]
            elif message["role"] == "toolResult":
                pending.discard(message["toolCallId"])
    assert orphans["aborted"] >= 1
    assert orphans["error"] >= 1


def test_tool_call_ids_are_reused_across_turns(fleet: list[list[Entry]]) -> None:
    reused = 0
    for session in fleet:
        seen: Counter[str] = Counter()
        for message in messages(session, "assistant"):
            ids = [call["id"] for call in tool_calls(message)]
            assert len(set(ids)) == len(ids)  # unique within one message
            seen.update(ids)
        reused += any(count > 1 for count in seen.values())
    assert reused >= 1
    styles = {
        call["id"].split("_")[0]
        for s in fleet
        for m in messages(s, "assistant")
        for call in tool_calls(m)
    }
    assert {"toolu", "bash"} <= styles


def test_errors_details_and_user_bash_runs_occur(fleet: list[list[Entry]]) -> None:
    results = [m for s in fleet for m in messages(s, "toolResult")]
    assert 0.01 <= sum(m["isError"] for m in results) / len(results) <= 0.10
    diffs = [m for m in results if m["toolName"] == "edit" and "diff" in m.get("details", {})]
    assert diffs
    runs = [m for s in fleet for m in messages(s, "bashExecution")]
    assert runs
    for run in runs:
        assert set(run) == {
            "role", "command", "output", "exitCode", "cancelled", "truncated", "timestamp"
        }  # fmt: skip
        assert run["cancelled"] is False and run["truncated"] is False


# --- the command ---------------------------------------------------------------------------


def test_cli_writes_the_sessions_and_reports_totals(tmp_path: Path) -> None:
    out = tmp_path / "nested" / "out"
    result = CliRunner().invoke(
        app, ["generate", "--sessions", "3", "--turns", "30", "--seed", "4", str(out)]
    )
    assert result.exit_code == 0, result.output
    files = sorted(out.iterdir())
    assert len(files) == 3 and all(FILE_NAME.match(f.name) for f in files)
    last = result.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"wrote 3 sessions \((\d+) entries, (\d+) bytes\) to (.+)", last)
    assert match, last
    lines = sum(len(f.read_bytes().splitlines()) for f in files)
    assert int(match[1]) == lines - 3  # headers are not entries
    assert int(match[2]) == sum(f.stat().st_size for f in files)
    assert match[3] == str(out)
    again = tmp_path / "again"
    CliRunner().invoke(
        app, ["generate", "--sessions", "3", "--turns", "30", "--seed", "4", str(again)]
    )
    assert [f.read_bytes() for f in files] == [f.read_bytes() for f in sorted(again.iterdir())]


def test_cli_defaults_write_one_session_of_200_turns(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["generate", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (written,) = tmp_path.iterdir()
    session = [json.loads(line) for line in written.read_text("utf-8").splitlines()]
    assert sum(1 for _ in messages(session, "assistant")) == 200


@pytest.mark.parametrize(
    "options",
    [["--sessions", "0"], ["--turns", "0"], ["--seed", "-1"], ["--sessions", "many"]],
)
def test_cli_rejects_bad_values_with_exit_2(tmp_path: Path, options: list[str]) -> None:
    result = CliRunner().invoke(app, ["generate", *options, str(tmp_path / "out")])
    assert result.exit_code == 2
    assert not (tmp_path / "out").exists()


def test_cli_refuses_a_file_as_out(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    result = CliRunner().invoke(app, ["generate", str(target)])
    assert result.exit_code == 2


@pytest.mark.parametrize("cli", ["0.169", "0.77", "0.40"])
def test_cli_version_picks_the_codex_generation(tmp_path: Path, cli: str) -> None:
    """`--cli-version` writes that Codex generation's rollouts; the default is the current."""
    args = ["generate", "--format", "codex", "--turns", "2", "--seed", "5"]
    result = CliRunner().invoke(app, [*args, "--cli-version", cli, str(tmp_path / cli)])
    assert result.exit_code == 0, result.output
    (written,) = (tmp_path / cli).rglob("*.jsonl")
    meta = json.loads(written.read_text("utf-8").splitlines()[0])
    assert meta["payload"]["cli_version"] == cli + ".0"
    if cli == "0.169":
        CliRunner().invoke(app, [*args, str(tmp_path / "default")])
        (default,) = (tmp_path / "default").rglob("*.jsonl")
        assert default.read_bytes() == written.read_bytes()


@pytest.mark.parametrize(("file_format", "cli"), [("codex", "9.9"), ("claude-code", "0.169")])
def test_cli_version_refuses_what_it_cannot_write(
    tmp_path: Path, file_format: str, cli: str
) -> None:
    args = ["generate", "--format", file_format, "--cli-version", cli, str(tmp_path / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert not (tmp_path / "out").exists()
