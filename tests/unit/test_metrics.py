"""The context metrics: reference figures, incremental == definition, frontier, protection."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionfold.events.envelope import EntryEnvelope
from sessionfold.projections.jsjson import js_json_length
from sessionfold.projections.pruning import context_metrics as metrics
from sessionfold.projections.pruning import digest
from sessionfold.projections.pruning.context_metrics import Protection, naive_snapshot, snapshot
from sessionfold.projections.pruning.digest import apply_entry, apply_reload, message_of
from sessionfold.projections.store import DictStore
from sessionfold.streams.publishing.session_file import read_session_file

SESSIONS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "sessions"
SID = "s"


def _entries(name: str) -> list[EntryEnvelope]:
    path = SESSIONS / name
    if not path.exists():
        pytest.skip(f"real session {path} is absent")
    return [r for r in read_session_file(path) if isinstance(r, EntryEnvelope)]


@pytest.fixture(scope="module")
def real() -> dict[str, list[EntryEnvelope]]:
    return {name: _entries(name) for name in ("before-compaction.jsonl", "large-session.jsonl")}


# --- (a) the reference figures ---------------------------------------------------------------

FIGURES = [
    (
        "before-compaction.jsonl",
        40,
        482,
        66,
        52_546,
        {"user": 7, "assistant": 15, "toolResult": 13},
    ),
    (
        "before-compaction.jsonl",
        63,
        290,
        59,
        58_557,
        {"user": 9, "assistant": 25, "toolResult": 24},
    ),
    (
        "before-compaction.jsonl",
        86,
        290,
        54,
        62_059,
        {"user": 9, "assistant": 36, "toolResult": 36},
    ),
    (
        "before-compaction.jsonl",
        109,
        402,
        50,
        66_254,
        {"user": 10, "assistant": 48, "toolResult": 46},
    ),
    (
        "before-compaction.jsonl",
        408,
        0,
        21,
        170_310,
        {"user": 18, "assistant": 193, "toolResult": 191},
    ),
    (
        "before-compaction.jsonl",
        523,
        0,
        19,
        231_556,
        {"user": 21, "assistant": 251, "toolResult": 245},
    ),
    (
        "before-compaction.jsonl",
        None,
        0,
        12,
        331_859,
        {"user": 55, "assistant": 484, "toolResult": 448, "bashExecution": 3},
    ),
    ("large-session.jsonl", 86, 0, 34, 37_249, {"user": 6, "assistant": 38, "toolResult": 40}),
    ("large-session.jsonl", 109, 0, 32, 39_627, {"user": 6, "assistant": 50, "toolResult": 51}),
    (
        "large-session.jsonl",
        None,
        0,
        13,
        113_446,
        {"user": 88, "assistant": 453, "toolResult": 373},
    ),
]


@pytest.mark.parametrize(("name", "lines", "thinking", "share", "gap", "roles"), FIGURES)
def test_reference_figures(
    real: dict[str, list[EntryEnvelope]],
    name: str,
    lines: int | None,
    thinking: int,
    share: int,
    gap: int,
    roles: dict[str, int],
) -> None:
    """Folding the first `lines` lines of a real session gives metrics-figures.md exactly."""
    store = DictStore()
    counts: collections.Counter[str] = collections.Counter()
    for envelope in real[name]:
        if lines is not None and envelope.payload.line > lines:
            break
        appended = apply_entry(store, SID, envelope.payload.entry, envelope.seq)
        if appended is not None and appended.row is not None:
            counts[appended.row["role"]] += 1
    assert snapshot(store, SID) == {
        "open_cycle_thinking_tokens": thinking,
        "largest_chain_share_pct": share,
        "frontier_gap_tokens": gap,
    }
    assert dict(counts) == roles


# --- (b) incremental == definition after every event -----------------------------------------


@pytest.fixture
def memo_lengths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cache naive_snapshot's per-message lengths by object: the same function, computed once."""
    cache: dict[int, tuple[Any, int]] = {}

    def cached(value: Any) -> int:
        hit = cache.get(id(value))
        if hit is None or hit[0] is not value:
            hit = (value, js_json_length(value))
            cache[id(value)] = hit
        return hit[1]

    monkeypatch.setattr(metrics, "js_json_length", cached)


