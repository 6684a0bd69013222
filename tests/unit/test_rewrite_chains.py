"""The plan's compressed chains (views/rewrite.py `chain_plan`) are what the render did: their
calls are exactly the calls whose assistant messages the render dropped, each chain's text is
the message that stands in for it, and the calls a chain drops are never stubbed apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from context_oracles import views_at_turns

from sessionfold.projections.pruning.config import build_config
from sessionfold.projections.views.rewrite import chain_plan, rewrite_plan
from sessionfold.streams.tools.synthetic import generate_session, write_session


def _calls(messages: list[dict[str, Any]]) -> set[str]:
    return {
        block["id"]
        for m in messages
        if m.get("role") == "assistant" and isinstance(m.get("content"), list)
        for block in m["content"]
        if isinstance(block, dict) and block.get("type") == "toolCall"
    }


@pytest.mark.parametrize(("seed", "window"), [(3, 1), (8, 2), (21, 3)])
def test_the_plans_chains_are_the_calls_the_render_dropped(
    tmp_path: Path, seed: int, window: int
) -> None:
    path = write_session(tmp_path, generate_session(seed, 120)).path
    config = build_config({"chainCompression": {"rollingWindow": window}})
    seen = 0
    for point in views_at_turns(path, config, lambda turn: turn % 10 == 9):
        view = point.view
        chains = chain_plan(view)
        seen += len(chains)
        # by message (the generated story reuses call ids across turns); an assistant message
        # the render changed (an errored call's arguments purged) keeps its timestamp
        kept = {m.get("timestamp") for m in view.messages if m.get("role") == "assistant"}
        dropped = _calls([m for m in view.base if m.get("timestamp") not in kept])
        assert {c for chain in chains for c in chain["calls"]} == dropped
        texts = [
            m["content"][0]["text"]
            for m in view.messages
            if m.get("role") == "user" and isinstance(m.get("content"), list) and m["content"]
        ]
        for chain in chains:
            assert chain["text"] in texts
            assert chain["text"].startswith(f'<compressed-chain id="{chain["id"]}"')
        assert set(rewrite_plan(view)) >= dropped  # the stubs the gateway falls back to
    assert seen, "no chain was compressed"
