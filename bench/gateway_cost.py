"""What the gateway's rewrite costs in input tokens under a provider's prompt cache.

    .venv/bin/python bench/gateway_cost.py [FILES...] [--claude-code 2] [--codex 2]
        [--turns 250] [--min-freed 0,5000,10000,20000,40000] [--price 3] [--read 0.1]
        [--write 1.25] [--ttl 300] [--set chainCompression.rollingWindow=1 ...]

Each session file (pi, Claude Code or Codex; `--claude-code N` and `--codex N` add generated
ones of about `--turns` turns) is replayed with its timestamps. Before each assistant message the
agent made one call: the agent's messages up to it (the view's `unpruned`), sized per message
as pi-condense counts (`message_tokens`). A call within `--ttl` seconds of the previous one
reads the longest common prefix of the two from the cache (`--read` times the input price) and
writes the rest (`--write` times); a call after a longer gap writes all of it. Prefixes are
compared message by message: the first message that differs from the previous call's message
at its position ends the prefix. Output is billed the same under every policy, so it is left
out; so are the system prompt and tools (a fixed cached prefix: it would add the same reads to
every policy and pull every ratio towards 1).

Policies, each priced as a ratio of `unpruned`:
- `unpruned`: the agent's own messages;
- `every`: every result the fold's plan (views/rewrite.py, of the render after the previous
  assistant message: what serve's plan route gives at the call) rewrites is sent rewritten,
  and every compressed chain it names is dropped whole (its calls, results and assistant
  messages; its text after its prompt, as the gateway does it), re-planned at every call (a
  plan change breaks the prefix at once);
- `aware X`: the gateway's CachePolicy with `min_freed_tokens` X (the default marked `*`);
- `no-break` (priced, not a policy the gateway has): `every` as if a moved prefix cost
  nothing: each call within the TTL reads as many tokens as the call before sent (or all it
  sends, if fewer) and writes only the rest. No cache policy that applies the fold's plan gets
  far below it: it is what the plan itself leaves unpruned.

`breaks` counts the calls within the TTL whose prefix is shorter than the previous call. The
goals of issue #41: cache-aware (default) at most 0.35x of unpruned on sessions over 200 turns,
and never dearer than `every`. `--set KEY=VALUE` replays with a pruning setting changed (as
`sessionfold serve --set` folds), e.g. a rolling window of one turn.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

# tests/ holds the replay oracle the bench renders with (not a package: put on the path).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from context_oracles import views_at_turns

from sessionfold.projections.pruning.config import (
    DEFAULT_CONFIG,
    PruneConfig,
    build_config,
    parse_override,
)
from sessionfold.projections.views.context import message_tokens
from sessionfold.projections.views.rewrite import chain_plan, rewrite_plan
from sessionfold.streams.tools.synthetic_claude import write_claude_fleet
from sessionfold.streams.tools.synthetic_codex import write_codex_fleet
from sessionfold.streams.web.cache_policy import (
    CACHE_TTL_S,
    MIN_FREED_TOKENS,
    CachePolicy,
    Chain,
    Chosen,
    Tail,
)
from sessionfold.streams.web.model_api import call_positions, named_range, pairs_exactly

#: The cache-aware goal on sessions over `LONG_TURNS` turns, as a ratio of unpruned.
GOAL_RATIO = 0.35
LONG_TURNS = 200
#: `every` priced as if its breaks cost nothing: what the fold's plan leaves unpruned.
NO_BREAK = "no-break"

Message = dict[str, Any]
#: A policy: given a call, the texts to put in its results and the chains to drop.
Policy = Callable[["Call"], Chosen]


@dataclass(frozen=True)
class Prices:
    """Input price per million tokens and the cache's multipliers and life."""

    input: float = 3.0
    read: float = 0.1
    write: float = 1.25
    ttl_s: float = CACHE_TTL_S


@dataclass
class Call:
    """One model call: when, the agent's messages, the plan serve had, and its results'
    sizes (tool call id -> chars of the result's content, as the gateway measures them);
    the plan's chains and where those the messages hold whole lie (chain id -> (first index,
    last index, chars besides the results))."""

    at: float
    messages: list[Message]
    plan: dict[str, str]
    present: dict[str, int]
    chains: dict[str, Chain] = field(default_factory=dict)
    spans: dict[str, tuple[int, int, int]] = field(default_factory=dict)