def _frontier_at(store: DictStore, n: int) -> dict[str, Any] | None:
    """A frontier on the last call of the first assistant with calls at or after row n."""
    for row in digest.branch_rows(store, SID, n):
        if row["role"] == "assistant" and row["calls"]:
            return {
                "last_attempted_turn_index": row["turn"],
                "last_attempted_tool_call_id": row["calls"][-1]["id"],
            }
    return None


@pytest.mark.parametrize("name", ["before-compaction.jsonl", "large-session.jsonl"])
def test_real_sessions_match_definition_after_every_event(
    real: dict[str, list[EntryEnvelope]], name: str, memo_lengths: None
) -> None:
    """On a real session the incremental snapshot equals naive_snapshot after every event."""
    store = DictStore()
    messages: list[dict[str, Any]] = []
    frontier: dict[str, Any] | None = None
    summarized: set[str] = set()
    for i, envelope in enumerate(real[name]):
        apply_entry(store, SID, envelope.payload.entry, envelope.seq)
        message = message_of(envelope.payload.entry)
        if message is not None:
            messages.append(message)
        if i in (150, 400, 600, 700, 800, 900):
            # Forward moves, a backward move (600 -> 300), a bare-id miss, then null.
            at = {150: 40, 400: 200, 600: 300, 700: 500}.get(i)
            if at is not None:
                frontier = _frontier_at(store, at)
            elif i == 800:
                frontier = {"last_attempted_turn_index": 1, "last_attempted_tool_call_id": "nope"}
            else:
                frontier = None
            metrics.on_frontier(store, SID, frontier)
        if i % 97 == 0:
            # Summarize every third result seen so far: before and after the boundary.
            keys = [r["occ"] for r in digest.branch_rows(store, SID) if r["role"] == "toolResult"]
            fresh = keys[::3]
            metrics.on_summarized(store, SID, fresh)
            summarized.update(fresh)
        assert snapshot(store, SID) == naive_snapshot(messages, frontier, summarized), i


# --- hypothesis-generated sessions, with branches and reloads ---------------------------------

CALL_IDS = ["c0", "c1", "c2", "bash_1"]
TOOLS = ["read", "bash", "edit"]
PATHS = [None, "src/a.py", "/home/u/.pi/skills/x/SKILL.md", "skills/y.md"]


@dataclass
class Model:
    """A plain reference model of the session tree: entries by id, the leaf, the last entry."""

    nodes: dict[str, tuple[str | None, dict[str, Any] | None]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    leaf: str | None = None
    clock: int = 1_700_000_000_000

    def branch(self) -> list[dict[str, Any]]:
        path = []
        current = self.leaf
        while current is not None:
            parent, message = self.nodes[current]
            if message is not None:
                path.append(message)
            current = parent
        return path[::-1]

    def tick(self) -> int:
        self.clock += 1000
        return self.clock


def _text(draw: st.DrawFn, size: int = 60) -> str:
    return draw(st.text(st.sampled_from('ab😀\n"é'), max_size=size))


def _assistant(draw: st.DrawFn, ts: int) -> dict[str, Any]:
    shape = draw(st.sampled_from(["calls", "calls", "text", "aborted", "string"]))
    if shape == "string":
        return {"role": "assistant", "content": _text(draw), "timestamp": ts}
    if shape == "aborted":
        return {"role": "assistant", "content": [], "stopReason": "aborted", "timestamp": ts}
    content: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 2))):
        content.append({"type": "thinking", "thinking": _text(draw, 200), "thinkingSignature": "s"})
    content.append({"type": "text", "text": _text(draw)})
    if shape == "calls":
        for _ in range(draw(st.integers(1, 3))):
            path = draw(st.sampled_from(PATHS))
            args = {} if path is None else {"path": path}
            name = draw(st.sampled_from(TOOLS))
            content.append(
                {
                    "type": "toolCall",
                    "id": draw(st.sampled_from(CALL_IDS)),
                    "name": name,
                    "arguments": args,
                }
            )
    usage = {"input": 10, "output": 2, "cost": {"total": draw(st.floats(0, 1))}}
    return {
        "role": "assistant",
        "content": content,
        "usage": usage,
        "stopReason": "stop",
        "timestamp": ts,
    }


