"""What the input lacks, the render repairs and says so: a Claude Code transcript with a result
line lost (dropped, or cut short and dead-lettered) still renders a context a provider accepts,
the call answered by pi-ai's placeholder; `context` lists the repair and `ledger --anomalies`
the call closed without its result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from sessionfold.projections.views.validity import MISSING_RESULT, problems
from sessionfold.streams.cli import app

RUNNER = CliRunner()


BASE = {"sessionId": "s1", "cwd": "/w", "timestamp": "2026-12-01T10:00:00.000Z"}


def _line(kind: str, uuid: str, parent: str | None, message: dict[str, Any]) -> bytes:
    line = {**BASE, "type": kind, "uuid": uuid, "parentUuid": parent, "message": message}
    return json.dumps(line).encode()


def _transcript() -> list[bytes]:
    """A prompt, one response of two parallel Bash calls (a, b) whose results hang under their
    own calls' lines, the next prompt under the last result written, and a reply."""

    def call(call_id: str) -> dict[str, Any]:
        block = {"type": "tool_use", "id": call_id, "name": "Bash", "input": {"command": "ls"}}
        return {"id": "msg_1", "role": "assistant", "model": "m", "content": [block]}

    def result(call_id: str) -> dict[str, Any]:
        block = {"type": "tool_result", "tool_use_id": call_id, "content": f"out {call_id}"}
        return {"role": "user", "content": [block]}

    reply = {"id": "msg_2", "role": "assistant", "model": "m",
             "content": [{"type": "text", "text": "done"}]}  # fmt: skip
    return [
        _line("user", "u1", None, {"role": "user", "content": "go"}),
        _line("assistant", "a1", "u1", call("a")),
        _line("assistant", "a2", "a1", call("b")),
        _line("user", "ra", "a1", result("a")),
        _line("user", "rb", "a2", result("b")),
        _line("user", "u2", "rb", {"role": "user", "content": "next"}),
        _line("assistant", "a3", "u2", reply),
    ]


@pytest.mark.parametrize("damage", ["dropped", "cut"])
def test_a_lost_result_line_is_answered_and_reported(tmp_path: Path, damage: str) -> None:
    lines = _transcript()
    lost = 3  # a's result
    if damage == "dropped":
        del lines[lost]
    else:
        lines[lost] = lines[lost][: len(lines[lost]) // 2]  # a line cut short: a dead letter
    main = tmp_path / "s1.jsonl"
    main.write_bytes(b"\n".join(lines) + b"\n")
    call = "a"
    result = RUNNER.invoke(app, ["context", str(main), "--format", "json"])
    assert result.exit_code == 0, result.output
    view = orjson.loads(result.stdout)
    messages = view["messages"]
    assert problems(messages) == []
    (placeholder,) = [m for m in messages if m.get("toolCallId") == call]
    assert placeholder["isError"] is True
    assert placeholder["content"] == [{"type": "text", "text": MISSING_RESULT}]
    assert {"code": "call-without-result", "toolCallId": call} in view["repairs"]

    ledger = RUNNER.invoke(app, ["ledger", str(main), "--anomalies", "--json"])
    assert ledger.exit_code == 0, ledger.output
    found = json.loads(ledger.stdout)["anomalies"]
    assert any(a["code"] == "call-without-result" and a["calls"] >= 1 for a in found)
