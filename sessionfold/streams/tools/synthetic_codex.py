"""Synthetic Codex CLI rollouts, shaped like real ones, for tests of the Codex mapping.

A rollout is `session_meta`, the injected turns (developer permissions, AGENTS.md, the
`<environment_context>`), then per user turn: `turn_context`, the user message (and its
`user_message` event), and model responses of reasoning (with encrypted content) + tool calls
(several in parallel at times: `shell` with an argv, `exec_command`, `apply_patch`), each
response closed by a `token_count`, then the outputs (a shell one failing with its exit code),
and a final answer. Halfway through, a `compacted` line (local or remote, by seed) with its
`context_compacted` event; here and there an event kind or a line type no reader knows.

Everything is drawn from one `random.Random(seed)`: no clock, no `uuid4`, so the same seed and
turns give the same lines. All text comes from the word lists here.
"""

from __future__ import annotations

import base64
import json
import random
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sessionfold.streams.tools.synthetic import WrittenSession, session_seeds

Line = dict[str, Any]

CLI_VERSION = "0.77.0"
_EPOCH = datetime(2025, 12, 1, tzinfo=UTC)
_WORDS = (
    "cache", "ledger", "parser", "config", "window", "budget", "stream", "offset", "summary",
    "worker", "queue", "schema", "index", "record", "buffer", "handler", "client", "payload",
    "cursor", "limit", "retry", "timeout", "digest", "marker", "branch", "prompt", "model",
)  # fmt: skip
_FILES = ("src/app.py", "src/cache.py", "src/ledger.py", "tests/test_app.py", "README.md")
_RULES = (
    "always run the tests with -q before you answer",
    "never edit files under vendor/",
    "use ruff for formatting, not black",
    "keep commit messages under one line",
)
_COMMANDS = (
    "ls -la", "rg -n {w} src", "sed -n 1,80p {f}", "cat {f}", "git status --short",
    "python -m pytest -q tests/test_app.py", "git diff --stat",
)  # fmt: skip