def _message(draw: st.DrawFn, kind: str, ts: int) -> dict[str, Any]:
    if kind == "user":
        prefix = draw(st.sampled_from(["", "", "<compressed-chain b1>"]))
        return {
            "role": "user",
            "content": [{"type": "text", "text": prefix + _text(draw)}],
            "timestamp": ts,
        }
    if kind == "assistant":
        return _assistant(draw, ts)
    if kind == "result":
        text = _text(draw, 400)
        return {
            "role": "toolResult",
            "toolCallId": draw(st.sampled_from(CALL_IDS)),
            "toolName": draw(st.sampled_from(TOOLS)),
            "content": [{"type": "text", "text": text}],
            "isError": draw(st.booleans()),
            "timestamp": ts,
        }
    return {
        "role": draw(st.sampled_from(["bashExecution", "branchSummary", "weird"])),
        "timestamp": ts,
    }


@st.composite
def sessions(draw: st.DrawFn) -> list[tuple[str, Any]]:
    """A list of operations: appends (to the leaf or elsewhere), reloads, frontier, summaries."""
    model = Model()
    ops: list[tuple[str, Any]] = []
    count = draw(st.integers(5, 45))
    for i in range(count):
        op = draw(
            st.sampled_from(
                [
                    *("user", "assistant", "assistant", "result", "result", "result"),
                    *("custom", "other", "entry", "branch", "reload"),
                    *("frontier", "summarize", "protect"),
                ]
            )
        )
        ts = model.tick()
        iso = f"2025-01-01T00:00:{i:02d}.{ts % 1000:03d}Z"
        parent = model.leaf
        if op == "branch":
            parent = draw(st.sampled_from([None, *model.order]))
            op = draw(st.sampled_from(["user", "assistant", "result", "entry"]))
        eid = f"e{i}"
        if op in ("user", "assistant", "result", "other"):
            message = _message(draw, op, ts)
            entry = {
                "type": "message",
                "id": eid,
                "parentId": parent,
                "timestamp": iso,
                "message": message,
            }
        elif op == "custom":
            entry = {
                "type": "custom_message",
                "id": eid,
                "parentId": parent,
                "timestamp": iso,
                "customType": "context-prune-summary",
                "content": _text(draw),
                "display": False,
            }
            if draw(st.booleans()):
                entry["details"] = {"turnIndex": draw(st.integers(0, 5)), "x": 0.5}
        elif op == "entry":
            entry = {
                "type": draw(st.sampled_from(["model_change", "label", "mystery"])),
                "id": eid,
                "parentId": parent,
            }
        elif op == "reload":
            ops.append(("reload", draw(st.sampled_from([None, "missing", *model.order]))))
            continue
        elif op == "frontier":
            frontier = None
            if draw(st.integers(0, 4)):
                frontier = {
                    "last_attempted_turn_index": draw(st.integers(0, 8)),
                    "last_attempted_tool_call_id": draw(st.sampled_from(CALL_IDS)),
                }
            ops.append(("frontier", frontier))
            continue
        elif op == "summarize":
            ops.append(("summarize", draw(st.integers(0, 2**16))))
            continue
        elif op == "protect":
            tools = draw(st.lists(st.sampled_from(TOOLS), max_size=2))
            paths = draw(st.sampled_from([["**/skills/**/*.md"], [], ["src/*.py", "**"]]))
            ops.append(("protect", Protection(tools, paths)))
            continue
        model.nodes[eid] = (parent, message_of(entry))
        model.order.append(eid)
        model.leaf = eid
        ops.append(("entry", entry))
    return ops


