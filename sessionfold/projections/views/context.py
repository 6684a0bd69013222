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
A caller that renders one session at every leaf (serve, the workers) passes a `RenderMemo`:
while no flush, compact command or index write comes, a render grows the last one by the new
entries instead of starting over, with the output a render from scratch gives
(tests/unit/test_render_memo.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sessionfold.projections.jsjson import js_json_length
from sessionfold.projections.pruning import digest
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.config import DEFAULT_CONFIG, PruneConfig
from sessionfold.projections.store import Store
from sessionfold.projections.views import validity
from sessionfold.projections.views.base import (
    BaseContext,
    LogEntry,
    SummaryNote,
    base_context,
    grown_base,
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
    Carry,
    PruneInputs,
    PruneResult,
    Removal,
    extends,
    orphan_positions,
    prune,
    prune_messages,
)
from sessionfold.projections.views.validity import Problem, repaired

__all__ = [
    "ChainEntry",
    "ChainMemo",
    "ContextView",
    "Identity",
    "LogEntry",
    "PatchItem",
    "Removal",
    "RenderMemo",
    "apply_patch",
    "compact_point",
    "compression_points",
    "context_at",
    "extends",
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
    #: Calls the log holds no result of, answered by a placeholder (views/validity.py).
    repairs: list[Problem] = field(default_factory=list)

    @property
    def tokens(self) -> dict[str, int]:
        """{"pruned": tokens the model sees, "unpruned": tokens of pi's unpruned context}, each
        with the placeholder results a provider needs (pi-ai puts the same ones in)."""
        return {"pruned": tokens(self.messages), "unpruned": tokens(self.unpruned_sent)}

    @property
    def unpruned_sent(self) -> list[dict[str, Any]]:
        """pi's unpruned context as a provider gets it: with the placeholder results (its
        results without a call stay: pi would send them, only the render sweeps them)."""
        return validity.repaired(self.unpruned)[0]

    def to_json(self) -> dict[str, Any]:
        """`sessionfold context --format json`: the messages, both token counts, and the
        render's repairs (code and call id each: docs/formats.md)."""
        repairs = [{"code": r.code, "toolCallId": r.tool_call_id} for r in self.repairs]
        return {"messages": self.messages, "tokens": self.tokens, "repairs": repairs}


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


@dataclass(slots=True)
class RenderMemo:
    """One session's last render, for a caller that renders the same session again and again
    (`sessionfold serve` and the fold workers: at every leaf). Its chains (`ChainMemo`), and,
    while no flush, compact command or index write came since, its context and render: when
    the entries since only extend the branch, they are put on the last context and rendered
    from where the last render stopped (`grown_base`, `phases.prune`)."""

    chains: ChainMemo = field(default_factory=ChainMemo)
    key: tuple[Any, ...] | None = None
    entries: int = 0  # how many of the session's entries the last render read
    ids: set[str] = field(default_factory=set)  # their ids
    base: BaseContext | None = None
    carry: Carry | None = None
    grown: int = 0  # renders made from the last one (for tests and benches)

    def grown_base(
        self, key: tuple[Any, ...], entries: Sequence[LogEntry], leaf: str | None
    ) -> BaseContext | None:
        """The last render's context with the entries logged since, when `key` (what else the
        render reads) did not move and they only extend its branch; else None."""
        if self.base is None or self.key != key or len(entries) < self.entries:
            return None
        return grown_base(self.base, entries[self.entries :], leaf, self.ids)

    def keep(
        self, key: tuple[Any, ...], entries: Sequence[LogEntry], base: BaseContext, carry: Carry
    ) -> None:
        """Remember a render of `entries` (its context and its carry) under `key`. A session's
        entries only grow: the ids of those read before are kept, the new ones added."""
        if len(entries) < self.entries:
            self.ids, self.entries = set(), 0
        for item in entries[self.entries :]:
            entry_id = item.entry.get("id")
            if isinstance(entry_id, str):
                self.ids.add(entry_id)
        self.key, self.entries, self.base, self.carry = key, len(entries), base, carry


def _render_key(
    store: Store, session_id: str, points: Sequence[CompressionPoint]
) -> tuple[Any, ...]:
    """What a render reads besides the entries: the flush attempts (and so the summaries and
    their places), the compression points and the index's writes."""
    head = pruning.load_head(store, session_id)
    stats = head["stats"]
    return (
        head["attempts"],
        tuple(points),
        (head["summaries"], stats["deduped_calls"], stats["spilled_calls"]),
    )


def context_at(
    entries: Sequence[LogEntry],
    store: Store,
    session_id: str,
    config: PruneConfig = DEFAULT_CONFIG,
    compacts: Sequence[CompressionPoint] = (),
    memo: RenderMemo | None = None,
) -> ContextView:
    """The context the model is given at the point `entries` and `store` stand at.

    `entries` are the session's entries in sequence order (every branch; the fold's leaf picks
    the branch); `compacts` are `/pruner compact` commands seen so far (see `compact_point`);
    `memo` keeps the last render between renders of one session under one config.
    """
    if not config.enabled:
        plain = base_context(entries, store, session_id)
        sent, fixes = repaired(plain.unpruned)
        return ContextView(
            sent, plain.unpruned, plain.unpruned, False, origin=plain.origin, repairs=fixes
        )
    points = compression_points(store, session_id, config, compacts)
    grown: BaseContext | None = None
    if memo is not None:
        key = _render_key(store, session_id, points)
        grown = memo.grown_base(key, entries, digest.head(store, session_id)["leaf"])
    base: BaseContext = grown if grown is not None else base_context(entries, store, session_id)
    notes = base.notes
    detect = [
        (item.seq, item.entry["message"])
        for item in base.branch
        if item.entry.get("type") == "message" and isinstance(item.entry.get("message"), dict)
    ]
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
        chain_key = _memo_key(store, session_id, points, notes)
        chains, problems = memo.chains.get(chain_key, messages[:read], lambda: derive(read))
    summaries = [(n.keys, str(n.message["content"])) for n in notes]
    inputs = PruneInputs(store, session_id, config, chains, summaries, base.origin)
    carry = prune(base.messages, inputs, memo.carry if memo is not None and grown else None)
    if memo is not None:
        if grown is not None:
            memo.grown += 1
        memo.keep(key, entries, base, carry)
    result: PruneResult = carry.result
    # A provider refuses a call without its result: a lost line must not make the context
    # unusable (the placeholder is pi-ai's own; nothing else moves).
    messages, repairs = repaired(result.messages)
    return ContextView(
        messages=messages,
        unpruned=base.unpruned,
        base=base.messages,
        pruned=result.pruned,
        removed=result.removed,
        chains=chains,
        diagnostics=problems + result.diagnostics,
        origin=base.origin,
        repairs=repairs,
    )
