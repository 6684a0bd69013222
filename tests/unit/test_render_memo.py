"""The render memo `sessionfold serve` and the fold workers keep per session (views/context.py
`RenderMemo`): a render that reuses the chains of the previous one, or grows the previous
render by the entries since, is the render from scratch, at every line of a growing session,
under any pruning settings and any branching, compaction, recovery or colliding timestamps
(hypothesis), and on the real sessions."""

from __future__ import annotations

import copy
import itertools
import random
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionfold.projections.pruning.config import DEFAULT_CONFIG, PruneConfig, build_config
from sessionfold.projections.views.chains import RECOVERY_TOOL
from sessionfold.projections.views.context import (
    ContextView,
    compact_point,
    compression_points,
    context_at,
)
from sessionfold.streams.runtime.live import LiveFolds
from sessionfold.streams.tools.synthetic import dumps_entry, generate_session, write_session

SESSIONS = Path(__file__).resolve().parents[3] / "shared" / "data" / "sessions"

pruning_settings = st.fixed_dictionaries(
    {
        "minBatchChars": st.sampled_from([0, 1_000]),
        "protectedTools": st.sampled_from([[], ["read"]]),
        "recoveryGraceTurns": st.sampled_from([0, 3]),
        "batchingMode": st.sampled_from(["turn", "agent-message"]),
        "spillThreshold": st.sampled_from([512, 65_536]),
        "dedupByContentHash": st.booleans(),
        "chainCompression": st.fixed_dictionaries({"rollingWindow": st.integers(1, 3)}),
        "purgeErrors": st.fixed_dictionaries({"cooldownTurns": st.integers(1, 2)}),
    }
)


def _fresh(live: LiveFolds, session_id: str) -> ContextView:
    """The render from scratch: no memo."""
    session = live.sessions[session_id]
    store = live.runtime.store
    compacts = [compact_point(seq, t, store, session_id) for seq, t in session.compacts]
    return context_at(session.entries, store, session_id, live.config, compacts)


def _same(memo: ContextView, fresh: ContextView) -> None:
    assert orjson.dumps(memo.to_json()) == orjson.dumps(fresh.to_json())
    assert memo.chains == fresh.chains
    assert memo.removed == fresh.removed
    assert memo.diagnostics == fresh.diagnostics


def _grow(
    lines: list[bytes], folder: Path, config: PruneConfig, every: int = 1
) -> tuple[int, int, int]:
    """Write `lines` one by one, rendering with the memo and from scratch after each
    `every`th; (renders, how many of them reused the memo's chains, how many grew the last
    render)."""
    target = folder / "session.jsonl"
    target.write_bytes(b"")
    live = LiveFolds([folder], config=config, journals=False)
    live.discover()
    renders = reused = grown = 0
    for number, line in enumerate(lines, 1):
        with target.open("ab") as handle:
            handle.write(line)
        live.poll()
        if not live.sessions or (number % every and number != len(lines)):
            continue
        (session_id,) = live.sessions
        memo = live.sessions[session_id].memo
        derived, before = memo.chains.derived, memo.grown
        _same(live.view(session_id), _fresh(live, session_id))
        renders += 1
        reused += derived is not None and memo.chains.derived is derived
        grown += memo.grown - before
    return renders, reused, grown


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), turns=st.integers(15, 40), overrides=pruning_settings)
def test_a_render_with_the_memo_is_the_render_from_scratch(
    seed: int, turns: int, overrides: dict[str, Any]
) -> None:
    """At every line of a generated session, under drawn settings, the memo changes nothing."""
    with tempfile.TemporaryDirectory() as tmp:
        source = write_session(Path(tmp), generate_session(seed, turns)).path
        live_dir = Path(tmp) / "live"
        live_dir.mkdir()
        lines = source.read_bytes().splitlines(keepends=True)
        renders, _reused, grown = _grow(lines, live_dir, build_config(overrides))
        assert grown >= renders // 3  # most lines add to the branch and move nothing else


#: What a live session does besides adding to its branch, each reaching back into a render.
EDITS = ("branch", "stamp", "recovery", "compaction", "error")