def _results(messages: list[dict[str, Any]]) -> Iterator[str]:
    for m in messages:
        if m.get("role") == "toolResult":
            yield digest.occurrence_key(m.get("toolCallId"), m.get("timestamp"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions())
def test_generated_sessions_match_definition_after_every_event(ops: list[tuple[str, Any]]) -> None:
    """On generated sessions (branches, reloads, frontier, summaries) incremental == naive."""
    store = DictStore()
    model = Model()
    frontier: dict[str, Any] | None = None
    summarized: set[str] = set()
    protection = metrics.DEFAULT_PROTECTION
    for op, arg in ops:
        if op == "entry":
            apply_entry(store, SID, arg)
            parent = arg["parentId"] if arg["parentId"] in model.nodes else None
            model.nodes[arg["id"]] = (parent, message_of(arg))
            model.order.append(arg["id"])
            model.leaf = arg["id"]
        elif op == "reload":
            apply_reload(store, SID, arg)
            model.leaf = arg if arg in model.nodes else (model.order[-1] if model.order else None)
        elif op == "frontier":
            frontier = arg
            metrics.on_frontier(store, SID, frontier)
        elif op == "summarize":
            keys = sorted(set(_results(model.branch())))
            chosen = [k for j, k in enumerate(keys) if arg >> (j % 16) & 1] + ["c9@1"]
            metrics.on_summarized(store, SID, chosen)
            summarized.update(chosen)
        elif op == "protect":
            protection = arg
            metrics.set_protection(store, SID, protection)
        branch = model.branch()
        assert [r["role"] for r in digest.branch_rows(store, SID)] == [
            m.get("role") for m in branch
        ]
        assert snapshot(store, SID) == naive_snapshot(branch, frontier, summarized, protection)


# --- (c, d) small cases by hand --------------------------------------------------------------


def _entry(eid: str, parent: str | None, message: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "message",
        "id": eid,
        "parentId": parent,
        "timestamp": "2025-01-01T00:00:00Z",
        "message": message,
    }


def _fold(messages: list[dict[str, Any]]) -> DictStore:
    store = DictStore()
    for i, message in enumerate(messages):
        apply_entry(store, SID, _entry(f"e{i}", f"e{i - 1}" if i else None, message))
    return store


def _call(call_id: str, path: str | None = None, name: str = "read") -> dict[str, Any]:
    return {
        "type": "toolCall",
        "id": call_id,
        "name": name,
        "arguments": {} if path is None else {"path": path},
    }


def _res(call_id: str, ts: int, size: int = 400, name: str = "read") -> dict[str, Any]:
    content = [{"type": "text", "text": "x" * size}]
    return {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": name,
        "content": content,
        "timestamp": ts,
    }


TURN = [
    {"role": "user", "content": [{"type": "text", "text": "go"}], "timestamp": 1},
    {"role": "assistant", "content": [_call("a"), _call("b"), _call("c")], "timestamp": 2},
    _res("a", 3),
    _res("b", 4),
    _res("c", 5),
    {"role": "assistant", "content": [_call("a")], "timestamp": 6},
    _res("a", 7),
]


@pytest.mark.parametrize(
    ("frontier", "counted"),
    [
        (None, ["a@3", "b@4", "c@5", "a@7"]),
        ({"last_attempted_turn_index": 0, "last_attempted_tool_call_id": "b"}, ["c@5", "a@7"]),
        ({"last_attempted_turn_index": 0, "last_attempted_tool_call_id": "c"}, ["a@7"]),
        ({"last_attempted_turn_index": 1, "last_attempted_tool_call_id": "a"}, []),
        (
            {"last_attempted_turn_index": 1, "last_attempted_tool_call_id": "b"},
            ["a@3", "b@4", "c@5", "a@7"],
        ),
        (
            {"last_attempted_turn_index": 7, "last_attempted_tool_call_id": "a"},
            ["a@3", "b@4", "c@5", "a@7"],
        ),
    ],
    ids=[
        "null",
        "intra-turn split",
        "turn end",
        "reused id later turn",
        "bare-id miss",
        "turn not found",
    ],
)
def test_frontier_boundary(frontier: dict[str, Any] | None, counted: list[str]) -> None:
    """The gap counts results after the boundary call; a miss or null means the whole branch."""
    store = _fold(TURN)
    metrics.on_frontier(store, SID, frontier)
    tokens = {
        r["occ"]: r["tokens"] for r in digest.branch_rows(store, SID) if r["role"] == "toolResult"
    }
    assert snapshot(store, SID)["frontier_gap_tokens"] == sum(tokens[k] for k in counted)
    assert snapshot(store, SID) == naive_snapshot(TURN, frontier)


def test_frontier_set_before_its_turn_exists() -> None:
    """A frontier naming a turn not yet on the branch resolves when that assistant arrives."""
    store = _fold(TURN[:5])
    frontier = {"last_attempted_turn_index": 1, "last_attempted_tool_call_id": "a"}
    metrics.on_frontier(store, SID, frontier)
    assert snapshot(store, SID)["frontier_gap_tokens"] > 0
    apply_entry(store, SID, _entry("e5", "e4", TURN[5]))
    assert snapshot(store, SID)["frontier_gap_tokens"] == 0
    apply_entry(store, SID, _entry("e6", "e5", TURN[6]))
    assert snapshot(store, SID) == naive_snapshot(TURN, frontier)


def test_summarized_results_leave_the_gap() -> None:
    """on_summarized removes those occurrences from the gap once, even if repeated."""
    store = _fold(TURN)
    before = snapshot(store, SID)["frontier_gap_tokens"]
    metrics.on_summarized(store, SID, ["b@4", "unknown@1"])
    metrics.on_summarized(store, SID, ["b@4"])
    tokens = next(r["tokens"] for r in digest.branch_rows(store, SID) if r.get("occ") == "b@4")
    assert snapshot(store, SID)["frontier_gap_tokens"] == before - tokens
    assert metrics.is_summarized(store, SID, "b@4")


def test_protected_results_are_not_in_the_gap() -> None:
    """Results of calls reading a skills .md file, or of protected tools, do not count."""
    messages = [
        TURN[0],
        {
            "role": "assistant",
            "content": [_call("a", "/r/skills/x/SKILL.md"), _call("b", "src/m.py")],
            "timestamp": 2,
        },
        _res("a", 3),
        _res("b", 4),
    ]
    store = _fold(messages)
    tokens = {
        r["occ"]: r["tokens"] for r in digest.branch_rows(store, SID) if r["role"] == "toolResult"
    }
    assert snapshot(store, SID)["frontier_gap_tokens"] == tokens["b@4"]
    metrics.set_protection(store, SID, Protection(protected_tools=["read"], protected_paths=[]))
    assert snapshot(store, SID)["frontier_gap_tokens"] == 0
    assert Protection().is_protected("read", {"path": "C:\\w\\skills\\a\\b.md"})
    assert not Protection().is_protected("read", {"path": "skills/a.txt"})


def test_open_segment_and_chains() -> None:
    """Thinking counts only after the last text-only assistant; share is max(chain, open)."""
    thinking = {"type": "thinking", "thinking": "hmm" * 10}
    messages = [
        {"role": "user", "content": "q", "timestamp": 1},
        {"role": "assistant", "content": [thinking, _call("a")], "timestamp": 2},
        _res("a", 3),
        {
            "role": "assistant",
            "content": [thinking, {"type": "text", "text": "done"}],
            "timestamp": 4,
        },
        {"role": "user", "content": "next", "timestamp": 5},
        {"role": "assistant", "content": [thinking, _call("b")], "timestamp": 6},
    ]
    store = _fold(messages)
    chars = [js_json_length(m) for m in messages]
    got = snapshot(store, SID)
    assert got["open_cycle_thinking_tokens"] == metrics.js_round(js_json_length(thinking) / 4)
    largest = max(sum(chars[0:4]), sum(chars[4:]))
    assert got["largest_chain_share_pct"] == metrics.js_round(100 * largest / sum(chars))
    assert got == naive_snapshot(messages)


def test_interrupted_chain_ends_before_next_user() -> None:
    """An interrupted chain spans its start to the message before the next user message."""
    messages = [
        {"role": "user", "content": "a" * 500, "timestamp": 1},
        {"role": "assistant", "content": [_call("a")], "timestamp": 2},
        {"role": "user", "content": "<compressed-chain b1>" + "z" * 900, "timestamp": 3},
        {"role": "custom", "content": "note", "timestamp": 4},
        {"role": "user", "content": "b", "timestamp": 5},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}], "timestamp": 6},
    ]
    store = _fold(messages)
    assert snapshot(store, SID) == naive_snapshot(messages)
    chars = [js_json_length(m) for m in messages]
    share = metrics.js_round(100 * sum(chars[0:2]) / sum(chars))
    assert snapshot(store, SID)["largest_chain_share_pct"] == share


