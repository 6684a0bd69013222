"""What the gateway needs to know of a model API: what names a call's session, where its
usage is, and how the API says an error. One module per API defines its `ModelApi`
(anthropic_api.py for Claude Code, openai_api.py for Codex); gateway.py relays their routes to
the upstream the user chose.

Read only from headers and the request body the agent sent: never logged, never stored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

#: Usage as the gateway counts it: tokens read fresh, read from the cache, written to the
#: cache, and output (the four parts every provider bills apart).
USAGE_PARTS = ("input", "cache_read", "cache_write", "output")


@dataclass(frozen=True)
class ChainSpan:
    """Where a compressed chain lies in a request: the index of the prompt that starts it, of
    the first and the last message or item of its range (what lies between the prompt and the
    range, such as Claude Code's environment message, stays); `other`: the chars the range
    holds besides its results (calls, assistant text and thinking, reasoning), which dropping
    it frees too."""

    start: int
    first: int
    end: int
    other: int


@dataclass(frozen=True)
class ModelApi:
    """One model API: its name, its routes (method, path), its default upstream, and readers."""

    name: str
    routes: tuple[tuple[str, str], ...]
    default_upstream: str
    #: The session a call belongs to, from its headers (lower-case names) and its body.
    session_of: Callable[[Mapping[str, str], bytes], str | None]
    #: The usage a stream event reports ({part: tokens} of USAGE_PARTS, a part absent when the
    #: event does not say it), or None; given the event's name and its parsed data.
    usage_of: Callable[[str, Any], dict[str, int] | None]
    #: The events whose data `usage_of` reads (the others are never parsed).
    usage_events: frozenset[str]
    #: The JSON body of an error the gateway itself answers, in the API's own shape.
    error_body: Callable[[str, str], bytes]
    #: The tool results a parsed request carries: (tool call id, the block or item holding the
    #: result), in order.
    results: Callable[[Any], list[tuple[str, dict[str, Any]]]]
    #: Put a text in place of a result's content (its other fields, cache markers among them,
    #: stay).
    replace: Callable[[dict[str, Any], str], None]
    #: Where each chain (chain id -> its calls) lies in a parsed request, for the chains whose
    #: range holds exactly those calls and their results (the others' results are stubbed one
    #: by one instead).
    chain_spans: Callable[[Any, Mapping[str, Sequence[str]]], dict[str, ChainSpan]]
    #: Drop a chain's range from a parsed request and put its text after the prompt.
    drop_chain: Callable[[Any, ChainSpan, str], None]
    #: The first way a parsed request breaks the API's pairing of calls and results, or None.
    problem: Callable[[Any], str | None]
    #: A parsed request's turns (messages, or input items) and the index of the turn holding
    #: each tool result: where a rewrite of that result begins.
    turns: Callable[[Any], tuple[list[Any], dict[str, int]]]


def call_positions(calls_at: Sequence[Sequence[Any]]) -> dict[Any, list[int]]:
    """Each call id -> the indices of the messages or items naming it (`calls_at[n]`: the ids
    the n-th one names): a request read once for all its chains."""
    positions: dict[Any, list[int]] = {}
    for n, calls in enumerate(calls_at):
        for call in calls:
            positions.setdefault(call, []).append(n)
    return positions


def named_range(positions: Mapping[Any, list[int]], calls: Sequence[str]) -> tuple[int, int]:
    """The first and last index naming one of `calls`, or (-1, -1) when none does."""
    named = [n for call in set(calls) for n in positions.get(call, ())]
    return (min(named), max(named)) if named else (-1, -1)


def pairs_exactly(made: Sequence[Any], answered: Sequence[Any], calls: Sequence[str]) -> bool:
    """Whether a chain's range made exactly its `calls`, each once, and answered each."""
    wanted = set(calls)
    return len(made) == len(wanted) and set(made) == wanted and sorted(answered) == sorted(made)


def json_object(text: Any) -> dict[str, Any]:
    """`text` (str or bytes) parsed as a JSON object, or {} (a header or field the agent may
    leave out, a body that is no JSON object)."""
    if not isinstance(text, (str, bytes)) or not text:
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def nonempty(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def count(usage: Any, name: str) -> int | None:
    value = usage.get(name) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