def _edited(entries: list[dict[str, Any]], edits: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """`entries` with each edit at its place: a /tree jump back (the branch changes), a message
    at an earlier message's timestamp (a chain range may no longer resolve), a recovery call
    (grace), a compaction entry (the context is rebuilt), an error (purge)."""
    out = copy.deepcopy(entries)
    for kind, seed in edits:
        rng = random.Random(seed)
        messages = [n for n, e in enumerate(out) if e.get("type") == "message"]
        at = messages[rng.randrange(len(messages) // 2, len(messages))]
        entry, message = out[at], out[at]["message"]
        if kind == "branch":
            entry["parentId"] = out[rng.randrange(1, at)]["id"]
        elif kind == "stamp" and message["role"] == "assistant":
            # At an old turn's last assistant message's timestamp: where a chain range ends (it
            # is found by it). A call, not a reply, so that no flush comes with it.
            ends = [
                out[n]["message"]
                for n, after in itertools.pairwise(messages)
                if after < at and out[after]["message"]["role"] == "user"
            ]
            if ends:
                message["timestamp"] = rng.choice(ends[: max(1, len(ends) // 2)])["timestamp"]
        elif kind == "recovery":
            calls = [
                (n, b)
                for n in messages[: messages.index(at)]
                for b in out[n]["message"].get("content") or []
                if isinstance(b, dict) and b.get("type") == "toolCall"
            ]
            if calls:
                n, block = rng.choice(calls)
                block["name"] = RECOVERY_TOOL
                for later in out[n + 1 :]:
                    result = later.get("message") or {}
                    if result.get("toolCallId") == block["id"]:
                        result["toolName"] = RECOVERY_TOOL
        elif kind == "compaction":
            kept = out[messages[rng.randrange(0, messages.index(at) + 1)]]["id"]
            compaction = {
                "type": "compaction",
                "id": f"c{seed:07x}"[:8],
                "parentId": entry["parentId"],
                "timestamp": entry["timestamp"],
                "summary": "what came before",
                "firstKeptEntryId": kept,
                "tokensBefore": 1000,
            }
            entry["parentId"] = compaction["id"]
            out.insert(at, compaction)
        elif message["role"] == "toolResult":
            message["isError"] = True
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    turns=st.integers(12, 30),
    overrides=pruning_settings,
    edits=st.lists(st.tuples(st.sampled_from(EDITS), st.integers(0, 2**32)), max_size=4),
)
def test_a_grown_render_is_the_render_from_scratch_whatever_the_session_does(
    seed: int, turns: int, overrides: dict[str, Any], edits: list[tuple[str, int]]
) -> None:
    """Jumps back in the tree, compactions, recoveries, errors and colliding timestamps, at any
    line: the memo's render (grown or not) is the render from scratch."""
    entries = _edited(generate_session(seed, turns), edits)
    lines = [dumps_entry(entry).encode() + b"\n" for entry in entries]
    with tempfile.TemporaryDirectory() as tmp:
        _grow(lines, Path(tmp), build_config(overrides))


@pytest.mark.parametrize("name", ["before-compaction.jsonl", "large-session.jsonl"])
def test_the_memo_is_exact_on_the_real_sessions_and_mostly_reused(
    tmp_path: Path, name: str
) -> None:
    """The real sessions (compactions, recoveries, errors), every 9th line: the same views, and
    many renders reuse the chains (they move only with flushes, here every few lines)."""
    source = SESSIONS / name
    if not source.exists():
        pytest.skip("../shared is absent")
    lines = source.read_bytes().splitlines(keepends=True)
    renders, reused, grown = _grow(lines, tmp_path, DEFAULT_CONFIG, every=9)
    assert reused >= renders // 3
    assert grown >= renders // 3


def test_a_compact_command_with_no_new_message_derives_again(tmp_path: Path) -> None:
    """`/pruner compact` adds a compression point (window 0) where no message came since the last
    one: the messages read are the same, the chains are not, and the memo sees it."""
    write_session(tmp_path, generate_session(9, 40))
    live = LiveFolds([tmp_path], journals=False)
    live.discover()
    live.poll()
    (session_id,) = live.sessions
    session = live.sessions[session_id]
    store = live.runtime.store
    before = context_at(session.entries, store, session_id, live.config, [], session.memo)
    last = compression_points(store, session_id, live.config)[-1]
    # right after the last flush's point: the same messages before it
    at = last.seq + 1 if last.closing else last.seq
    compact = [compact_point(at, None, store, session_id)]
    after = context_at(session.entries, store, session_id, live.config, compact, session.memo)
    assert len(after.chains) > len(before.chains)  # window 0 compresses the recent chains too
    fresh = context_at(session.entries, store, session_id, live.config, compact)
    _same(after, fresh)


@pytest.mark.parametrize("kind", EDITS)
def test_each_edit_that_reaches_back_renders_from_scratch(kind: str) -> None:
    """Each kind of edit, four times over a dozen sessions with a short chain window (ranges
    early): every render equals the one from scratch, whatever the edit reaches back into."""
    config = build_config({"chainCompression": {"rollingWindow": 1}})
    for seed in range(12):
        entries = _edited(generate_session(seed, 25), [(kind, seed * 7 + k) for k in range(4)])
        lines = [dumps_entry(entry).encode() + b"\n" for entry in entries]
        with tempfile.TemporaryDirectory() as tmp:
            _grow(lines, Path(tmp), config)
