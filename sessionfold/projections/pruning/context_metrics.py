"""The three context metrics of pi-condense (reference §9.2), kept incrementally.

The digest's apply functions call `fold_row` for every message that joins the branch and
`rebuild` after a branch switch; both keep running sums in the head record's `mx` dict:
`tot` (all chars), `open`/`think` (chars and thinking chars after the last text-only assistant),
`chain`/`cpre` (the open chain's chars, and its chars before the first user after its start),
`big` (largest closed or interrupted chain), and the frontier gap: `gap` (tokens), `fr`
([turn, call id] or None), `gb`/`gt` (boundary row and turn, -1 when the window is the whole
branch), `gx` (the boundary turn's excluded call ids), `gw` (the first assistant after the
boundary, None while that turn is still open), `prot` (protection config, None for default),
`ep` (on_summarized calls so far: a summarized mark `s/<occ>` holds the epoch that wrote it and
counts only below `ep`, so a call whose head write was lost is redone whole on redelivery).

Hooks for the pruning fold, each amortized O(1) per message:
- `on_frontier(store, session_id, frontier)`: the frontier moved (`last_attempted_turn_index`,
  `last_attempted_tool_call_id`); a forward move walks from the old boundary to the new one, a
  backward move or an unresolvable boundary recomputes the gap (rare).
- `on_summarized(store, session_id, occurrence_keys)`: those results leave the gap for good.
- `set_protection(store, session_id, protection)`: a config change; recomputes the gap.
`snapshot(store, session_id)` reads the metrics; `naive_snapshot(messages, ...)` recomputes
them from the definition over a message list (tests, benchmarks).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, cast

from sessionfold.projections.jsjson import js_json_length, js_number_text
from sessionfold.projections.pruning.message_facts import (
    is_passthrough,
    is_text_only_assistant,
    path_argument,
)
from sessionfold.projections.pruning.records import ContextMetricsState, DigestHead, MessageRow
from sessionfold.projections.store import Store, key

DEFAULT_PROTECTED_PATHS = ("**/skills/**/*.md",)


@dataclass(frozen=True)
class Protection:
    """pi-condense's `isProtected(toolName, args)` (§5.1): by tool name or by `args.path` glob."""

    protected_tools: tuple[str, ...] = ()
    protected_paths: tuple[str, ...] = field(default=DEFAULT_PROTECTED_PATHS)
    #: `protects` answers by (tool name, path), filled by callers that ask often (capture).
    memo: dict[tuple[Any, str | None], bool] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    def __post_init__(self) -> None:
        # Lists are accepted for convenience; tuples keep the config hashable for the glob cache.
        object.__setattr__(self, "protected_tools", tuple(self.protected_tools))
        object.__setattr__(self, "protected_paths", tuple(self.protected_paths))

    def is_protected(self, tool_name: Any, args: Any) -> bool:
        """True when the tool is protected by name or its file argument matches a glob."""
        return self.protects(tool_name, path_argument(args))

    def protects(self, tool_name: Any, path: str | None) -> bool:
        """The same predicate given the `path` argument alone (None when absent or not a str)."""
        if tool_name in self.protected_tools:
            return True
        if path is None or not self.protected_paths:
            return False
        return glob_match(self.protected_paths, path.replace("\\", "/"))

    def to_json(self) -> dict[str, list[str]]:
        """The config as stored in the head record."""
        return {"tools": list(self.protected_tools), "paths": list(self.protected_paths)}


DEFAULT_PROTECTION = Protection()


#: Paths up to this long are matched by the globs' regex (fast, and its backtracking over
#: several `**/` stays small); longer ones by the glob machines, linear in the path.
GLOB_REGEX_CHARS = 256


def glob_match(globs: tuple[str, ...], path: str) -> bool:
    """True when `path` matches one of the globs whole (§5.1), in time linear in the path.

    The regex a glob becomes backtracks over every way its `**/` can split the directories:
    quadratic in a path with many matching directories (`skills/skills/...`), worse with
    more `**/`. A short path takes the regex; a long one runs each glob's state machine
    (`_GlobMachine`), which reads every character once and says the same.
    """
    if len(path) <= GLOB_REGEX_CHARS:
        return _globs(globs).fullmatch(path) is not None
    return any(_machine(glob).matches(path) for glob in globs)


@lru_cache(maxsize=64)
def _globs(globs: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{_glob_regex(g)})" for g in globs), re.DOTALL)


