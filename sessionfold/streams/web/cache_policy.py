"""When the gateway changes what it rewrites: only when it pays for the cache it breaks.

A provider bills a cached prefix at about a tenth and writes a changed one again at a premium
(Anthropic: reads 0.1x, writes 1.25x for five minutes), so a rewrite that moves at every flush
can cost more than it saves. Per session the gateway keeps the texts it applies and keeps
applying exactly those, call after call (the prefix stays byte for byte the same), until the
fold's newer plan frees at least `min_freed_tokens` over them, or the session's last call is
older than the cache's life (`cache_ttl_s`: the prefix is gone anyway). A session's first call
takes the plan as it is (no prefix of ours is cached yet).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

#: Tokens a change must free before the cached prefix is given up (OpenCode holds 20k; 5k was
#: cheaper on every session bench/gateway_cost.py replayed: docs/live.md, "Costs").
MIN_FREED_TOKENS = 5_000
#: Anthropic's default cache life, seconds.
CACHE_TTL_S = 300.0
#: Sessions whose applied texts are kept (the least recently used go first).
MAX_SESSIONS = 10_000


@dataclass
class Applied:
    """What one session's calls have been sent: result texts by tool call id, and when."""

    texts: dict[str, str]
    last_call: float


@dataclass
class CachePolicy:
    """The applied texts per session, and the rule that changes them."""

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
    ) -> dict[str, str]:
        """The texts to put in this call's results: `plan` (tool call id -> text) restricted
        to the results the call carries (`present`: id -> its content's size in chars), or the
        texts applied before while the plan's change would not pay. `count_only` (a token
        count) reads the policy and changes nothing."""
        wanted = {call: text for call, text in plan.items() if call in present}
        kept = self.sessions.get(session)
        if count_only:
            return wanted if kept is None else _within(kept.texts, present)
        if kept is None:
            kept = Applied(wanted, now)
        elif wanted != _within(kept.texts, present):
            expired = now - kept.last_call >= self.cache_ttl_s
            if expired or _freed(wanted, kept.texts, present) >= self.min_freed_tokens:
                kept.texts = wanted
        kept.last_call = now
        self.sessions.pop(session, None)
        self.sessions[session] = kept
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
        return _within(kept.texts, present)


def _within(texts: dict[str, str], present: dict[str, int]) -> dict[str, str]:
    return {call: text for call, text in texts.items() if call in present}


def _freed(wanted: dict[str, str], applied: dict[str, str], present: dict[str, int]) -> int:
    """Tokens (chars / 4) the wanted texts free against the applied ones, over this call."""

    def size(texts: dict[str, str], call: str) -> int:
        text = texts.get(call)
        return present[call] if text is None else len(text)

    calls = set(wanted) | set(_within(applied, present))
    return sum(size(applied, c) - size(wanted, c) for c in calls) // 4
