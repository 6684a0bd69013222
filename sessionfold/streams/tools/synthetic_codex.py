"""Synthetic Codex CLI rollouts, shaped like real ones, for tests of the Codex mapping.

A rollout is `session_meta`, the injected turns (developer permissions, AGENTS.md, the
`<environment_context>`), then per user turn: `turn_context`, the user message, and model
responses of reasoning (with encrypted content) + tool calls (several in parallel at times),
then the outputs (the first shell command failing with its exit code), and a final answer.
Halfway through, a `compacted` line (local or remote, by seed); here and there an event kind or
a line type no reader knows.

Each CLI generation (`GENERATIONS`; docs/formats.md, "What each CLI version writes") has its
own shapes:

- 0.169 (the current CLI): `ordinal` on every line; unified exec only (`exec_command` with its
  header output `Chunk ID`, `Wall time`, `Process exited with code N`, `Original token count`,
  `Output:`), a command now and then still running (`Process running with session ID N`) until
  a later response's `write_stdin` poll sees it exit; per response its items, a
  `token_usage_record` with its usage, the outputs (each command's `item_completed`
  `CommandExecution` before it), then a `token_count`; `item_completed` `UserMessage` and
  `AgentMessage` events, `world_state` lines.
- 0.77: `shell` with an argv (JSON output), `exec_command`, `apply_patch`; each response's
  `token_count` between its items and its outputs; `user_message`, `agent_message` events.
- 0.40: as 0.77 but every command a `shell` call with the JSON output, and each `token_count`
  before the response it measures.

Everything is drawn from one `random.Random(seed)`: no clock, no `uuid4`, so the same seed and
turns give the same lines. The lines a newer generation adds take their ids and numbers from
hashes of what was drawn, so every generation of a seed tells the same story (prompts, calls,
exit codes, usage), and 0.77's lines are those this module wrote before the others existed.
All text comes from the word lists here.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sessionfold.streams.tools.synthetic import WrittenSession, session_seeds

Line = dict[str, Any]

#: The CLI generations written, the current one first (`generate --cli-version`).
GENERATIONS = ("0.169", "0.77", "0.40")
CLI_VERSION = GENERATIONS[0] + ".0"
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
        return self.stamp()

    def stamp(self, later_ms: int = 0) -> str:
        """The time now (moved on by `later_ms`, a number not drawn from the rng)."""
        self.now += timedelta(milliseconds=later_ms)
        return self.now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{self.now.microsecond // 1000:03d}Z"


def _digest(*names: object) -> int:
    """A number hashed from values already drawn: what a newer generation adds draws nothing."""
    text = ":".join(str(name) for name in names).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big")


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."


def _encrypted(rng: random.Random) -> str:
    return "gAAAAA" + base64.b64encode(rng.randbytes(rng.randrange(200, 1200))).decode()


def _output_rows(rng: random.Random) -> str:
    return "\n".join(
        f"{rng.choice(_FILES)}:{rng.randrange(1, 400)}: {_sentence(rng, 5)}"
        for _ in range(rng.randrange(1, 30))
    )


def generate_codex_session(seed: int, turns: int, cli: str = GENERATIONS[0]) -> list[Line]:
    """The lines of one synthetic rollout of CLI generation `cli` with `turns` user turns
    (deterministic per seed and generation)."""
    if cli not in GENERATIONS:
        raise ValueError(f"cli must be one of {', '.join(GENERATIONS)}, not {cli!r}")
    rollout = _Rollout(random.Random(seed), cli)
    for turn in range(turns):
        if turns >= 3 and turn == turns // 2:
            rollout.compact()
        rollout.turn(first=turn == 0)
    if cli != "0.169":
        return rollout.lines
    return [
        {"timestamp": line["timestamp"], "ordinal": number, **line}
        for number, line in enumerate(rollout.lines)
    ]


def _text(role: str, words: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": words}]}


class _Rollout:
    """One rollout being written: its lines, clock, context size, model and CLI generation."""

    def __init__(self, rng: random.Random, cli: str) -> None:
        self.rng = rng
        self.cli = cli
        self.clock = _Clock(rng)
        self.lines: list[Line] = []
        self.cwd = f"/home/dev/{rng.choice(_WORDS)}-{rng.choice(_WORDS)}"
        self.tokens = 6_000 + rng.randrange(4_000)
        self.calls = 0  # the first call is a failing shell command: every rollout has one
        self.model = rng.choice(("gpt-5.1-codex", "gpt-5.2-codex"))
        self.running: list[tuple[str, str, int, str]] = []  # (call, command, code, body)
        session = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        self.session = session
        start = self.clock.tick()
        meta = {
            "id": session,
            "timestamp": start,
            "cwd": self.cwd,
            "originator": "codex_cli_rs",
            "cli_version": f"{cli}.0",
            "instructions": None,
            "source": "cli",
            "model_provider": "openai",
            "git": {"branch": "main", "commit_hash": f"{rng.getrandbits(160):040x}"},
        }
        if cli == "0.169":
            del meta["instructions"]
            text = "You are a coding agent working in the user's repository."
            meta.update(base_instructions={"text": text}, context_window=272_000)
        self.lines.append({"timestamp": start, "type": "session_meta", "payload": meta})
        self.item(_text("developer", "<permissions instructions>workspace-write</permissions>"))
        rules = f"# AGENTS.md instructions for {self.cwd}\n\n<INSTRUCTIONS>\n- {_RULES[0]}\n"
        self.item(_text("user", rules + "</INSTRUCTIONS>"))
        context = f"<environment_context>\n  <cwd>{self.cwd}</cwd>\n</environment_context>"
        self.item(_text("user", context))
        self.world_state()

    @property
    def current(self) -> bool:
        """Whether this is the current CLI's generation (0.169)."""
        return self.cli == "0.169"

    def add(self, kind: str, payload: dict[str, Any], most_ms: int = 3_000) -> None:
        self.lines.append({"timestamp": self.clock.tick(most_ms), "type": kind, "payload": payload})

    def after(self, kind: str, payload: dict[str, Any], later_ms: int = 0) -> None:
        """A line a newer generation adds, stamped without a draw."""
        self.lines.append(
            {"timestamp": self.clock.stamp(later_ms), "type": kind, "payload": payload}
        )

    def item(self, payload: dict[str, Any]) -> None:
        self.add("response_item", payload)

    def event(self, payload: dict[str, Any]) -> None:
        self.add("event_msg", payload, 50)

    def completed(self, item: dict[str, Any], most_ms: int | None = None) -> None:
        """An `item_completed` event (0.169): with `most_ms`, stamped by the draw of the older
        line it stands for (the same range, so the draws after it stay), else a new line."""
        payload = {"type": "item_completed", "thread_id": self.session, "item": item}
        if most_ms is not None:
            self.add("event_msg", payload, most_ms)
        else:
            self.after("event_msg", payload)

    def world_state(self) -> None:
        """The environment as 0.169 records it (the model gets `<environment_context>`)."""
        if self.current:
            state = {"environments": {"local": {"cwd": self.cwd, "shell": "bash"}}}
            self.after("world_state", {"full": True, "state": state})

    def usage(self) -> dict[str, int]:
        """A response's usage (drawn as 0.77 drew its token_count's)."""
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
        if self.current:
            # some of the input written to the cache (hashed: no draw), within what was not read
            room = last["input_tokens"] - last["cached_input_tokens"]
            written = min(_digest(self.session, len(self.lines), "write") % 1_500, room)
            last["cache_write_input_tokens"] = written if len(self.lines) % 3 == 0 else 0
            last = {key: last[key] for key in _USAGE_KEYS}
        return last

    def token_count(self, last: dict[str, int], stamp: bool = True) -> None:
        """The usage event Codex writes when a model response completes."""
        info = {
            "total_token_usage": last,
            "last_token_usage": last,
            "model_context_window": 272_000,
        }
        payload = {"type": "token_count", "info": info, "rate_limits": None}
        if stamp:
            self.event(payload)
        else:
            self.after("event_msg", payload)

    def measured(self, first: int) -> dict[str, int]:
        """A response's usage where its generation writes it: 0.169's record after its items
        (the count follows its outputs), 0.77's count here, 0.40's count before its items."""
        last = self.usage()
        if self.current:
            stamp = self.clock.tick(50)  # the draw 0.77's count took
            record = {"response_id": f"resp_{_digest(self.session, stamp, len(self.lines)):016x}"}
            self.lines.append(
                {"timestamp": stamp, "type": "token_usage_record", "payload": {
                    **record, "usage": last, "turn_token_usage": last}}
            )  # fmt: skip
            return last
        self.token_count(last)
        if self.cli == "0.40":
            stamps = [line["timestamp"] for line in self.lines[first:]]
            self.lines.insert(first, self.lines.pop())
            for line, stamp in zip(self.lines[first:], stamps, strict=True):
                line["timestamp"] = stamp
        return last

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
        if self.current:
            text = [{"type": "text", "text": ask}]
            user = {"type": "UserMessage", "id": self.item_id("user"), "content": text}
            self.completed(user, most_ms=50)
        else:
            self.event({"type": "user_message", "message": ask, "images": []})
        for _ in range(rng.randrange(1, 4)):
            self.response()
        answer = _sentence(rng, rng.randrange(8, 40))
        reasoning = {"type": "reasoning", "summary": [], "content": None}
        start = len(self.lines)
        self.item({**reasoning, "encrypted_content": _encrypted(rng)})
        if self.current:
            # the event comes before the message it completes
            text = [{"type": "Text", "text": answer}]
            self.completed({"type": "AgentMessage", "id": self.item_id("msg"), "content": text})
            self.item(_text("assistant", answer))
            self.clock.tick(50)  # the draw 0.77's agent_message event took
            last = self.measured(start)
            self.token_count(last, stamp=False)
        else:
            self.item(_text("assistant", answer))
            self.event({"type": "agent_message", "message": answer})
            self.measured(start)
        self.event({"type": "task_complete", "last_agent_message": answer})
        if rng.random() < 0.15:
            self.add("future_record_kind", {"note": rng.choice(_WORDS)})

    def item_id(self, kind: str) -> str:
        return f"{kind}_{_digest(self.session, kind, len(self.lines)):016x}"

    def response(self) -> None:
        """One model response (reasoning, 1 to 3 parallel tool calls), then the outputs; in
        0.169 the polls of the commands still running after it."""
        rng = self.rng
        start = len(self.lines)
        summary = _sentence(rng, rng.randrange(4, 12))
        reasoning = {"type": "reasoning", "summary": [{"type": "summary_text", "text": summary}]}
        self.item({**reasoning, "content": None, "encrypted_content": _encrypted(rng)})
        if self.current:
            rng.randrange(1, 50)  # the draw 0.77's reasoning event took: the story stays put
        else:
            self.event({"type": "agent_reasoning", "text": summary})
        issued = [self.call() for _ in range(rng.choice((1, 1, 1, 2, 3)))]
        last = self.measured(start)
        for call in issued:
            self.output(*call)
            if rng.random() < 0.1:
                self.event({"type": "future_event_kind", "detail": rng.choice(_WORDS)})
        if self.current:
            self.token_count(last, stamp=False)
            while self.running:
                self.poll(*self.running.pop(0))

    def call(self) -> tuple[str, str, bool, str]:
        """One tool call item: `shell` with an argv, `exec_command`, or `apply_patch` (0.169
        offers no `shell`, 0.40 no `exec_command`)."""
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
            return call_id, kind, failing, command
        name = {"0.169": "exec_command", "0.40": "shell"}.get(self.cli, kind)
        if name == "shell":
            args: dict[str, Any] = {"command": ["bash", "-lc", command], "workdir": self.cwd}
            args["timeout_ms"] = 120_000
        else:
            args = {"cmd": command, "yield_time_ms": 1000}
        arguments = json.dumps(args)
        self.item(
            {"type": "function_call", "name": name, "arguments": arguments, "call_id": call_id}
        )
        return call_id, kind, failing, command

    def output(self, call_id: str, kind: str, failing: bool, command: str) -> None:
        """A call's output in the shape its tool writes, with its exit code."""
        rng = self.rng
        code = rng.choice((1, 2, 127)) if failing else 0
        body = f"error: {_sentence(rng, 6)}" if failing else _output_rows(rng)
        wall = rng.randrange(1, 5_000) / 1000
        if kind == "apply_patch":
            done = f"Success. Updated the following files:\nM {_FILES[0]}\n"
            if self.current:
                output = f"Exit code: 0\nWall time: {wall} seconds\nOutput:\n{done}"
            else:
                output = json.dumps(
                    {"output": done, "metadata": {"exit_code": 0, "duration_seconds": wall}}
                )
            self.item({"type": "custom_tool_call_output", "call_id": call_id, "output": output})
            return
        if self.cli == "0.40" and kind == "exec_command":
            rng.getrandbits(24)  # the chunk id 0.77 drew: the story stays put
        if (kind == "shell" and not self.current) or self.cli == "0.40":
            output = json.dumps(
                {"output": body, "metadata": {"exit_code": code, "duration_seconds": wall}}
            )
            self.item({"type": "function_call_output", "call_id": call_id, "output": output})
            return
        # 0.77's exec_command drew its chunk id; 0.169's former shell calls hash theirs
        chunk = rng.getrandbits(24) if kind == "exec_command" else _digest(call_id) % (1 << 24)
        if not self.current:
            output = f"Chunk ID: {chunk:06x}\nWall time: {wall} seconds\n"
            output += f"Process exited with code {code}\nOutput:\n{body}"
            self.item({"type": "function_call_output", "call_id": call_id, "output": output})
            return
        head = f"Chunk ID: {chunk:06x}\nWall time: {wall:.4f} seconds\n"
        if _digest(call_id, "running") % 5 == 0:
            # still running when yield_time_ms ran out: a later response polls it to its end
            pid = self.pid(call_id)
            output = f"{head}Process running with session ID {pid}\nOriginal token count: 0\n"
            self.item(self.output_item(call_id, output + "Output:\n"))
            self.running.append((call_id, command, code, body))
            return
        self.executed(call_id, command, code, most_ms=3_000)  # stamped as 0.77's output
        self.after("response_item", self.output_item(call_id, _exited(head, code, body)))

    def output_item(self, call_id: str, output: str) -> dict[str, Any]:
        return {"type": "function_call_output", "call_id": call_id, "output": output}

    def pid(self, call_id: str) -> int:
        return 1_000 + _digest(call_id, "pid") % 90_000

    def executed(self, call_id: str, command: str, code: int, most_ms: int | None = None) -> None:
        """0.169's `item_completed` for a command that ended, before its output."""
        item = {
            "type": "CommandExecution",
            "id": call_id,
            "process_id": str(self.pid(call_id)),
            "command": ["/bin/bash", "-lc", command],
            "cwd": self.cwd,
            "source": "unified_exec_startup",
            "status": "failed" if code else "completed",
            "exit_code": code,
        }
        self.completed(item, most_ms)

    def poll(self, call_id: str, command: str, code: int, body: str) -> None:
        """A response of one `write_stdin` poll that sees a running command exit (no draws)."""
        pid = self.pid(call_id)
        poll = f"call_{_digest(call_id, 'poll'):024x}"[:29]
        arguments = json.dumps({"session_id": pid, "chars": "", "yield_time_ms": 10_000})
        call = {"type": "function_call", "name": "write_stdin", "arguments": arguments}
        self.after("response_item", {**call, "call_id": poll}, later_ms=_digest(poll) % 900 + 50)
        self.tokens += 40 + _digest(poll, "in") % 300
        out = 10 + _digest(poll, "out") % 60
        last = {
            "input_tokens": self.tokens,
            "cached_input_tokens": self.tokens - 40,
            "cache_write_input_tokens": 0,
            "output_tokens": out,
            "reasoning_output_tokens": 0,
            "total_tokens": self.tokens + out,
        }
        record = {"response_id": f"resp_{_digest(poll, 'resp'):016x}", "usage": last}
        self.after("token_usage_record", {**record, "turn_token_usage": last})
        self.executed(call_id, command, code)
        head = f"Chunk ID: {_digest(poll) % (1 << 24):06x}\nWall time: 1.0000 seconds\n"
        self.after("response_item", self.output_item(poll, _exited(head, code, body)))
        self.token_count(last, stamp=False)

    def compact(self) -> None:
        """A compaction: the `compacted` line and its event; the context shrinks."""
        self.lines.extend(_compaction(self.rng, self.clock, self.lines))
        if self.current:
            event = self.lines.pop()
            self.world_state()
            done = {"type": "ContextCompaction", "id": self.item_id("compaction")}
            payload = {"type": "item_completed", "thread_id": self.session, "item": done}
            self.lines.append({**event, "payload": payload})
        self.tokens = 4_000 + self.rng.randrange(2_000)


_USAGE_KEYS = (
    "input_tokens",
    "cached_input_tokens",
    "cache_write_input_tokens",
    "output_tokens",
    "reasoning_output_tokens",
    "total_tokens",
)


def _exited(head: str, code: int, body: str) -> str:
    """A unified exec output of a command that ended (0.169's header form)."""
    tokens = len(body) // 4
    return f"{head}Process exited with code {code}\nOriginal token count: {tokens}\nOutput:\n{body}"


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
    cli: str = GENERATIONS[0],
) -> list[WrittenSession]:
    """Write a fleet of rollouts of CLI generation `cli` as Codex lays them out under
    `~/.codex/sessions`: `out_dir/YYYY/MM/DD/rollout-<start>-<session id>.jsonl`, dated by each
    one's start."""
    written = []
    for session_seed in session_seeds(seed, sessions):
        lines = generate_codex_session(session_seed, turns, cli)
        day = str(lines[0]["payload"]["timestamp"])[:10].split("-")
        path = write_codex_session(Path(out_dir).joinpath(*day), lines)
        result = WrittenSession(path, len(lines) - 1, path.stat().st_size)
        written.append(result)
        if on_written is not None:
            on_written(result)
    return written