class _Clock:
    """Rollout timestamps: a start drawn from the seed, then small random steps."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.now = _EPOCH + timedelta(seconds=rng.randrange(90 * 86_400))

    def tick(self, most_ms: int = 3_000) -> str:
        self.now += timedelta(milliseconds=self.rng.randrange(1, most_ms))
        return self.now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{self.now.microsecond // 1000:03d}Z"


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."


def _encrypted(rng: random.Random) -> str:
    return "gAAAAA" + base64.b64encode(rng.randbytes(rng.randrange(200, 1200))).decode()


def _output_rows(rng: random.Random) -> str:
    return "\n".join(
        f"{rng.choice(_FILES)}:{rng.randrange(1, 400)}: {_sentence(rng, 5)}"
        for _ in range(rng.randrange(1, 30))
    )


def generate_codex_session(seed: int, turns: int) -> list[Line]:
    """The lines of one synthetic Codex rollout with `turns` user turns (deterministic per seed)."""
    rollout = _Rollout(random.Random(seed))
    for turn in range(turns):
        if turns >= 3 and turn == turns // 2:
            rollout.compact()
        rollout.turn(first=turn == 0)
    return rollout.lines


def _text(role: str, words: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": words}]}


class _Rollout:
    """One rollout being written: its lines, clock, context size and model."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.clock = _Clock(rng)
        self.lines: list[Line] = []
        self.cwd = f"/home/dev/{rng.choice(_WORDS)}-{rng.choice(_WORDS)}"
        self.tokens = 6_000 + rng.randrange(4_000)
        self.calls = 0  # the first call is a failing shell command: every rollout has one
        self.model = rng.choice(("gpt-5.1-codex", "gpt-5.2-codex"))
        session = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        start = self.clock.tick()
        meta = {
            "id": session,
            "timestamp": start,
            "cwd": self.cwd,
            "originator": "codex_cli_rs",
            "cli_version": CLI_VERSION,
            "instructions": None,
            "source": "cli",
            "model_provider": "openai",
            "git": {"branch": "main", "commit_hash": f"{rng.getrandbits(160):040x}"},
        }
        self.lines.append({"timestamp": start, "type": "session_meta", "payload": meta})
        self.item(_text("developer", "<permissions instructions>workspace-write</permissions>"))
        rules = f"# AGENTS.md instructions for {self.cwd}\n\n<INSTRUCTIONS>\n- {_RULES[0]}\n"
        self.item(_text("user", rules + "</INSTRUCTIONS>"))
        context = f"<environment_context>\n  <cwd>{self.cwd}</cwd>\n</environment_context>"
        self.item(_text("user", context))

    def add(self, kind: str, payload: dict[str, Any], most_ms: int = 3_000) -> None:
        self.lines.append({"timestamp": self.clock.tick(most_ms), "type": kind, "payload": payload})

    def item(self, payload: dict[str, Any]) -> None:
        self.add("response_item", payload)

    def event(self, payload: dict[str, Any]) -> None:
        self.add("event_msg", payload, 50)

    def token_count(self) -> None:
        """The usage event Codex writes when a model response completes."""
        rng = self.rng
        self.tokens += rng.randrange(200, 3_000)
        out = rng.randrange(20, 800)
        last = {
            "input_tokens": self.tokens,
            "cached_input_tokens": max(self.tokens - rng.randrange(0, 2_000), 0),
            "output_tokens": out,
            "reasoning_output_tokens": out // 2,
            "total_tokens": self.tokens + out,
        }
        info = {
            "total_token_usage": last,
            "last_token_usage": last,
            "model_context_window": 272_000,
        }
        self.event({"type": "token_count", "info": info, "rate_limits": None})

    def turn(self, first: bool) -> None:
        """One user turn: context, the ask, responses with tool calls, the answer."""
        rng = self.rng
        if not first and rng.random() < 0.2:
            self.model = rng.choice(("gpt-5.1-codex", "gpt-5.2-codex", "gpt-5.1-codex-mini"))
        context = {
            "cwd": self.cwd,
            "approval_policy": "on-request",
            "sandbox_policy": {"type": "workspace-write", "network_access": False},
            "model": self.model,
            "effort": rng.choice(("low", "medium", "high")),
            "summary": "auto",
        }
        self.add("turn_context", context)
        self.event({"type": "task_started", "model_context_window": 272_000})
        ask = _sentence(rng, rng.randrange(5, 20))
        if rng.random() < 0.4:
            ask += " Please " + rng.choice(_RULES) + "."
        self.item(_text("user", ask))
        self.event({"type": "user_message", "message": ask, "images": []})
        for _ in range(rng.randrange(1, 4)):
            self.response()
        answer = _sentence(rng, rng.randrange(8, 40))
        reasoning = {"type": "reasoning", "summary": [], "content": None}
        self.item({**reasoning, "encrypted_content": _encrypted(rng)})
        self.item(_text("assistant", answer))
        self.event({"type": "agent_message", "message": answer})
        self.token_count()
        self.event({"type": "task_complete", "last_agent_message": answer})
        if rng.random() < 0.15:
            self.add("future_record_kind", {"note": rng.choice(_WORDS)})

    def response(self) -> None:
        """One model response (reasoning, 1 to 3 parallel tool calls), then the outputs."""
        rng = self.rng
        summary = _sentence(rng, rng.randrange(4, 12))
        reasoning = {"type": "reasoning", "summary": [{"type": "summary_text", "text": summary}]}
        self.item({**reasoning, "content": None, "encrypted_content": _encrypted(rng)})
        self.event({"type": "agent_reasoning", "text": summary})
        issued = [self.call() for _ in range(rng.choice((1, 1, 1, 2, 3)))]
        self.token_count()
        for call_id, kind, failing in issued:
            self.output(call_id, kind, failing)
            if rng.random() < 0.1:
                self.event({"type": "future_event_kind", "detail": rng.choice(_WORDS)})

    def call(self) -> tuple[str, str, bool]:
        """One tool call item: `shell` with an argv, `exec_command`, or `apply_patch`."""
        rng = self.rng
        call_id = f"call_{rng.getrandbits(96):024x}"
        kind = rng.choice(("shell", "shell", "exec_command", "apply_patch"))
        kind = "shell" if self.calls == 0 else kind
        failing = self.calls == 0 or (kind != "apply_patch" and rng.random() < 0.1)
        self.calls += 1
        command = rng.choice(_COMMANDS).format(w=rng.choice(_WORDS), f=rng.choice(_FILES))
        if kind == "apply_patch":
            patch = f"*** Begin Patch\n*** Update File: {rng.choice(_FILES)}\n@@\n"
            patch += f"-{_sentence(rng, 4)}\n+{_sentence(rng, 4)}\n*** End Patch"
            call = {"type": "custom_tool_call", "status": "completed", "call_id": call_id}
            self.item({**call, "name": "apply_patch", "input": patch})
            return call_id, kind, failing
        if kind == "shell":
            args: dict[str, Any] = {"command": ["bash", "-lc", command], "workdir": self.cwd}
            args["timeout_ms"] = 120_000
        else:
            args = {"cmd": command, "yield_time_ms": 1000}
        arguments = json.dumps(args)
        self.item(
            {"type": "function_call", "name": kind, "arguments": arguments, "call_id": call_id}
        )
        return call_id, kind, failing

    def output(self, call_id: str, kind: str, failing: bool) -> None:
        """A call's output in the shape its tool writes, with its exit code."""
        rng = self.rng
        code = rng.choice((1, 2, 127)) if failing else 0
        body = f"error: {_sentence(rng, 6)}" if failing else _output_rows(rng)
        wall = rng.randrange(1, 5_000) / 1000
        if kind == "apply_patch":
            done = f"Success. Updated the following files:\nM {_FILES[0]}\n"
            output = json.dumps(
                {"output": done, "metadata": {"exit_code": 0, "duration_seconds": wall}}
            )
            self.item({"type": "custom_tool_call_output", "call_id": call_id, "output": output})
            return
        if kind == "shell":
            output = json.dumps(
                {"output": body, "metadata": {"exit_code": code, "duration_seconds": wall}}
            )
        else:
            output = f"Chunk ID: {rng.getrandbits(24):06x}\nWall time: {wall} seconds\n"
            output += f"Process exited with code {code}\nOutput:\n{body}"
        self.item({"type": "function_call_output", "call_id": call_id, "output": output})

    def compact(self) -> None:
        """A compaction: the `compacted` line and its event; the context shrinks."""
        self.lines.extend(_compaction(self.rng, self.clock, self.lines))
        self.tokens = 4_000 + self.rng.randrange(2_000)


