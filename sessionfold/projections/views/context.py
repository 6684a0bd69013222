"""The context view: the message list the model is given at a point of a session.

`context_at(entries, store, session_id, config)` takes a session's entries up to the point (from
the log: a file or session-events) and the fold's state at that point, and returns what
pi-condense's `context` handler would send (reference §7, §8):

1. pi's own context of the branch (pi-session-format §1.8: compaction summary, kept entries),
   with the per-batch summaries put back where pi would have logged them (`context_base`);
2. the chain entries compression would have logged by then (`context_chains`);
3. the four render phases in order: stub replacement, error purge, chain range prune, orphan
   sweep (`context_phases`).

Token counts use pi-condense's convention: per message floor(JSON length / 4 + 0.5).
`unpruned` is pi's context without sessionfold (no summaries, no phases): what the model would
see if nothing pruned. Every output the view takes out is in `removed` with the ref that
recovers it; `resolve_ref` turns a ref back into the original's sequence number in the log.

Pure: no I/O, clock or randomness; the same entries and state give byte-identical output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sessionfold.projections.jsjson import js_json_length
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.config import DEFAULT_CONFIG, PruneConfig
from sessionfold.projections.store import Store
from sessionfold.projections.views.base import (
    BaseContext,
    LogEntry,
    SummaryNote,
    base_context,
    iso_ms,
    split_occurrence,
)
from sessionfold.projections.views.chains import (
    ChainEntry,
    CompressionPoint,
    Diagnostic,
    derive_entries,
    prefix_length,
    ref_for,
    resolve_ref,
)
from sessionfold.projections.views.phases import (
    PruneInputs,
    PruneResult,
    Removal,
    orphan_positions,
    prune_messages,
)

__all__ = [
    "ChainEntry",
    "ChainMemo",
    "ContextView",
    "Identity",
    "LogEntry",
    "PatchItem",
    "Removal",
    "apply_patch",
    "compact_point",
    "compression_points",
    "context_at",
    "message_identities",
    "message_tokens",
    "orphan_positions",
    "patch_of",
    "prune_messages",
    "resolve_ref",
    "split_occurrence",
    "tokens",
]


@dataclass(slots=True)
class ContextView:
    """The rendered context at a point, with what it came from and what it left out."""

    messages: list[dict[str, Any]]
    unpruned: list[dict[str, Any]]
    base: list[dict[str, Any]]  # the render's input: pi's context with the summaries
    pruned: bool
    removed: list[Removal] = field(default_factory=list)
    chains: list[ChainEntry] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    #: id(message) -> sequence number, for every message that is the log's own object.
    origin: dict[int, int] = field(default_factory=dict)

    @property
    def tokens(self) -> dict[str, int]:
        """{"pruned": tokens the model sees, "unpruned": tokens of pi's unpruned context}."""
        return {"pruned": tokens(self.messages), "unpruned": tokens(self.unpruned)}

    def to_json(self) -> dict[str, Any]:
        """`sessionfold context --format json`: the messages and both token counts."""
        return {"messages": self.messages, "tokens": self.tokens}


#: One message as pi's array and the log's are matched: (role, toolCallId), None where absent.
Identity = tuple[Any, Any]
#: An array item that is not a message object: equal to no message's identity.
_NOT_A_MESSAGE: Identity = (object(), None)


def message_identities(messages: Sequence[Any]) -> list[Identity]:
    """Each message's identity (role, toolCallId): how a caller's array is checked against
    the log's context without sending or comparing the messages' text."""
    return [
        (m.get("role"), m.get("toolCallId")) if isinstance(m, dict) else _NOT_A_MESSAGE
        for m in messages
    ]


#: One item of a patch: a run [start, end) of the caller's own messages, or a message to put.
PatchItem = list[int] | dict[str, Any]


def patch_of(messages: Sequence[Any], unpruned: Sequence[Any]) -> list[PatchItem]:
    """`messages` as a patch to `unpruned` (the caller's array): runs of its own messages kept
    in place, by position, and the messages the render made (stubs, summaries, synthetics)
    whole. A render keeps the log's own message objects, so identity says which are kept."""
    at = {id(message): position for position, message in enumerate(unpruned)}
    patch: list[PatchItem] = []
    for message in messages:
        position = at.get(id(message))
        if position is None:
            patch.append(message)
        elif patch and isinstance(patch[-1], list) and patch[-1][1] == position:
            patch[-1][1] = position + 1
        else:
            patch.append([position, position + 1])
    return patch


def apply_patch(patch: Sequence[PatchItem], array: Sequence[Any]) -> list[Any]:
    """The array a patch yields from the caller's `array` (what the pi extension does)."""
    out: list[Any] = []
    for item in patch:
        if isinstance(item, dict):
            out.append(item)
        else:
            out.extend(array[item[0] : item[1]])
    return out


def message_tokens(message: Any) -> int:
    """pi-condense's token estimate of one message: floor(JSON length / 4 + 0.5)."""
    return (js_json_length(message) + 2) // 4


def tokens(messages: Sequence[Any]) -> int:
    """The summed token estimate of a message list."""
    return sum(message_tokens(m) for m in messages)


def compact_point(seq: int, time: str | None, store: Store, session_id: str) -> CompressionPoint:
    """A `/pruner compact` command at `seq`: compress every closed chain (window 0)."""
    records = pruning.flush_records(store, session_id)
    done = sum(1 for r in records if int(r["seq"]) < seq)
    return CompressionPoint(seq, False, iso_ms(time), 0, done)


def compression_points(
    store: Store, session_id: str, config: PruneConfig, extra: Sequence[CompressionPoint] = ()
) -> list[CompressionPoint]:
    """Where chain compression ran: after each flush attempt that processed a batch (§5.5 step
    14; a message-end flush sees its closing reply, §8.1), plus `extra` (compact commands)."""
    points = list(extra)
    if config.enabled and config.chainCompression.enabled:
        for attempt, record in enumerate(pruning.flush_records(store, session_id), start=1):
            if record["processed_batches"] < 1:
                continue  # empty and failed flushes skip compression (§13.1 item 2)
            points.append(
                CompressionPoint(
                    seq=int(record["seq"]),
                    closing=record["trigger"] == "message-end",
                    time_ms=iso_ms(record.get("time")),
                    window=config.chainCompression.rollingWindow,
                    attempt=attempt,
                )
            )
    return sorted(points, key=lambda p: (p.seq, p.attempt))


def _coverage(notes: Sequence[SummaryNote]) -> Callable[[Sequence[str], int], bool]:
    """covered(keys, attempt): a summary written by attempt <= `attempt` covers any key."""

    def covered(keys: Sequence[str], attempt: int) -> bool:
        wanted = set(keys)
        return any(n.attempt <= attempt and wanted.intersection(n.keys) for n in notes)

    return covered


Derived = tuple[list[ChainEntry], list[Diagnostic]]


@dataclass(slots=True)
class ChainMemo:
    """One session's last chain derivation, for a caller that renders the same session again
    and again (`sessionfold serve`: at every leaf). Chains come only from messages before the
    last compression point, so while the points, the summaries, the index and those messages
    stay the same, so do the chains, however many messages came after."""

    key: tuple[Any, ...] | None = None
    read: list[dict[str, Any]] = field(default_factory=list)  # the messages it read
    derived: Derived | None = None

    def get(
        self,
        key: tuple[Any, ...],
        messages: Sequence[dict[str, Any]],
        derive: Callable[[], Derived],
    ) -> Derived:
        """The derivation for `key` over `messages` (the log's own objects, by identity)."""
        if (
            self.derived is not None
            and self.key == key
            and len(self.read) == len(messages)
            and all(a is b for a, b in zip(self.read, messages, strict=True))
        ):
            return self.derived
        self.derived = derive()
        self.key, self.read = key, list(messages)
        return self.derived


def _memo_key(
    store: Store, session_id: str, points: Sequence[CompressionPoint], notes: Sequence[SummaryNote]
) -> tuple[Any, ...]:
    """What a chain derivation reads besides the messages: the compression points, what the
    summaries cover, and the index's writes (every one moves one of these counters)."""
    head = pruning.load_head(store, session_id)
    stats = head["stats"]
    return (
        tuple(points),
        tuple((note.attempt, note.keys) for note in notes),
        (head["summaries"], stats["deduped_calls"], stats["spilled_calls"]),
    )


def context_at(
    entries: Sequence[LogEntry],
    store: Store,
    session_id: str,
    config: PruneConfig = DEFAULT_CONFIG,
    compacts: Sequence[CompressionPoint] = (),
    memo: ChainMemo | None = None,
) -> ContextView:
    """The context the model is given at the point `entries` and `store` stand at.

    `entries` are the session's entries in sequence order (every branch; the fold's leaf picks
    the branch); `compacts` are `/pruner compact` commands seen so far (see `compact_point`);
    `memo` keeps the chains between renders of one session under one config.
    """
    base: BaseContext = base_context(entries, store, session_id)
    if not config.enabled:
        return ContextView(base.unpruned, base.unpruned, base.unpruned, False, origin=base.origin)
    notes = base.notes
    detect = [
        (item.seq, item.entry["message"])
        for item in base.branch
        if item.entry.get("type") == "message" and isinstance(item.entry.get("message"), dict)
    ]
    points = compression_points(store, session_id, config, compacts)
    messages = [m for _, m in detect]
    seqs = [s for s, _ in detect]

    def derive(read: int) -> Derived:
        return derive_entries(
            messages[:read],
            seqs[:read],
            points,
            _coverage(notes),
            lambda key, seq: ref_for(store, session_id, key, seq),
            PruneInputs(store, session_id, config).protection,
            config.recoveryGraceTurns,
        )

    if memo is None:
        chains, problems = derive(len(messages))
    else:
        # The messages before the last point (the longest prefix any point reads).
        last = max((p.seq for p in points), default=None)
        ends = (prefix_length(seqs, p.seq, p.closing) for p in points if p.seq == last)
        read = max(ends, default=0)
        key = _memo_key(store, session_id, points, notes)
        chains, problems = memo.get(key, messages[:read], lambda: derive(read))
    summaries = [(n.keys, str(n.message["content"])) for n in notes]
    inputs = PruneInputs(store, session_id, config, chains, summaries, base.origin)
    result: PruneResult = prune_messages(base.messages, inputs)
    return ContextView(
        messages=result.messages,
        unpruned=base.unpruned,
        base=base.messages,
        pruned=result.pruned,
        removed=result.removed,
        chains=chains,
        diagnostics=problems + result.diagnostics,
        origin=base.origin,
    )
