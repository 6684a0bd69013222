"""Chains (reference §8): detection, eligibility, and the chain entries a session has at a point.

pi-condense compresses chains after every flush that processed a batch (§5.5 step 14) and on
`/pruner compact`, and logs one `ChainCompressionEntry` per compressed chain. The fold does not
run that step (a chain entry depends only on the branch, the index and the flush attempts, all
of which the log and the state already hold), so `derive_entries` replays it: at each
compression point, in order, it detects the chains on the branch as it was then, takes the
closed ones beyond the rolling window, and composes their entries. The result is what pi's
registry would hold, byte for byte the same for the same state.

Two things differ from pi-condense, on purpose:
- No range-fusion model call: a view makes no model calls, so a covered chain's body is the
  concatenation of its per-batch summaries (pi's own fallback when fusion fails).
- Every unprotected output in a compressed range gets a ref (reference §13.2 item 10, §14.8):
  its `tN` when indexed, its occurrence key when indexed without one (spilled), and otherwise
  `e<seq>`, the log position of the original (what pi's backfill would have indexed). The refs
  are listed in the synthetic's `tools` attribute, and the deterministic body cites them.

Pure: messages and the store in, entries out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from sessionfold.projections.pruning import index
from sessionfold.projections.pruning.capture import call_arguments, js_head, js_length
from sessionfold.projections.pruning.context_metrics import Protection, js_round
from sessionfold.projections.pruning.digest import occurrence_key, tool_calls
from sessionfold.projections.store import Store
from sessionfold.projections.views.recall import resolve_ref as resolve_ref

COMPRESSED_PREFIX = "<compressed-chain"
RECOVERY_TOOL = "context_tree_query"
DETERMINISTIC_HEAD = (
    "Deterministic chain compression (no per-batch summary existed for this span; raw outputs "
    "recoverable via context_tree_query)."
)
ARGS_EXCERPT = 200  # chars of a call's JSON arguments in the deterministic body


# --- detection (§8.1) ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Chain:
    """One chain of a message array: a user prompt and what followed up to a text-only reply."""

    start: int  # index of the start user message
    end: int | None  # index of the final assistant; None when interrupted by the next prompt
    start_ts: Any
    final_ts: Any
    middle_ids: tuple[str, ...]
    middle_keys: tuple[str, ...]
    protected_ids: tuple[str, ...]


def first_text(message: Mapping[str, Any]) -> str:
    """The message's content when a string, else its first block's text (or "")."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and isinstance(content[0], dict):
        text = content[0].get("text")
        return text if isinstance(text, str) else ""
    return ""


def is_passthrough(message: Mapping[str, Any]) -> bool:
    """A user message that is a compressed-chain synthetic: it neither starts nor ends a chain."""
    return first_text(message).startswith(COMPRESSED_PREFIX)


@dataclass
class _Open:
    start: int
    start_ts: Any
    ids: dict[str, None] = field(default_factory=dict)
    keys: dict[str, None] = field(default_factory=dict)
    protected: dict[str, None] = field(default_factory=dict)

    def chain(self, end: int | None, final_ts: Any) -> Chain:
        """The chain as emitted: closed at `end`, or interrupted when `end` is None."""
        return Chain(
            self.start,
            end,
            self.start_ts,
            final_ts,
            tuple(self.ids),
            tuple(self.keys),
            tuple(self.protected),
        )


def detect_chains(messages: Sequence[Mapping[str, Any]], protection: Protection) -> list[Chain]:
    """`detectChains`: closed and interrupted chains in order; an open last chain is left out."""
    chains: list[Chain] = []
    current: _Open | None = None
    for position, message in enumerate(messages):
        role = message.get("role")
        if role == "user":
            if is_passthrough(message):
                continue
            if current is not None:
                chains.append(current.chain(None, None))
            current = _Open(position, message.get("timestamp"))
        elif current is None:
            continue  # before the first prompt, or between a reply and the next prompt
        elif role == "assistant":
            calls = tool_calls(message)
            if not calls:
                chains.append(current.chain(position, message.get("timestamp")))
                current = None
                continue
            for block in calls:
                call_id = block.get("id")
                if not isinstance(call_id, str):
                    continue
                current.ids.setdefault(call_id)
                if protection.is_protected(block.get("name"), call_arguments(block)):
                    current.protected.setdefault(call_id)
        elif role == "toolResult":
            call_id = message.get("toolCallId")
            if not isinstance(call_id, str):
                continue
            current.ids.setdefault(call_id)
            current.keys.setdefault(occurrence_key(call_id, message.get("timestamp")))
            if protection.is_protected(message.get("toolName"), None):
                current.protected.setdefault(call_id)
    return chains


# --- recovery grace (§7.3) -------------------------------------------------------------------


def grace_keys(messages: Sequence[Mapping[str, Any]], turns: int) -> frozenset[str]:
    """Occurrence keys of recovery-tool results at most `turns` user turns old."""
    return _Grace(messages).keys(len(messages), turns)