def _compaction(rng: random.Random, clock: _Clock, lines: list[Line]) -> list[Line]:
    """A `compacted` line (local summary or remote, by seed) and its `context_compacted` event."""
    users = [
        line["payload"]
        for line in lines
        if line["type"] == "response_item"
        and line["payload"].get("type") == "message"
        and line["payload"].get("role") == "user"
    ]
    stamp = clock.tick()
    if rng.random() < 0.5:
        summary = "Summary of the work so far: " + _sentence(rng, 30)
        bridge = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Another model summarized:\n" + summary}],
        }
        payload: dict[str, Any] = {"message": summary, "replacement_history": [*users, bridge]}
    else:
        encrypted = {"type": "compaction", "encrypted_content": _encrypted(rng)}
        payload = {"message": "", "replacement_history": [*users, encrypted]}
    return [
        {"timestamp": stamp, "type": "compacted", "payload": payload},
        {"timestamp": stamp, "type": "event_msg", "payload": {"type": "context_compacted"}},
    ]


def write_codex_session(out_dir: Path, lines: list[Line]) -> Path:
    """Write `lines` as `out_dir/rollout-<start>-<session id>.jsonl` (Codex's file name)."""
    meta = lines[0]["payload"]
    start = str(meta["timestamp"])[:19].replace(":", "-")
    path = Path(out_dir) / f"rollout-{start}-{meta['id']}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for line in lines:
            handle.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
    return path


def write_codex_fleet(
    out_dir: Path,
    sessions: int,
    turns: int,
    seed: int,
    on_written: Callable[[WrittenSession], None] | None = None,
) -> list[WrittenSession]:
    """Write a fleet of rollouts as Codex lays them out under `~/.codex/sessions`:
    `out_dir/YYYY/MM/DD/rollout-<start>-<session id>.jsonl`, dated by each one's start."""
    written = []
    for session_seed in session_seeds(seed, sessions):
        lines = generate_codex_session(session_seed, turns)
        day = str(lines[0]["payload"]["timestamp"])[:10].split("-")
        path = write_codex_session(Path(out_dir).joinpath(*day), lines)
        result = WrittenSession(path, len(lines) - 1, path.stat().st_size)
        written.append(result)
        if on_written is not None:
            on_written(result)
    return written