@dataclass
class Priced:
    """A policy's bill over a session: input cost, tokens sent, prefix breaks."""

    cost: float = 0.0
    tokens: int = 0
    breaks: int = 0


@dataclass
class Session:
    """A replayed session: its name, turns (assistant messages) and calls."""

    name: str
    turns: int
    calls: list[Call] = field(default_factory=list)


def _seconds(message: Message, fallback: float) -> float:
    stamp = message.get("timestamp")
    if isinstance(stamp, (int, float)) and not isinstance(stamp, bool):
        return stamp / 1000.0
    if isinstance(stamp, str):
        try:
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    return fallback


def replay(path: Path, name: str | None = None, config: PruneConfig = DEFAULT_CONFIG) -> Session:
    """The calls of one session file: before each assistant message, the messages up to it and
    the plan of the render (folded with `config`) after the assistant message before."""
    session = Session(name or path.name, 0)
    plan: dict[str, str] = {}
    chains: dict[str, Chain] = {}
    at = 0.0
    for point in views_at_turns(path, config):
        if point.turn < 0:
            break
        session.turns += 1
        messages = point.view.unpruned
        last = max(
            (n for n, m in enumerate(messages) if m.get("role") == "assistant"), default=None
        )
        if last is not None and last > 0:
            at = _seconds(messages[last], at)
            sent = messages[:last]
            present = {
                m["toolCallId"]: len(orjson.dumps(m.get("content")))
                for m in sent
                if m.get("role") == "toolResult" and isinstance(m.get("toolCallId"), str)
            }
            spans = _spans(sent, chains)
            session.calls.append(Call(at, sent, plan, present, chains, spans))
        plan = rewrite_plan(point.view)
        chains = {c["id"]: Chain(tuple(c["calls"]), c["text"]) for c in chain_plan(point.view)}
    return session


def _calls_of(message: Message) -> list[Any]:
    if message.get("role") == "toolResult":
        return [message.get("toolCallId")]
    content = message.get("content") if message.get("role") == "assistant" else None
    return [
        b.get("id")
        for b in (content if isinstance(content, list) else [])
        if isinstance(b, dict) and b.get("type") == "toolCall"
    ]


def _spans(messages: list[Message], chains: dict[str, Chain]) -> dict[str, tuple[int, int, int]]:
    """Where each chain lies in pi's messages, by the rules the gateway's APIs follow
    (web/anthropic_api.py `_chain_spans`): its prompt, a range of its calls and results only,
    then an answer with no call; chains the messages do not hold so are left out."""
    positions = call_positions([_calls_of(m) for m in messages])
    found = {}
    for key, chain in chains.items():
        first, end = named_range(positions, chain.calls)
        if first < 0 or end + 1 >= len(messages):
            continue
        start = first - 1  # the prompt, past messages of other roles (attachments)
        while start >= 0 and messages[start].get("role") not in ("user", "assistant"):
            start -= 1
        after = messages[end + 1]
        if start < 0 or messages[start].get("role") != "user" or after.get("role") != "assistant":
            continue
        inside = messages[first : end + 1]
        made = [c for m in inside if m.get("role") == "assistant" for c in _calls_of(m)]
        answered = [c for m in inside if m.get("role") == "toolResult" for c in _calls_of(m)]
        if _calls_of(after) or not pairs_exactly(made, answered, chain.calls):
            continue
        other = sum(len(orjson.dumps(m)) for m in inside if m.get("role") == "assistant")
        found[key] = (first, end, other)
    return found


def unpruned(_call: Call) -> Chosen:
    """The agent's own messages: nothing rewritten."""
    return Chosen()


def every_flush(call: Call) -> Chosen:
    """The plan as it is at each call."""
    texts = {c: t for c, t in call.plan.items() if c in call.present}
    return Chosen(texts, {k: c for k, c in call.chains.items() if k in call.spans})


def cache_aware(min_freed: int, ttl_s: float) -> Policy:
    """The gateway's CachePolicy, one session's state."""
    policy = CachePolicy(min_freed_tokens=min_freed, cache_ttl_s=ttl_s)
    return lambda call: policy.choose(
        "s",
        call.plan,
        call.present,
        call.at,
        chains=call.chains,
        spans={k: span[2] for k, span in call.spans.items()},
        tail=_tail(call),
    )