class _Grace:
    """Recovery-tool results and user counts of an array, for grace sets of its prefixes."""

    def __init__(self, messages: Sequence[Mapping[str, Any]]) -> None:
        self.users_before: list[int] = []  # user messages at or before each position
        self.recoveries: list[tuple[int, str]] = []
        users = 0
        for position, message in enumerate(messages):
            role = message.get("role")
            if role == "user":
                users += 1
            elif role == "toolResult" and message.get("toolName") == RECOVERY_TOOL:
                key = occurrence_key(message.get("toolCallId"), message.get("timestamp"))
                self.recoveries.append((position, key))
            self.users_before.append(users)

    def keys(self, length: int, turns: int) -> frozenset[str]:
        """The grace set of the first `length` messages (age = users in all - users so far)."""
        if turns <= 0 or not self.recoveries or length == 0:
            return frozenset()
        total = self.users_before[length - 1]
        return frozenset(
            key
            for position, key in self.recoveries
            if position < length and total - self.users_before[position] <= turns
        )


def _touches_grace(chain: Chain, grace: frozenset[str]) -> bool:
    if not grace:
        return False
    if chain.middle_keys:
        keyed = set(chain.middle_keys)
        bare = {k.rpartition("@")[0] or k for k in keyed}
        return any(g in keyed or ("@" not in g and g in bare) for g in grace)
    return any(g.rpartition("@")[0] in chain.middle_ids or g in chain.middle_ids for g in grace)


# --- chain entries ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChainRecord:
    """One unprotected output of a compressed range: what the deterministic body cites."""

    key: str
    seq: int | None
    tool: str
    args: Any
    time: int | None
    ref: str


@dataclass(frozen=True, slots=True)
class ChainEntry:
    """pi-condense's ChainCompressionEntry (§8.4), as derived for this point."""

    block_id: str
    start_user_timestamp: Any
    final_assistant_timestamp: Any
    dropped_tool_call_ids: tuple[str, ...]
    dropped_occurrence_keys: tuple[str, ...]
    protected_tool_call_ids: tuple[str, ...]
    tool_refs: tuple[str, ...]
    compressed_at: Any
    range_summary_text: str | None = None
    body_source: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The entry as pi-condense logs it (camelCase, optional fields left out)."""
        data: dict[str, Any] = {
            "blockId": self.block_id,
            "startUserTimestamp": self.start_user_timestamp,
            "droppedToolCallIds": list(self.dropped_tool_call_ids),
            "droppedOccurrenceKeys": list(self.dropped_occurrence_keys),
            "finalAssistantTimestamp": self.final_assistant_timestamp,
            "toolRefs": list(self.tool_refs),
            "compressedAt": self.compressed_at,
        }
        if self.protected_tool_call_ids:
            data["protectedToolCallIds"] = list(self.protected_tool_call_ids)
        if self.range_summary_text is not None:
            data["rangeSummaryText"] = self.range_summary_text
        if self.body_source is not None:
            data["bodySource"] = self.body_source
        return data


@dataclass(frozen=True, slots=True)
class CompressionPoint:
    """When pi-condense would run chain compression: after a flush attempt that processed a
    batch (window = rollingWindow) or on `/pruner compact` (window 0)."""

    seq: int
    closing: bool  # the entry at `seq` is the closing reply of a message-end flush: include it
    time_ms: int | None
    window: int
    attempt: int  # flush attempts completed by then: which summaries exist


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One diagnostic of pi-condense's DiagnosticSink (§8.6): kept in the view, never logged."""

    kind: str
    key: str
    detail: str


def log_ref(seq: int) -> str:
    """The ref of an output nothing indexed: its position in session-events."""
    return f"e{seq}"


def ref_for(store: Store, session_id: str, key: str, seq: int | None) -> str | None:
    """The ref that recovers one output: its `tN`, else its occurrence key when indexed, else
    its log position; None when nothing points at it."""
    row = index.record(store, session_id, key)
    if row is not None:
        return row.get("ref") or key
    return log_ref(seq) if seq is not None else None


