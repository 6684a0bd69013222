"""When the gateway changes what it rewrites: only when it pays for the cache it breaks.

A provider bills a cached prefix at about a tenth and writes a changed one again at a premium
(Anthropic: reads 0.1x, writes 1.25x for five minutes), so a rewrite that moves at every flush
can cost more than it saves. Per session the gateway keeps the texts it applies (and the
compressed chains it drops) and keeps applying exactly those, call after call (the prefix
stays byte for byte the same), until the fold's newer plan frees at least `min_freed_tokens`
over them, or frees at least a third of what it makes the provider write again (the request
from the first result or chain it changes to the end: a change near the end costs little), or
the session's last call is older than the cache's life (`cache_ttl_s`: the prefix is gone
anyway). A session's first call takes the plan as it is (no prefix of ours is cached yet).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

#: Tokens a change must free before the cached prefix is given up (OpenCode holds 20k; 10k was
#: as cheap as 5k or cheaper on every session bench/gateway_cost.py replayed, beside the tail
#: rule below: docs/live.md, "Costs").
MIN_FREED_TOKENS = 10_000
#: A change of fewer tokens is made at once when the request from where it begins to the end
#: is at most this many times what it frees (bench/gateway_cost.py: 3 was as cheap as 2 and
#: cheaper than 4, and unlike 2 never dearer than rewriting at every flush at a rolling window
#: of one turn).
TAIL_PER_FREED = 3
#: Anthropic's default cache life, seconds.
CACHE_TTL_S = 300.0
#: Sessions whose applied texts are kept (the least recently used go first).
MAX_SESSIONS = 10_000

#: The chars of a request from the first of some results (tool call ids) or chains (chain
#: ids) to its end, as the agent sent it: what the provider writes again when those change.
Tail = Callable[[set[str], set[str]], int]


@dataclass(frozen=True)
class Chain:
    """A compressed chain the gateway drops whole: its calls (each call and its result go) and
    the text that stands in for them."""

    calls: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class Chosen:
    """What one call is sent: result texts by tool call id, and the chains dropped by id."""

    texts: dict[str, str] = field(default_factory=dict)
    chains: dict[str, Chain] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.texts or self.chains)


@dataclass
class Applied:
    """What one session's calls have been sent, and when its last call was."""

    chosen: Chosen
    last_call: float


@dataclass
class CachePolicy:
    """The applied texts and chains per session, and the rule that changes them."""

    min_freed_tokens: int = MIN_FREED_TOKENS
    cache_ttl_s: float = CACHE_TTL_S
    sessions: OrderedDict[str, Applied] = field(default_factory=OrderedDict)

    def choose(
        self,
        session: str,
        plan: dict[str, str],
        present: dict[str, int],
        now: float,
        count_only: bool = False,
        chains: dict[str, Chain] | None = None,
        spans: dict[str, int] | None = None,
        tail: Tail | None = None,
    ) -> Chosen:
        """What to send in this call: `plan` (tool call id -> text) restricted to the results
        the call carries (`present`: id -> its content's size in chars) and `chains` to those
        it can drop (`spans`: chain id -> chars its range holds besides its results), or what
        was applied before while the plan's change would not pay (`tail`: where the change
        begins; None: wherever). `count_only` (a token count) reads the policy and changes
        nothing."""
        spans = spans or {}
        wanted = _within(Chosen(plan, chains or {}), present, spans)
        kept = self.sessions.get(session)
        if count_only:
            return wanted if kept is None else _within(kept.chosen, present, spans)
        if kept is None:
            kept = Applied(wanted, now)
        elif wanted != (sent := _within(kept.chosen, present, spans)):
            expired = now - kept.last_call >= self.cache_ttl_s
            freed = _size(sent, present, spans) - _size(wanted, present, spans)
            if (
                expired
                or freed // 4 >= self.min_freed_tokens
                or (
                    tail is not None
                    and freed > 0
                    and tail(*_changed(sent, wanted)) <= TAIL_PER_FREED * freed
                )
            ):
                kept.chosen = wanted
        kept.last_call = now
        self.sessions.pop(session, None)
        self.sessions[session] = kept
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
        return _within(kept.chosen, present, spans)


def _within(chosen: Chosen, present: dict[str, int], spans: dict[str, int]) -> Chosen:
    """`chosen` restricted to the results this call carries and the chains it can drop."""
    return Chosen(
        {call: text for call, text in chosen.texts.items() if call in present},
        {key: chain for key, chain in chosen.chains.items() if key in spans},
    )


def _changed(sent: Chosen, wanted: Chosen) -> tuple[set[str], set[str]]:
    """The results and the chains whose treatment differs between two choices."""
    texts, chains = sent.texts, sent.chains
    return (
        {c for c in texts.keys() | wanted.texts.keys() if texts.get(c) != wanted.texts.get(c)},
        {k for k in chains.keys() | wanted.chains.keys() if chains.get(k) != wanted.chains.get(k)},
    )


def _size(chosen: Chosen, present: dict[str, int], spans: dict[str, int]) -> int:
    """The chars this call's results and chain ranges take when `chosen` is applied."""
    covered = {call for chain in chosen.chains.values() for call in chain.calls}
    total = sum(len(chain.text) for chain in chosen.chains.values())
    total += sum(other for key, other in spans.items() if key not in chosen.chains)
    for call, size in present.items():
        if call not in covered:
            text = chosen.texts.get(call)
            total += size if text is None else len(text)
    return total