def _tail(call: Call) -> Tail:
    """The call's chars from the first of some results or chains to its end (the gateway's
    `_tail`, over pi's messages)."""

    def chars(calls: set[str], chains: set[str]) -> int:
        holding = {m.get("toolCallId"): n for n, m in enumerate(call.messages)}
        starts = [holding[c] for c in calls if c in holding]
        starts += [call.spans[k][0] for k in chains if k in call.spans]
        return len(orjson.dumps(call.messages[min(starts, default=0) :]))

    return chars


class _Rewrites:
    """Rewritten messages, one object per (message, text) and per chain: equal calls share
    them."""

    def __init__(self) -> None:
        self.made: dict[tuple[int, str], Message] = {}
        self.chains: dict[str, Message] = {}

    def apply(self, call: Call, chosen: Chosen) -> list[Message]:
        if not chosen:
            return call.messages
        texts = chosen.texts
        out = []
        for m in call.messages:
            text = texts.get(m.get("toolCallId")) if m.get("role") == "toolResult" else None
            if text is None:
                out.append(m)
                continue
            key = (id(m), text)
            if key not in self.made:
                made = {**m, "content": [{"type": "text", "text": text}]}
                made.pop("isError", None)
                self.made[key] = made
            out.append(self.made[key])
        for key in sorted(chosen.chains, key=lambda k: call.spans[k][0], reverse=True):
            first, end, _other = call.spans[key]
            if key not in self.chains:
                text = chosen.chains[key].text
                self.chains[key] = {"role": "user", "content": [{"type": "text", "text": text}]}
            out[first : end + 1] = [self.chains[key]]
        return out


def price(
    calls: Sequence[Call], policy: Policy, prices: Prices, free_breaks: bool = False
) -> Priced:
    """One policy's input bill over the calls (`free_breaks`: a call within the TTL reads as
    many tokens as the call before sent, whatever moved)."""
    bill = Priced()
    rewrites = _Rewrites()
    before: list[Message] = []
    before_total = 0
    before_at: float | None = None
    for call in calls:
        sent = rewrites.apply(call, policy(call))
        sizes = [message_tokens(m) for m in sent]
        total = sum(sizes)
        cached = 0
        if before_at is not None and call.at - before_at < prices.ttl_s:
            common = 0
            for a, b in zip(before, sent, strict=False):
                if a is not b and a != b:
                    break
                common += 1
            cached = sum(sizes[:common])
            if common < len(before):
                bill.breaks += 1
            if free_breaks:
                cached = min(total, before_total)
        bill.tokens += total
        bill.cost += (cached * prices.read + (total - cached) * prices.write) * prices.input / 1e6
        before, before_total, before_at = sent, total, call.at
    return bill


def policies(min_freed: Sequence[int], ttl_s: float) -> dict[str, Callable[[], Policy]]:
    """Every policy by name, each made fresh per session."""
    made: dict[str, Callable[[], Policy]] = {
        "unpruned": lambda: unpruned,
        "every": lambda: every_flush,
    }
    for x in min_freed:
        made[f"aware {x // 1000}k"] = lambda x=x: cache_aware(x, ttl_s)
    return made


def measure(
    session: Session, prices: Prices, min_freed: Sequence[int]
) -> dict[str, tuple[float, Priced]]:
    """Per policy: its cost relative to unpruned, and its bill."""
    bills = {
        name: price(session.calls, make(), prices)
        for name, make in policies(min_freed, prices.ttl_s).items()
    }
    bills[NO_BREAK] = price(session.calls, every_flush, prices, free_breaks=True)
    base = bills["unpruned"].cost or 1.0
    return {name: (bill.cost / base, bill) for name, bill in bills.items()}