def _iso(ms: int) -> str:
    """JavaScript's `new Date(ms).toISOString()`."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _args_excerpt(args: Any) -> str:
    """JSON.stringify(args), cut to ARGS_EXCERPT UTF-16 units with "..." when longer."""
    text = orjson.dumps(args).decode() if args is not None else "{}"
    if len(text) <= ARGS_EXCERPT and (text.isascii() or js_length(text) <= ARGS_EXCERPT):
        return text
    # A JS unit is never less than one char, so the cut lies within the first ARGS_EXCERPT chars.
    return js_head(text[:ARGS_EXCERPT], ARGS_EXCERPT) + "..."


def deterministic_body(records: Sequence[ChainRecord]) -> str:
    """The 7-line body of a chain no per-batch summary covers (§8.3, pinned grammar)."""
    timed = sorted(records, key=lambda r: r.time if r.time is not None else 0)
    counts = Counter(r.tool for r in records)
    tools = ", ".join(
        f"{name} x{n}" for name, n in sorted(counts.items(), key=lambda i: (-i[1], i[0]))
    )
    first, last = timed[0], timed[-1]
    start, end = first.time or 0, last.time or 0
    seconds = js_round(max(0, end - start) / 1000)
    return "\n".join(
        [
            DETERMINISTIC_HEAD,
            f"Calls: {len(records)}",
            f"Tools: {tools}",
            f"Span: {_iso(start)} -> {_iso(end)} ({seconds}s)",
            f"First: {first.tool} {_args_excerpt(first.args)}",
            f"Last: {last.tool} {_args_excerpt(last.args)}",
            f"Refs: {', '.join(r.ref for r in records)}",
        ]
    )


def chain_records(
    messages: Sequence[Mapping[str, Any]],
    seqs: Sequence[int | None],
    chain: Chain,
    ref_of: Callable[[str, int | None], str | None],
) -> list[ChainRecord]:
    """The unprotected outputs inside a closed chain's range, with their refs, in order."""
    assert chain.end is not None
    protected = set(chain.protected_ids)
    args: dict[str, Any] = {}
    records = []
    for position in range(chain.start + 1, chain.end):
        message = messages[position]
        role = message.get("role")
        if role == "assistant":
            for block in tool_calls(message):
                if isinstance(block.get("id"), str):
                    args.setdefault(block["id"], call_arguments(block))
            continue
        call_id = message.get("toolCallId")
        if role != "toolResult" or not isinstance(call_id, str) or call_id in protected:
            continue
        key = occurrence_key(call_id, message.get("timestamp"))
        ref = ref_of(key, seqs[position])
        if ref is None:
            continue
        stamp = message.get("timestamp")
        records.append(
            ChainRecord(
                key=key,
                seq=seqs[position],
                tool=str(message.get("toolName")),
                args=args.get(call_id, {}),
                time=int(stamp) if isinstance(stamp, int | float) else None,
                ref=ref,
            )
        )
    return records


def derive_entries(
    messages: Sequence[Mapping[str, Any]],
    seqs: Sequence[int],
    points: Sequence[CompressionPoint],
    covered: Callable[[Sequence[str], int], bool],
    ref_of: Callable[[str, int | None], str | None],
    protection: Protection,
    grace_turns: int,
) -> tuple[list[ChainEntry], list[Diagnostic]]:
    """The chain entries compression would have logged by now, in compression order.

    `messages`/`seqs` are the branch's message entries; `covered(keys, attempt)` says whether a
    summary written by flush attempt <= `attempt` covers any of `keys`.
    """
    chains = [c for c in detect_chains(messages, protection) if c.end is not None]
    registry: dict[Any, ChainEntry] = {}
    diagnostics: list[Diagnostic] = []
    recoveries = _Grace(messages)
    for point in points:
        length = prefix_length(seqs, point.seq, point.closing)
        candidates = [
            c
            for c in chains
            if c.end is not None
            and c.end < length
            and c.start_ts not in registry
            and c.middle_ids
            and isinstance(c.start_ts, int | float)
        ]
        eligible = candidates[: max(0, len(candidates) - point.window)]
        grace = recoveries.keys(length, grace_turns)
        for chain in eligible:
            if _touches_grace(chain, grace):
                continue  # deferred, without shifting the window (§8.2 step 3)
            entry, problem = _compose(messages, seqs, chain, point, covered, ref_of, len(registry))
            if problem is not None:
                diagnostics.append(problem)
            if entry is not None:
                registry[chain.start_ts] = entry
    return list(registry.values()), diagnostics


def prefix_length(seqs: Sequence[int], seq: int, closing: bool) -> int:
    """How many branch messages existed when a compression at `seq` ran."""
    count = 0
    for value in seqs:
        if value < seq or (closing and value == seq):
            count += 1
        else:
            break
    return count


def _compose(
    messages: Sequence[Mapping[str, Any]],
    seqs: Sequence[int],
    chain: Chain,
    point: CompressionPoint,
    covered: Callable[[Sequence[str], int], bool],
    ref_of: Callable[[str, int | None], str | None],
    issued: int,
) -> tuple[ChainEntry | None, Diagnostic | None]:
    lookup = chain.middle_keys or chain.middle_ids
    records = chain_records(messages, seqs, chain, ref_of)
    body = None
    if not covered(lookup, point.attempt):
        if not records:
            if set(chain.middle_ids) <= set(chain.protected_ids):
                return None, None  # all protected: a plain skip
            detail = f"middles={len(chain.middle_ids)}"
            return None, Diagnostic("backfill-empty", str(chain.start_ts), detail)
        body = deterministic_body(records)
    compressed_at = point.time_ms if point.time_ms is not None else chain.final_ts
    entry = ChainEntry(
        block_id=f"b{issued + 1}",
        start_user_timestamp=chain.start_ts,
        final_assistant_timestamp=chain.final_ts,
        dropped_tool_call_ids=chain.middle_ids,
        dropped_occurrence_keys=chain.middle_keys,
        protected_tool_call_ids=chain.protected_ids,
        tool_refs=tuple(dict.fromkeys(r.ref for r in records)),
        compressed_at=compressed_at,
        range_summary_text=body,
        body_source="deterministic" if body is not None else None,
    )
    return entry, None