def test_empty_and_unknown_only_sessions() -> None:
    """No messages gives zeros; unknown roles only inflate the denominator."""
    assert (
        snapshot(DictStore(), SID)
        == naive_snapshot([])
        == {
            "open_cycle_thinking_tokens": 0,
            "largest_chain_share_pct": 0,
            "frontier_gap_tokens": 0,
        }
    )
    store = _fold(
        [{"role": "weird", "timestamp": 1}, {"role": "user", "content": "x", "timestamp": 2}]
    )
    assert snapshot(store, SID) == naive_snapshot(
        [{"role": "weird", "timestamp": 1}, {"role": "user", "content": "x", "timestamp": 2}]
    )


def test_math_round_halves_up() -> None:
    """js_round rounds halves up, as Math.round does for non-negative numbers."""
    assert [metrics.js_round(x) for x in (0.5, 1.5, 2.5, 2.4999, 0.0)] == [1, 2, 3, 2, 0]


class CountingStore(DictStore):
    """A DictStore that counts reads, to check the hooks' cost per call."""

    gets = 0

    def get(self, key: str, default: Any = None) -> Any | None:  # type: ignore[override]
        self.gets += 1
        return super().get(key, default)


def test_hooks_cost_does_not_grow_with_the_branch() -> None:
    """Appends and forward frontier moves read a bounded number of keys, however long the branch."""
    store = CountingStore()
    parent = None
    reads = []
    for turn in range(300):
        store.gets = 0
        for j, message in enumerate(
            [
                {
                    "role": "assistant",
                    "content": [_call(f"t{turn}a"), _call("x")],
                    "timestamp": turn,
                },
                _res(f"t{turn}a", turn * 10 + 1),
                _res("x", turn * 10 + 2),
            ]
        ):
            eid = f"e{turn}.{j}"
            apply_entry(store, SID, _entry(eid, parent, message))
            parent = eid
        if turn >= 2:
            frontier = {"last_attempted_turn_index": turn - 2, "last_attempted_tool_call_id": "x"}
            metrics.on_frontier(store, SID, frontier)
            metrics.on_summarized(store, SID, [f"t{turn - 2}a@{(turn - 2) * 10 + 1}"])
        reads.append(store.gets)
    assert max(reads[10:]) <= 40 and max(reads[-50:]) == max(reads[10:60])
    # An unresolvable frontier is a whole-branch window: one recompute, not one per message.
    metrics.on_frontier(
        store, SID, {"last_attempted_turn_index": 5, "last_attempted_tool_call_id": "?"}
    )
    assert snapshot(store, SID)["frontier_gap_tokens"] > 0