def generated(out: Path, claude_code: int, codex: int, turns: int) -> Iterator[tuple[str, Path]]:
    """Generated sessions: (name, main file) of each."""
    for n, written in enumerate(
        w
        for w in write_claude_fleet(out / "cc", claude_code, turns, 1)
        if w.path.parent.name != "subagents"
    ):
        yield f"claude-code#{n}", written.path
    # Codex's generator counts user turns, about three assistant messages each
    for n, written in enumerate(write_codex_fleet(out / "codex", codex, max(1, turns // 3), 1)):
        yield f"codex#{n}", written.path


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--claude-code", type=int, default=2)
    parser.add_argument("--codex", type=int, default=2)
    parser.add_argument("--turns", type=int, default=250)
    parser.add_argument("--min-freed", default="0,5000,10000,20000,40000")
    parser.add_argument("--price", type=float, default=3.0, help="input, $ per million tokens")
    parser.add_argument("--read", type=float, default=0.1, help="cache read, x the input price")
    parser.add_argument("--write", type=float, default=1.25, help="cache write, x the input")
    parser.add_argument("--ttl", type=float, default=CACHE_TTL_S, help="cache life, seconds")
    parser.add_argument(
        "--set", action="append", default=[], help="a pruning setting, KEY=VALUE (repeatable)"
    )
    args = parser.parse_args(argv)
    prices = Prices(args.price, args.read, args.write, args.ttl)
    config = build_config(*(parse_override(text) for text in args.set))
    min_freed = sorted({int(x) for x in args.min_freed.split(",") if x} | {MIN_FREED_TOKENS})
    with tempfile.TemporaryDirectory() as scratch:
        named = [(p.name[:24], p) for p in args.files]
        named += list(generated(Path(scratch), args.claude_code, args.codex, args.turns))
        sessions = [replay(path, name, config) for name, path in named]
    if args.set:
        print("pruning settings: " + ", ".join(args.set))
    return report(sessions, prices, min_freed)


def report(sessions: Sequence[Session], prices: Prices, min_freed: Sequence[int]) -> int:
    """Print the tables and whether the goals hold."""
    default = f"aware {MIN_FREED_TOKENS // 1000}k"
    print(
        f"input ${prices.input}/MTok, cache read {prices.read}x, write {prices.write}x, "
        f"TTL {prices.ttl_s:g} s; output left out (the same in every policy)"
    )
    results = [(s, measure(s, prices, min_freed)) for s in sessions]
    names = list(results[0][1]) if results else []
    label = {n: n + ("*" if n == default else "") for n in names}
    width = max(24, *(len(s.name) for s in sessions)) if sessions else 24
    head = f"{'session':<{width}} {'turns':>5} {'calls':>5} {'$unpr':>7} "
    print("\ncost relative to unpruned")
    print(head + " ".join(f"{label[n]:>10}" for n in names))
    for s, got in results:
        print(
            f"{s.name:<{width}} {s.turns:>5} {len(s.calls):>5} {got['unpruned'][1].cost:>7.2f} "
            + " ".join(f"{got[n][0]:>10.3f}" for n in names)
        )
    print("\ninput tokens sent relative to unpruned (what the rewrite frees, cache aside)")
    print(f"{'session':<{width}} " + " ".join(f"{label[n]:>10}" for n in names))
    for s, got in results:
        base = got["unpruned"][1].tokens or 1
        print(f"{s.name:<{width}} " + " ".join(f"{got[n][1].tokens / base:>10.3f}" for n in names))
    print("\nprefix breaks (calls within the TTL whose cached prefix moved)")
    print(f"{'session':<{width}} " + " ".join(f"{label[n]:>10}" for n in names))
    for s, got in results:
        print(f"{s.name:<{width}} " + " ".join(f"{got[n][1].breaks:>10}" for n in names))
    print("\nper policy over the sessions (ratio: geometric mean; long: over 200 turns)")
    print(f"{'policy':<12} {'mean':>7} {'worst long':>10} {'dearer than every':>18}")
    ok = True
    for n in names[2:]:
        ratios = [got[n][0] for _s, got in results]
        long = [got[n][0] for s, got in results if s.turns > LONG_TURNS]
        dearer = sum(got[n][1].cost > got["every"][1].cost + 1e-9 for _s, got in results)
        print(
            f"{label[n]:<12} {statistics.geometric_mean(ratios):>7.3f} "
            f"{max(long, default=float('nan')):>10.3f} {dearer:>18}"
        )
    print(f"\ngoals for {default}*:")
    for s, got in results:
        ratio, every = got[default][0], got["every"][0]
        if s.turns > LONG_TURNS:
            holds = ratio <= GOAL_RATIO
            ok &= holds
            floor = got[NO_BREAK][0]
            why = "" if holds or floor <= GOAL_RATIO else f" (no-break {floor:.3f}: the plan's own)"
            print(f"  {s.name}: {ratio:.3f} <= {GOAL_RATIO}: {'holds' if holds else 'MISSED'}{why}")
        holds = ratio <= every + 1e-9
        ok &= holds
        print(f"  {s.name}: {ratio:.3f} <= every {every:.3f}: {'holds' if holds else 'MISSED'}")
    print(f"\nevery goal holds: {'yes' if ok else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
