"""bench/gateway_cost.py on a small generated session, so it cannot rot: the prices add up by
hand, unpruned is 1.0, and a policy that never rewrites costs what unpruned costs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# bench/ holds scripts, not a package: its helpers are imported the way the scripts import them.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from gateway_cost import Call, Prices, every_flush, main, measure, price, replay

from sessionfold.projections.pruning.config import build_config, parse_override
from sessionfold.projections.views.context import message_tokens
from sessionfold.streams.tools.synthetic_claude import write_claude_fleet
from sessionfold.streams.web.cache_policy import CachePolicy, Chosen


def _message(n: int, text: str = "x" * 396) -> dict[str, object]:
    return {
        "role": "toolResult",
        "toolCallId": f"c{n}",
        "content": [{"type": "text", "text": text}],
    }


def test_a_call_reads_the_prefix_it_shares_with_the_last_one_within_the_ttl() -> None:
    """Two calls 10 s apart: the second reads the first's messages and writes its new one; past
    the TTL it writes all of it; a rewritten result ends the prefix there."""
    one, two = _message(1), _message(2)
    size = message_tokens(one)
    assert size == message_tokens(two) > 100
    prices = Prices(input=1e6, read=0.1, write=1.25, ttl_s=300)
    calls = [Call(0, [one], {}, {"c1": 1}), Call(10, [one, two], {}, {"c1": 1, "c2": 1})]
    bill = price(calls, lambda _call: Chosen(), prices)
    assert bill.cost == pytest.approx(size * 1.25 + size * 0.1 + size * 1.25)
    assert bill.breaks == 0
    late = [calls[0], Call(400, [one, two], {}, {})]
    assert price(late, lambda _call: Chosen(), prices).cost == pytest.approx(3 * size * 1.25)

    def stubbing(call: Call) -> Chosen:
        return Chosen({"c1": "stub"} if call.at else {})

    rewritten = price(calls, stubbing, prices)
    assert rewritten.breaks == 1 and rewritten.cost > size * 1.25 * 2
    # with its break free, the second call reads what the first sent and writes the rest
    stubbed = message_tokens({**one, "content": [{"type": "text", "text": "stub"}]})
    free = price(calls, stubbing, prices, free_breaks=True)
    assert free.breaks == 1
    assert free.cost == pytest.approx(size * 1.25 + size * 0.1 + stubbed * 1.25)


def test_ratios_on_a_generated_session(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """unpruned is 1.0; a cache-aware policy that never frees enough to change equals it; the
    tables and the goals come out."""
    [written] = [
        w for w in write_claude_fleet(tmp_path, 1, 60, 1) if w.path.parent.name != "subagents"
    ]
    session = replay(written.path)
    assert session.turns >= 50 and len(session.calls) >= 50
    got = measure(session, Prices(), [0, 20_000])
    assert got["unpruned"][0] == 1.0 and got["unpruned"][1].breaks <= 1  # its own compaction
    assert all(0 < ratio < 2 for ratio, _bill in got.values())
    assert any(call.plan for call in session.calls)  # the fold rewrites something
    assert any(call.spans for call in session.calls)  # and drops a compressed chain whole
    held = CachePolicy(min_freed_tokens=10**12, cache_ttl_s=float("inf"))  # and no tail
    never = price(session.calls, lambda c: held.choose("s", c.plan, c.present, c.at), Prices())
    assert never.cost == pytest.approx(got["unpruned"][1].cost)
    assert price(session.calls, every_flush, Prices()).cost == pytest.approx(got["every"][1].cost)
    assert got["no-break"][1].cost < got["every"][1].cost  # its breaks cost something
    off = replay(written.path, config=build_config(parse_override("enabled=false")))
    assert not any(call.plan or call.chains for call in off.calls)  # settings reach the fold
    assert main([str(written.path), "--claude-code", "0", "--codex", "0", "--min-freed", "0"]) == 0
    out = capsys.readouterr().out
    for heading in ("cost relative to unpruned", "prefix breaks", "goals for aware 10k*"):
        assert heading in out
    assert "no-break" in out
