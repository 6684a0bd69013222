"""The chain memo `sessionfold serve` keeps per session (views/context.py `ChainMemo`): a render
that reuses the chains of the previous one is the render from scratch, at every line of a
growing session, under any pruning settings (hypothesis) and on the real sessions."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionfold.projections.pruning.config import DEFAULT_CONFIG, PruneConfig, build_config
from sessionfold.projections.views.context import (
    ContextView,
    compact_point,
    compression_points,
    context_at,
)
from sessionfold.streams.runtime.live import LiveFolds
from sessionfold.streams.tools.synthetic import generate_session, write_session

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


def _grow(lines: list[bytes], folder: Path, config: PruneConfig, every: int = 1) -> tuple[int, int]:
    """Write `lines` one by one, rendering with the memo and from scratch after each
    `every`th; (renders, how many of them reused the memo's chains)."""
    target = folder / "session.jsonl"
    target.write_bytes(b"")
    live = LiveFolds([folder], config=config, journals=False)
    live.discover()
    renders = reused = 0
    for number, line in enumerate(lines, 1):
        with target.open("ab") as handle:
            handle.write(line)
        live.poll()
        if not live.sessions or (number % every and number != len(lines)):
            continue
        (session_id,) = live.sessions
        memo = live.sessions[session_id].chains
        derived = memo.derived
        _same(live.view(session_id), _fresh(live, session_id))
        renders += 1
        reused += derived is not None and memo.derived is derived
    return renders, reused


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
        _grow(lines, live_dir, build_config(overrides))


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
    renders, reused = _grow(lines, tmp_path, DEFAULT_CONFIG, every=9)
    assert reused >= renders // 3


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
    before = context_at(session.entries, store, session_id, live.config, [], session.chains)
    last = compression_points(store, session_id, live.config)[-1]
    # right after the last flush's point: the same messages before it
    at = last.seq + 1 if last.closing else last.seq
    compact = [compact_point(at, None, store, session_id)]
    after = context_at(session.entries, store, session_id, live.config, compact, session.chains)
    assert len(after.chains) > len(before.chains)  # window 0 compresses the recent chains too
    fresh = context_at(session.entries, store, session_id, live.config, compact)
    _same(after, fresh)