def _glob_tokens(glob: str) -> list[str]:
    """A glob's pieces: `**/`, `**`, `*`, `?`, or one literal character."""
    tokens = []
    i = 0
    while i < len(glob):
        if glob.startswith("**/", i):
            tokens.append("**/")
            i += 3
        elif glob.startswith("**", i):
            tokens.append("**")
            i += 2
        else:
            tokens.append(glob[i])
            i += 1
    return tokens


_TOKEN_REGEX = {"**/": "(?:[^/]*/)*", "**": ".*", "*": "[^/]*", "?": "[^/]"}


def _glob_regex(glob: str) -> str:
    """§5.1: `*`/`?` within a segment, `**/` zero or more directories, bare `**` anything."""
    return "".join(_TOKEN_REGEX.get(t) or re.escape(t) for t in _glob_tokens(glob))


@dataclass(frozen=True, slots=True)
class _GlobMachine:
    """A glob as a set of states, one bit each, advanced one path character at a time.

    State k waits for piece k; the last state accepts. A literal or `?` moves on (`shift`),
    `*` and `**` stay on a character they take (`loop`) and may be passed by (`skip1`),
    and `**/` has two states: at a directory's start (it may be passed by: `skip2`) and
    inside one, which a "/" ends (`back`, to the first). Each step from a set of states on a
    kind of character is worked out once and kept (`steps`), so a long path costs a lookup
    or two per character.
    """

    masks: dict[str, tuple[int, int, int]]  # char -> (shift, loop, back); "" for any other
    skip1: int
    skip2: int
    accept: int
    steps: dict[int, dict[str, int]] = field(default_factory=dict)

    def _closed(self, states: int) -> int:
        while True:
            more = states | ((states & self.skip1) << 1) | ((states & self.skip2) << 2)
            if more == states:
                return states
            states = more

    def _step(self, states: int, kind: str) -> int:
        shift, loop, back = self.masks[kind]
        return self._closed(((states & shift) << 1) | (states & loop) | ((states & back) >> 1))

    def matches(self, path: str) -> bool:
        masks, steps = self.masks, self.steps
        states = self._closed(1)
        row = steps.setdefault(states, {})
        for char in path:
            kind = char if char in masks else ""
            after = row.get(kind)
            if after is None:
                after = row[kind] = self._step(states, kind)
            if after != states:
                if not after:
                    return False
                states = after
                row = steps.setdefault(states, {})
        return bool(states & self.accept)


@lru_cache(maxsize=64)
def _machine(glob: str) -> _GlobMachine:
    literal: dict[str, int] = {}  # char -> the states of literal pieces of that char
    single = star = anything = start = inside = skip1 = skip2 = 0
    state = 0
    for token in _glob_tokens(glob):
        bit = 1 << state
        if token == "**/":
            start |= bit
            inside |= bit << 1
            skip2 |= bit
            state += 2
            continue
        if token == "?":
            single |= bit
        elif token == "*":
            star |= bit
            skip1 |= bit
        elif token == "**":
            anything |= bit
            skip1 |= bit
        else:
            literal[token] = literal.get(token, 0) | bit
        state += 1

    def masks(char: str) -> tuple[int, int, int]:
        if char == "/":
            return literal.get("/", 0), anything | start, inside
        return literal.get(char, 0) | single | start, star | anything | inside, 0

    table = {char: masks(char) for char in literal}
    table["/"] = masks("/")
    table[""] = masks("")
    return _GlobMachine(table, skip1, skip2, 1 << state)


def _protection_of(mx: ContextMetricsState) -> Protection:
    config = mx.get("prot")
    if config is None:
        return DEFAULT_PROTECTION
    return _protection_from(tuple(config["tools"]), tuple(config["paths"]))


@lru_cache(maxsize=64)
def _protection_from(tools: tuple[str, ...], paths: tuple[str, ...]) -> Protection:
    return Protection(tools, paths)


def js_round(value: float) -> int:
    """JavaScript's Math.round for a non-negative number: halves round up."""
    whole = int(value // 1)
    return whole + 1 if value - whole >= 0.5 else whole


# --- state -----------------------------------------------------------------------------------


def new_state() -> ContextMetricsState:
    """The metrics part (`mx`) of a fresh head record."""
    return {
        "tot": 0,
        "open": 0,
        "think": 0,
        "chain": -1,
        "cpre": -1,
        "big": 0,
        "gap": 0,
        "fr": None,
        "gb": -1,
        "gt": -1,
        "gx": [],
        "gw": None,
        "prot": None,
        "ep": 0,
    }


def empty_head() -> DigestHead:
    """A fresh head record (the digest's fields and the metrics')."""
    return {"leaf": None, "last": None, "k": 0, "n": 0, "turns": 0, "gen": 0, "mx": new_state()}


def peek_head(store: Store, session_id: str) -> DigestHead:
    """The stored head record itself, to read and never change (no copy: a reader's fast path)."""
    stored: DigestHead | None = store.get(f"{session_id}/h")
    return empty_head() if stored is None else stored


def load_head(store: Store, session_id: str) -> DigestHead:
    """A private copy of the head record to change and put back (never mutate a stored value:
    with a dict store that would write before the event's commit point)."""
    stored: DigestHead | None = store.get(f"{session_id}/h")
    if stored is None:
        return empty_head()
    mx = stored["mx"].copy()
    mx["gx"] = list(mx["gx"])
    # dict.copy clones the table in one step; `{**stored, "mx": mx}` inserted key by key.
    state = stored.copy()
    state["mx"] = mx
    return state


def _row(store: Store, session_id: str, n: int) -> MessageRow:
    return cast(MessageRow, store.get(f"{session_id}/m/{n}"))  # key(session_id, "m", n)


def fold_row(store: Store, session_id: str, state: DigestHead, row: MessageRow) -> None:
    """Add one message row that joined the branch at its end to the running sums in `state`."""
    mx = state["mx"]
    chars = row["chars"]
    role = row["role"]
    text_only = role == "assistant" and row["textOnly"]
    mx["tot"] += chars
    _fold_chain(mx, row, chars, role, text_only)
    if text_only:
        mx["open"] = 0  # the open segment starts strictly after the last text-only assistant
        mx["think"] = 0
    else:
        mx["open"] += chars
        if role == "assistant":
            mx["think"] += row["think"]
    if role == "assistant":
        _fold_boundary(mx, row)
    elif role == "toolResult" and _counted(store, session_id, mx, row):
        mx["gap"] += row["tokens"]


def _fold_chain(
    mx: ContextMetricsState, row: MessageRow, chars: int, role: str, text_only: bool
) -> None:
    """detectChains (§8.1) as a running sum: chains are index ranges over the projection."""
    if role == "user" and not row.get("pass"):
        if mx["chain"] >= 0:
            # Interrupted: its range ends before the first user message after its start.
            interrupted = mx["cpre"] if mx["cpre"] >= 0 else mx["chain"]
            mx["big"] = max(mx["big"], interrupted)
        mx["chain"] = chars
        mx["cpre"] = -1
        return
    if mx["chain"] < 0:
        return  # idle: messages before the first user or after a closed chain
    if role == "user" and mx["cpre"] < 0:
        mx["cpre"] = mx["chain"]  # a passthrough user: the end of an interrupted range
    mx["chain"] += chars
    if text_only:
        mx["big"] = max(mx["big"], mx["chain"])
        mx["chain"] = -1
        mx["cpre"] = -1


def _fold_boundary(mx: ContextMetricsState, row: MessageRow) -> None:
    """An assistant joined: it may be the frontier's turn, or the end of the boundary turn."""
    if mx["gb"] >= 0:
        if mx["gw"] is None:
            mx["gw"] = row["n"]
        return
    frontier = mx["fr"]
    if frontier is None or row["turn"] != frontier[0]:
        return
    excluded = _excluded_ids(row, frontier[1])
    if excluded is not None:
        # Everything before this row is at or before the boundary.
        mx["gb"], mx["gt"], mx["gx"], mx["gw"], mx["gap"] = row["n"], row["turn"], excluded, None, 0


def _excluded_ids(assistant: MessageRow, call_id: str) -> list[Any] | None:
    """The boundary turn's call ids up to and including `call_id`; None when it is not there."""
    ids = [call["id"] for call in assistant["calls"]]
    if call_id not in ids:
        return None
    return ids[: ids.index(call_id) + 1]


def _after_boundary(n: int, call_id: Any, gb: int, gx: list[Any], gw: int | None) -> bool:
    if n <= gb:
        return False
    in_window = gb >= 0 and (gw is None or n < gw)
    return not (in_window and call_id in gx)


def _eligible(store: Store, session_id: str, mx: ContextMetricsState, row: MessageRow) -> bool:
    """Summarization-eligible: not summarized (by occurrence key) and not protected."""
    if _marked(store, session_id, mx, row["occ"]):
        return False
    protection = _protection_of(mx)
    tool, path = row["tool"], row.get("path")
    if type(tool) is not str:
        return not protection.protects(tool, path)  # a malformed name: maybe not hashable
    # The globs run once per (tool, path) pair: every result joining the branch asks.
    pair = (tool, path)
    hit = protection.memo.get(pair)
    if hit is None:
        hit = protection.memo[pair] = protection.protects(tool, path)
    return not hit


def _counted(store: Store, session_id: str, mx: ContextMetricsState, row: MessageRow) -> bool:
    return _after_boundary(row["n"], row["callId"], mx["gb"], mx["gx"], mx["gw"]) and _eligible(
        store, session_id, mx, row
    )


def rebuild(store: Store, session_id: str, state: DigestHead) -> None:
    """Recompute `state`'s metrics and assistant count from the branch rows (after a switch)."""
    old = state["mx"]
    state["mx"] = new_state()
    state["mx"]["fr"] = old["fr"]
    state["mx"]["prot"] = old["prot"]
    state["mx"]["ep"] = old["ep"]
    turns = 0
    for n in range(state["n"]):
        row = _row(store, session_id, n)
        if row["role"] == "assistant":
            turns += 1
        fold_row(store, session_id, state, row)
    state["turns"] = turns


# --- hooks for the pruning fold --------------------------------------------------------------


def on_frontier(store: Store, session_id: str, frontier: Mapping[str, Any] | None) -> str | None:
    """The prune frontier moved: move the gap's boundary (§9.2). Returns the branch's leaf
    (the head is read here anyway: the flush that moved the frontier records it)."""
    state = load_head(store, session_id)
    mx = state["mx"]
    wanted = _frontier_pair(frontier)
    if wanted == mx["fr"]:
        return state["leaf"]
    mx["fr"] = wanted
    located = _locate(store, session_id, state, wanted, mx)
    if located is None and mx["gb"] < 0:
        store.put(f"{session_id}/h", state)  # still the whole-branch window: same gap
        return state["leaf"]
    if located is not None and located[0] >= mx["gb"]:
        _advance_boundary(store, session_id, state, *located)
    else:
        _recompute_gap(store, session_id, state, located)
    store.put(f"{session_id}/h", state)
    return state["leaf"]


def _frontier_pair(frontier: Mapping[str, Any] | None) -> list[Any] | None:
    if frontier is None:
        return None
    turn = frontier.get("last_attempted_turn_index", frontier.get("lastAttemptedTurnIndex"))
    call_id = frontier.get("last_attempted_tool_call_id", frontier.get("lastAttemptedToolCallId"))
    return [turn, call_id]


def _locate(
    store: Store,
    session_id: str,
    state: DigestHead,
    frontier: list[Any] | None,
    mx: ContextMetricsState,
) -> tuple[int, list[Any]] | None:
    """The boundary assistant's position and excluded ids, or None (whole-branch window)."""
    if frontier is None:
        return None
    turn, call_id = frontier
    if not isinstance(turn, int) or isinstance(turn, bool) or not 0 <= turn < state["turns"]:
        return None
    # Turns only grow along the branch: start from the old boundary when it is not past it.
    start = mx["gb"] if 0 <= mx["gt"] <= turn else 0
    count = state["n"]
    # The call index names the latest assistant on this branch with the frontier's call (`g`,
    # written since the last switch): when that is the turn's row, it is the one row the scan
    # below finds (an assistant's turn is its place among the branch's assistants: one row
    # per turn), without reading every row since the old boundary. Any other answer scans.
    found = store.get(f"{session_id}/c/{call_id}") if type(call_id) is str else None
    if found is not None and found["g"] == state["gen"] and start <= found["n"] < count:
        n = found["n"]
        named: MessageRow | None = store.get(f"{session_id}/m/{n}")
        if named is not None and named["role"] == "assistant" and named["turn"] == turn:
            excluded = _excluded_ids(named, call_id)
            return None if excluded is None else (n, excluded)
    for n in range(start, count):
        # _row spelled out in the scan (no call, no cast): the head says the row exists.
        row: MessageRow = store.get(f"{session_id}/m/{n}")  # type: ignore[assignment]
        if row["role"] == "assistant" and row["turn"] == turn:
            excluded = _excluded_ids(row, call_id)
            return None if excluded is None else (n, excluded)
    return None


def _advance_boundary(
    store: Store, session_id: str, state: DigestHead, gb: int, gx: list[Any]
) -> None:
    """Move the boundary forward: only results between the old and the new window change."""
    mx = state["mx"]
    old = (mx["gb"], mx["gx"], mx["gw"])
    window_end = None
    for n in range(old[0] + 1, state["n"]):
        # _row spelled out in the scan (no call, no cast): the head says the row exists.
        row: MessageRow = store.get(f"{session_id}/m/{n}")  # type: ignore[assignment]
        if row["role"] == "assistant" and n > gb:
            window_end = n  # past here both boundaries count every result
            break
        if row["role"] != "toolResult":
            continue
        before = _after_boundary(n, row["callId"], *old)
        after = _after_boundary(n, row["callId"], gb, gx, None)
        if before != after and _eligible(store, session_id, mx, row):
            mx["gap"] += row["tokens"] if after else -row["tokens"]
    mx["gb"], mx["gt"], mx["gx"], mx["gw"] = gb, _row(store, session_id, gb)["turn"], gx, window_end


def _recompute_gap(
    store: Store,
    session_id: str,
    state: DigestHead,
    located: tuple[int, list[Any]] | None,
) -> None:
    """The gap from scratch over the branch (a backward move or an unresolvable boundary)."""
    mx = state["mx"]
    gb, gx = located if located is not None else (-1, [])
    mx["gb"], mx["gx"], mx["gw"], mx["gap"] = gb, gx, None, 0
    mx["gt"] = _row(store, session_id, gb)["turn"] if gb >= 0 else -1
    for n in range(gb + 1, state["n"]):
        row = _row(store, session_id, n)
        if row["role"] == "assistant" and mx["gw"] is None and gb >= 0:
            mx["gw"] = n
        elif row["role"] == "toolResult" and _counted(store, session_id, mx, row):
            mx["gap"] += row["tokens"]


def on_summarized(store: Store, session_id: str, occurrence_keys: Iterable[str]) -> None:
    """Those tool results are summarized now: they leave the frontier gap."""
    state = load_head(store, session_id)
    mx = state["mx"]
    protection = _protection_of(mx)
    for occ in occurrence_keys:
        if _marked(store, session_id, mx, occ):
            continue
        # The mark carries this call's epoch; it counts once the head (written last) moves past.
        store.put(f"{session_id}/s/{occ}", mx["ep"])
        for n in store.get(f"{session_id}/o/{occ}") or ():
            row = _row(store, session_id, n) if n < state["n"] else None
            if row is None or row.get("occ") != occ:
                continue  # a position from an abandoned branch
            if _after_boundary(
                n, row["callId"], mx["gb"], mx["gx"], mx["gw"]
            ) and not protection.protects(row["tool"], row.get("path")):
                mx["gap"] -= row["tokens"]
    mx["ep"] += 1
    store.put(f"{session_id}/h", state)


def is_summarized(store: Store, session_id: str, occ: str) -> bool:
    """Whether on_summarized has marked that occurrence key."""
    return _marked(store, session_id, peek_head(store, session_id)["mx"], occ)


def _marked(store: Store, session_id: str, mx: ContextMetricsState, occ: str) -> bool:
    """A committed summarized mark: one left by a call whose head write was lost is not."""
    epoch = store.get(f"{session_id}/s/{occ}")  # key(session_id, "s", occ)
    return epoch is not None and epoch < mx["ep"]


def set_protection(store: Store, session_id: str, protection: Protection) -> None:
    """Change the protection config for the gap (a config change); recomputes the gap."""
    state = load_head(store, session_id)
    mx = state["mx"]
    mx["prot"] = None if protection == DEFAULT_PROTECTION else protection.to_json()
    located = None if mx["gb"] < 0 else (mx["gb"], mx["gx"])
    _recompute_gap(store, session_id, state, located)
    store.put(key(session_id, "h"), state)


# --- reading ---------------------------------------------------------------------------------


def snapshot(store: Store, session_id: str) -> dict[str, int]:
    """The ContextMetricsSnapshot of the current branch (§9.2), from the running sums."""
    mx = peek_head(store, session_id)["mx"]
    return _snapshot(mx["think"], mx["big"], mx["open"], mx["tot"], mx["gap"])


def _snapshot(think: int, big: int, open_chars: int, total: int, gap: int) -> dict[str, int]:
    share = 0 if total == 0 else js_round(100 * max(big, open_chars) / total)
    return {
        "open_cycle_thinking_tokens": js_round(think / 4),
        "largest_chain_share_pct": share,
        "frontier_gap_tokens": gap,
    }


# --- the definition, recomputed in full --------------------------------------------------------


def naive_snapshot(
    messages: Sequence[Mapping[str, Any]],
    frontier: Mapping[str, Any] | None = None,
    summarized: Iterable[str] = frozenset(),
    protection: Protection = DEFAULT_PROTECTION,
) -> dict[str, int]:
    """The snapshot recomputed from §9.2 over a branch's message dicts (projection of §9.1)."""
    summarized = frozenset(summarized)
    chars = [js_json_length(m) for m in messages]
    text_only = [is_text_only_assistant(m) for m in messages]
    last_text_only = max((i for i, t in enumerate(text_only) if t), default=-1)
    open_start = last_text_only + 1
    thinking = sum(
        js_json_length(block)
        for m in messages[open_start:]
        if m.get("role") == "assistant" and isinstance(m.get("content"), list)
        for block in m["content"]
        if isinstance(block, dict) and block.get("type") == "thinking"
    )
    largest = 0
    for start, end in _naive_chains(messages, text_only):
        largest = max(largest, sum(chars[start : end + 1]))
    gap = _naive_gap(messages, chars, frontier, summarized, protection)
    return _snapshot(thinking, largest, sum(chars[open_start:]), sum(chars), gap)


def _naive_chains(
    messages: Sequence[Mapping[str, Any]], text_only: list[bool]
) -> list[tuple[int, int]]:
    """Closed and interrupted chains of detectChains, as inclusive index ranges."""
    chains = []
    start = None
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "user":
            if is_passthrough(message):
                continue
            if start is not None:
                next_user = next(
                    j for j in range(start + 1, len(messages)) if _is_user(messages[j])
                )
                chains.append((start, next_user - 1))
            start = i
        elif start is not None and text_only[i]:
            chains.append((start, i))
            start = None
    return chains


def _is_user(message: Mapping[str, Any]) -> bool:
    return message.get("role") == "user"


def _naive_gap(
    messages: Sequence[Mapping[str, Any]],
    chars: list[int],
    frontier: Mapping[str, Any] | None,
    summarized: frozenset[str],
    protection: Protection,
) -> int:
    boundary, turn_end, excluded = -1, len(messages), []
    pair = _frontier_pair(frontier)
    if pair is not None:
        counter = 0
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            if counter == pair[0]:
                ids = [b.get("id") for b in _naive_calls(message)]
                if pair[1] in ids:
                    boundary = i
                    excluded = ids[: ids.index(pair[1]) + 1]
                    turn_end = next(
                        (j for j in range(i + 1, len(messages)) if _is_assistant(messages[j])),
                        len(messages),
                    )
                break
            counter += 1
    gap = 0
    for i in range(boundary + 1, len(messages)):
        message = messages[i]
        if message.get("role") != "toolResult":
            continue
        call_id = message.get("toolCallId")
        if i < turn_end and call_id in excluded:
            continue
        if _naive_occ(call_id, message.get("timestamp")) in summarized:
            continue
        if protection.is_protected(message.get("toolName"), _naive_args(messages, i, call_id)):
            continue
        gap += js_round(chars[i] / 4)
    return gap


def _is_assistant(message: Mapping[str, Any]) -> bool:
    return message.get("role") == "assistant"


def _naive_calls(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == "toolCall"]


def _naive_args(messages: Sequence[Mapping[str, Any]], index: int, call_id: Any) -> Any:
    """Args of `call_id` in the nearest preceding assistant that has it (`input ?? arguments`)."""
    if not isinstance(call_id, str):
        return None
    for i in range(index - 1, -1, -1):
        if not _is_assistant(messages[i]):
            continue
        for block in _naive_calls(messages[i]):
            if block.get("id") == call_id:
                args = block.get("input")
                return block.get("arguments") if args is None else args
    return None


def _naive_occ(call_id: Any, timestamp: Any) -> str:
    bare = call_id if isinstance(call_id, str) else "undefined" if call_id is None else str(call_id)
    if isinstance(timestamp, int | float) and not isinstance(timestamp, bool):
        return f"{bare}@{js_number_text(timestamp)}"
    return bare
