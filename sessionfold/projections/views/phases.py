"""Render-time pruning (reference §7): stub replacement, error purge, chain range prune and the
orphan sweep, always in that order, over the message list pi hands its `context` event.

`prune_messages` never mutates its input and returns the very same list object when no phase
changed anything (§7.1): a render that changes nothing must not move the prompt-cache prefix.
Every phase is a deterministic function of (messages, projections, config), so rendering twice
gives byte-identical output. Every output taken out of the list is reported in `removed` with
the ref that recovers it (§14.8).

The phases carry what they know at the list's end (`Carry`): a list grown at its end renders
from there, unless what it adds reaches back (a recovery's grace, an error coming of age, a
message at a chain range's timestamp), which renders it from the start.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sessionfold.projections.jsjson import js_json_length
from sessionfold.projections.pruning import index
from sessionfold.projections.pruning.capture import call_arguments, result_text
from sessionfold.projections.pruning.config import PruneConfig
from sessionfold.projections.pruning.context_metrics import Protection
from sessionfold.projections.pruning.digest import occurrence_key, tool_calls
from sessionfold.projections.store import Store
from sessionfold.projections.views.base import SUMMARY_TYPE, split_occurrence
from sessionfold.projections.views.chains import (
    ChainEntry,
    Diagnostic,
    grace_keys,
    log_ref,
)

#: The id of a `<compressed-chain>` synthetic message (its first text).
SYNTHETIC_ID = re.compile(r'^<compressed-chain id="([^"]+)"')
_BLOCK_PLACEHOLDER = re.compile(r"\{(b\d+)\}")


@dataclass(frozen=True, slots=True)
class Removal:
    """An output taken out of the rendered list, and the ref that recovers it."""

    seq: int | None  # the toolResult entry's sequence number in session-events
    key: str  # its occurrence key
    ref: str | None
    how: str  # "stub" | "chain" | "orphan"


@dataclass(slots=True)
class PruneResult:
    """What a render produced (§7.1): the list, whether it changed, and what it took out.

    `before_chars`/`after_chars` are the JSON lengths of input and output when something was
    pruned and 0 on a no-op (the sentinel: no serialization on the no-op path); they are
    computed when read, since most callers never need them.
    """

    messages: list[dict[str, Any]]
    pruned: bool
    source: list[dict[str, Any]] | None = None  # the input, when pruned
    removed: list[Removal] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def before_chars(self) -> int:
        """len(JSON(input)) when pruned, else 0."""
        return js_json_length(self.source) if self.pruned and self.source is not None else 0

    @property
    def after_chars(self) -> int:
        """len(JSON(output)) when pruned, else 0."""
        return js_json_length(self.messages) if self.pruned else 0


@dataclass(frozen=True, slots=True)
class PruneInputs:
    """The projections a render reads: the index (through the store), the chain entries, and
    the summaries' texts; `origin` maps `id(message)` to its log sequence number."""

    store: Store
    session_id: str
    config: PruneConfig
    chains: Sequence[ChainEntry] = ()
    summaries: Sequence[tuple[tuple[str, ...], str]] = ()  # (occurrence keys, text) in order
    origin: Mapping[int, int] = field(default_factory=dict)

    @property
    def protection(self) -> Protection:
        """The protection predicate of the config in force."""
        return Protection(self.config.protectedTools, self.config.protectedPaths)


class _Render:
    """What one render collects: diagnostics (deduplicated by (kind, key) as the DiagnosticSink
    does), the removals by phase, and the ids of the stubs phase 1 made (their removal is
    reported once)."""

    def __init__(self) -> None:
        self.items: list[Diagnostic] = []
        self._seen: set[tuple[str, str]] = set()
        self.stubbed: list[Removal] = []
        self.chained: list[Removal] = []
        self.orphaned: list[Removal] = []
        self.stubs: set[int] = set()

    def report(self, kind: str, key: str, detail: str) -> None:
        """Record one diagnostic unless its (kind, key) was reported in this render."""
        if (kind, key) in self._seen:
            return
        self._seen.add((kind, key))
        self.items.append(Diagnostic(kind, key, detail))


def prune_messages(messages: list[dict[str, Any]], inputs: PruneInputs) -> PruneResult:
    """pi-condense's `pruneMessages` (§7): the four phases, the return contract, the removals."""
    return prune(messages, inputs).result


@dataclass(frozen=True, slots=True)
class Carry:
    """A render with what its phases carry past the list's end, so that the same list grown at
    its end renders from there (`prune(..., last=)`) instead of from the start."""

    result: PruneResult
    source: list[dict[str, Any]]  # the list rendered
    args: dict[Any, Any]  # stubs: each call id's arguments
    grace: frozenset[str]  # stubs: the recovered keys kept verbatim
    errored: dict[Any, int]  # purge: each errored call id -> assistant messages before it
    assistants: int  # purge: assistant messages in the list
    purgeable: frozenset[Any]  # purge: the errored ids old enough to purge
    chain_reports: tuple[Diagnostic, ...]  # chains: what the range prune reported
    open_ids: frozenset[Any]  # sweep: the calls open at the list's end
    swept: tuple[str, ...]  # sweep: the ids of the orphans swept
    stubbed: tuple[Removal, ...]
    chained: tuple[Removal, ...]
    orphaned: tuple[Removal, ...]


def prune(messages: list[dict[str, Any]], inputs: PruneInputs, last: Carry | None = None) -> Carry:
    """`prune_messages` with its carry. With `last`, a render of a list that `messages` grows
    (the same objects first, the same inputs besides): the new messages are rendered from
    where it stopped, when nothing they bring reaches back into what it rendered (a grace,
    purge or chain range that moves); otherwise, and without `last`, from the start."""
    config = inputs.config
    if not config.enabled:
        return _unpruned(messages)
    grace = grace_keys(messages, config.recoveryGraceTurns)
    if last is not None and not (grace == last.grace and extends(messages, last.source)):
        last = None  # a recovery's grace ended (or the list is another one)
    start = 0 if last is None else len(last.source)
    render = _Render()
    args: dict[Any, Any] = {} if last is None else dict(last.args)
    tail = messages[start:] if start else messages
    current = _stub_phase(tail, inputs, render, grace, args)
    errored: dict[Any, int] = {} if last is None else dict(last.errored)
    assistants = _errors(current, errored, 0 if last is None else last.assistants)
    purge = config.purgeErrors
    purgeable = frozenset(
        call_id for call_id, at in errored.items() if assistants - at >= purge.cooldownTurns
    )
    if purge.enabled:
        if last is not None and purgeable != last.purgeable:
            return prune(messages, inputs)  # an older call's error came of age
        current = purge_calls(current, purgeable, purge.minArgChars)
    chains_on = config.chainCompression.enabled and bool(inputs.chains)
    stamps = frozenset(_chain_stamps(inputs.chains)) if chains_on else frozenset()
    chain_reports: tuple[Diagnostic, ...] = ()
    if last is not None:
        if chains_on and _reaches_chains(current, stamps):
            return prune(messages, inputs)  # a range may resolve differently now
        chain_reports = last.chain_reports
    elif chains_on:
        current = _chain_phase(current, inputs, render)
        chain_reports = tuple(render.items)
    open_ids = set() if last is None else set(last.open_ids)
    orphans = _orphans(current, open_ids)
    swept = (() if last is None else last.swept) + tuple(
        str(current[p].get("toolCallId")) for p in orphans
    )
    if orphans:
        for position in orphans:
            _report_drop(current[position], inputs, render, "orphan")
        dropped = set(orphans)
        current = [m for p, m in enumerate(current) if p not in dropped]
    if swept:
        render.report(*_sweep_report(swept))
    stubbed, chained, orphaned = (
        tuple(render.stubbed),
        tuple(render.chained),
        tuple(render.orphaned),
    )
    if last is not None:
        stubbed = last.stubbed + stubbed
        chained = last.chained
        orphaned = last.orphaned + orphaned
    changed = current is not tail
    if last is not None and (last.result.pruned or changed):
        current = last.result.messages + current
        changed = True
    if not changed:
        result = PruneResult(messages, False, diagnostics=render.items)
    else:
        removed = [*stubbed, *chained, *orphaned]
        result = PruneResult(current, True, messages, removed, render.items)
    if last is not None:
        result.diagnostics[:0] = chain_reports
    return Carry(
        result,
        messages,
        args,
        grace,
        errored,
        assistants,
        purgeable,
        chain_reports,
        frozenset(open_ids),
        swept,
        stubbed,
        chained,
        orphaned,
    )


def _unpruned(messages: list[dict[str, Any]]) -> Carry:
    """The carry of a render with pruning off: nothing changed, nothing to carry."""
    no: frozenset[Any] = frozenset()
    unchanged = PruneResult(messages, False)
    return Carry(unchanged, messages, {}, no, {}, 0, no, (), no, (), (), (), ())


def extends(messages: Sequence[Any], before: Sequence[Any]) -> bool:
    """Whether `messages` starts with `before`'s very objects (a list grown at its end)."""
    return len(messages) >= len(before) and all(
        a is b for a, b in zip(before, messages, strict=False)
    )


# --- phase 1: stubs (§7.2, §7.3) -------------------------------------------------------------


def _stub_phase(
    messages: list[dict[str, Any]],
    inputs: PruneInputs,
    render: _Render,
    grace: frozenset[str],
    args: dict[Any, Any],
) -> list[dict[str, Any]]:
    """`messages` with summarized outputs stubbed (the same list when none is); `grace` is the
    whole list's, `args` the calls' arguments seen before `messages` (it gains theirs)."""
    store, sid = inputs.store, inputs.session_id
    protection = inputs.protection
    out: list[dict[str, Any]] | None = None
    for position, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            for block in tool_calls(message):
                if isinstance(block.get("id"), str):
                    args[block["id"]] = call_arguments(block)
            continue
        if role != "toolResult":
            continue
        call_id = message.get("toolCallId")
        key = occurrence_key(call_id, message.get("timestamp"))
        row = index.record(store, sid, key)  # strict: never a bare-id fallback (§14.5)
        if row is None:
            continue
        original = index.record(store, sid, row["alias"]) if "alias" in row else row
        original = original or row
        tool = original.get("tool")
        if protection.is_protected(tool, args.get(call_id) if isinstance(call_id, str) else None):
            continue  # render-time repair: protected now, so verbatim
        if key in grace:
            continue  # a recovered output stays verbatim for a few user turns
        ref = row.get("ref")
        stub = _stub(message, original, ref or key)
        if out is None:
            out = list(messages)
        out[position] = stub
        render.stubs.add(id(stub))
        render.stubbed.append(Removal(inputs.origin.get(id(message)), key, ref or key, "stub"))
    return messages if out is None else out


def _stub(message: Mapping[str, Any], record: Mapping[str, Any], ref: str) -> dict[str, Any]:
    """A stub keeps role, ids, name and timestamp; isError false; one text block (§14.4)."""
    spill = record.get("spill")
    if spill is not None:
        # The full output lives in the log (there is no sidecar file), so the stub points at
        # the ref rather than at a path.
        text = "\n".join(
            [
                f"[Oversized output spilled — {spill.get('bytes', '?')} bytes.]",
                f"Tool: {message.get('toolName')}",
                "Preview (head):",
                spill.get("preview") or "",
                f"Full output: use context_tree_query with ref `{ref}`.",
            ]
        )
    else:
        text = (
            f"[Summarized in pruner summary, ref `{ref}`. "
            "Use context_tree_query to retrieve full output.]"
        )
    return {
        "role": "toolResult",
        "toolCallId": message.get("toolCallId"),
        "toolName": message.get("toolName"),
        "content": [{"type": "text", "text": text}],
        "isError": False,
        "timestamp": message.get("timestamp"),
    }


# --- phase 2: error purge (§7.4) -------------------------------------------------------------


def purge_errors(
    messages: list[dict[str, Any]], cooldown: int, min_arg_chars: int
) -> list[dict[str, Any]]:
    """Replace the arguments of calls that failed at least `cooldown` assistant turns ago when
    their JSON is at least `min_arg_chars` long; the error result itself stays."""
    errored: dict[Any, int] = {}
    assistants = _errors(messages, errored, 0)
    purgeable = {call_id for call_id, at in errored.items() if assistants - at >= cooldown}
    return purge_calls(messages, purgeable, min_arg_chars)


def _errors(messages: Sequence[Mapping[str, Any]], errored: dict[Any, int], assistants: int) -> int:
    """Note in `errored` each failed call's id with the assistant messages before its result
    (`assistants` before `messages`); the assistant messages after them."""
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            assistants += 1
        elif role == "toolResult" and message.get("isError") is True:
            errored[message.get("toolCallId")] = assistants  # bare id, last wins (§13.2 item 5)
    return assistants


def purge_calls(
    messages: list[dict[str, Any]], purgeable: Collection[Any], min_arg_chars: int
) -> list[dict[str, Any]]:
    """Replace the arguments of the calls with an id in `purgeable` when their JSON is at least
    `min_arg_chars` long (the same list when none is)."""
    if not purgeable:
        return messages
    out: list[dict[str, Any]] | None = None
    for position, message in enumerate(messages):
        if message.get("role") != "assistant" or not isinstance(message.get("content"), list):
            continue
        content = message["content"]
        changed: list[Any] | None = None
        for number, block in enumerate(content):
            if not isinstance(block, dict) or block.get("type") != "toolCall":
                continue
            if block.get("id") not in purgeable or "arguments" not in block:
                continue
            size = js_json_length(block["arguments"])
            if size < min_arg_chars:
                continue
            if changed is None:
                changed = list(content)
            changed[number] = {
                **block,
                "arguments": {"_purged": f'<purged-errored-args size="{size}"/>'},
            }
        if changed is not None:
            if out is None:
                out = list(messages)
            out[position] = {**message, "content": changed}
    return messages if out is None else out


# --- phase 3: chain range prune (§7.5) -------------------------------------------------------


def resolve_range(
    entry: ChainEntry, messages: Sequence[Mapping[str, Any]]
) -> tuple[int, int] | None:
    """Exactly one user at the start timestamp and one assistant at the final one, in order."""
    return _resolve(entry, _Positions(messages))


class _Positions:
    """Positions of user and assistant messages by timestamp, built once per render."""

    def __init__(self, messages: Sequence[Mapping[str, Any]]) -> None:
        self.users: dict[Any, list[int]] = {}
        self.assistants: dict[Any, list[int]] = {}
        for position, message in enumerate(messages):
            role = message.get("role")
            if role in ("user", "assistant"):
                table = self.users if role == "user" else self.assistants
                table.setdefault(_stamp_key(message.get("timestamp")), []).append(position)


def _stamp_key(value: Any) -> Any:
    # JavaScript's === between numbers: 5 and 5.0 are one value; a bool is never a number.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ("other", repr(value))
    return ("number", float(value))


def _resolve(entry: ChainEntry, positions: _Positions) -> tuple[int, int] | None:
    if entry.final_assistant_timestamp is None:
        return None
    starts = positions.users.get(_stamp_key(entry.start_user_timestamp), [])
    ends = positions.assistants.get(_stamp_key(entry.final_assistant_timestamp), [])
    if len(starts) != 1 or len(ends) != 1 or not starts[0] < ends[0]:
        return None
    return starts[0], ends[0]


def is_summary_message(message: Mapping[str, Any]) -> bool:
    """A per-batch summary (the only pruner message besides synthetics the model sees)."""
    return message.get("role") == "custom" and message.get("customType") == SUMMARY_TYPE


def _summary_overlaps(
    message: Mapping[str, Any], keys: set[str], bare_ids: set[str | None]
) -> bool:
    details = message.get("details")
    refs = details.get("toolCallRefs") if isinstance(details, dict) else None
    for ref in refs or ():
        if not isinstance(ref, dict):
            continue
        stamp = ref.get("resultTimestamp")
        if stamp is not None:
            if occurrence_key(ref.get("toolCallId"), stamp) in keys:
                return True
        elif split_occurrence(str(ref.get("toolCallId")))[0] in bare_ids:
            return True
    return False


def chain_body(entry: ChainEntry, summaries: Sequence[tuple[tuple[str, ...], str]]) -> str:
    """The entry's own body, else the distinct per-batch summaries overlapping its range."""
    if entry.range_summary_text is not None:
        return entry.range_summary_text
    wanted = set(entry.dropped_occurrence_keys or entry.dropped_tool_call_ids)
    texts: dict[str, None] = {}
    for keys, text in summaries:
        if text and wanted.intersection(keys):
            texts.setdefault(text)
    return "\n\n".join(texts)


def _substitute_blocks(text: str, own: str, bodies: Callable[[str], str | None]) -> str:
    """Replace `{bN}` by block N's body, one level deep, never the entry's own id."""

    def replace(match: re.Match[str]) -> str:
        block = match.group(1)
        if block == own:
            return match.group(0)
        body = bodies(block)
        return body if body else match.group(0)

    return _BLOCK_PLACEHOLDER.sub(replace, text)


def synthetic_message(
    entry: ChainEntry, body: str, protected: Sequence[tuple[str, str]]
) -> dict[str, Any]:
    """The `<compressed-chain>` user message that stands in for a compressed range."""
    kept = "".join(
        f'\n\n<protected-output tool="{tool}">\n{text}\n</protected-output>'
        for tool, text in protected
    )
    tools = ",".join(entry.tool_refs)
    return {
        "role": "user",
        "content": [
            {
                "type": "text",
                "text": (
                    f'<compressed-chain id="{entry.block_id}" tools="{tools}">\n'
                    f"{body}{kept}\n</compressed-chain>"
                ),
            }
        ],
        "timestamp": entry.compressed_at,
    }


def _chain_phase(
    messages: list[dict[str, Any]],
    inputs: PruneInputs,
    render: _Render,
) -> list[dict[str, Any]]:
    entries = sorted(inputs.chains, key=lambda e: e.start_user_timestamp)
    existing = {
        found.group(1)
        for m in messages
        if m.get("role") == "user" and (found := SYNTHETIC_ID.match(_first_text(m)))
    }
    resolved = []
    positions = _Positions(messages)
    for entry in entries:
        span = _resolve(entry, positions)
        if span is None:
            render.report(
                "unresolved-range",
                entry.block_id,
                f"blockId={entry.block_id} start={entry.start_user_timestamp} "
                f"final={entry.final_assistant_timestamp}",
            )
            continue
        resolved.append((entry, *span))
    accepted = []
    claimed: set[int] = set()
    for candidate in resolved:
        entry, start, _end = candidate
        nested = any(o is not candidate and o[1] < start < o[2] for o in resolved)
        if nested or start in claimed:
            render.report(
                "unresolved-range", f"overlap:{entry.block_id}", f"blockId={entry.block_id}"
            )
            continue
        claimed.add(start)
        accepted.append(candidate)
    if not accepted:
        return messages
    by_block = {e.block_id: e for e in entries}

    def body_of(block: str) -> str | None:
        found = by_block.get(block)
        return chain_body(found, inputs.summaries) or None if found is not None else None

    drop: set[int] = set()
    protected_at: dict[int, set[str]] = {}  # a dropped position -> its range's protected ids
    strip: set[int] = set()
    insert: dict[int, tuple[str, dict[str, Any]]] = {}
    dropped_keys: set[str] = set()
    dropped_bare: set[str | None] = set()  # a call without an id counts as None
    for entry, start, end in accepted:
        protected_ids = set(entry.protected_tool_call_ids)
        kept: list[tuple[str, str]] = []
        in_range: list[str | None] = []
        for position in range(start + 1, end):
            drop.add(position)
            protected_at.setdefault(position, protected_ids)  # accepted ranges never overlap
            message = messages[position]
            role = message.get("role")
            if role == "toolResult":
                call_id = message.get("toolCallId")
                in_range.append(call_id)
                dropped_bare.add(call_id)
                dropped_keys.add(occurrence_key(call_id, message.get("timestamp")))
                if call_id in protected_ids:
                    kept.append((str(message.get("toolName")), result_text(message)))
            elif role == "assistant":
                for block in tool_calls(message):
                    in_range.append(block.get("id"))
                    dropped_bare.add(block.get("id"))
        recorded = {split_occurrence(str(i))[0] for i in entry.dropped_tool_call_ids}
        if recorded != set(in_range):
            render.report(
                "range-id-mismatch",
                entry.block_id,
                f"blockId={entry.block_id} recorded={len(recorded)} actual={len(set(in_range))}",
            )
        if inputs.config.chainCompression.stripFinalAssistantThinking:
            strip.add(end)
        body = _substitute_blocks(chain_body(entry, inputs.summaries), entry.block_id, body_of)
        insert[start] = (entry.block_id, synthetic_message(entry, body, kept))
    out: list[dict[str, Any]] = []
    for position, message in enumerate(messages):
        summary = is_summary_message(message)
        role = message.get("role")
        if position in drop and (role in ("assistant", "toolResult") or summary):
            if role == "toolResult":
                _report_drop(message, inputs, render, "chain", kept_ids=protected_at[position])
            continue
        if summary and _summary_overlaps(message, dropped_keys, dropped_bare):
            continue
        if role == "assistant" and position in strip:
            out.append(_without_thinking(message))
        else:
            out.append(message)
        added = insert.get(position)
        if added is not None and added[0] not in existing:
            out.append(added[1])
    return out


def _first_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list) and content and isinstance(content[0], dict):
        text = content[0].get("text")
        return text if isinstance(text, str) else ""
    return ""


def _without_thinking(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    kept = [b for b in content if not (isinstance(b, dict) and b.get("type") == "thinking")]
    if len(kept) == len(content):
        return message
    return {**message, "content": kept}


def _report_drop(
    message: Mapping[str, Any],
    inputs: PruneInputs,
    render: _Render,
    how: str,
    kept_ids: Collection[str] = frozenset(),
) -> None:
    """Record an output leaving the list (a stub's output was reported when it was stubbed)."""
    if id(message) in render.stubs or message.get("toolCallId") in kept_ids:
        return  # already reported, or relocated verbatim into the synthetic
    key = occurrence_key(message.get("toolCallId"), message.get("timestamp"))
    seq = inputs.origin.get(id(message))
    row = index.record(inputs.store, inputs.session_id, key)
    if row is not None:
        ref: str | None = row.get("ref") or key
    else:
        ref = log_ref(seq) if seq is not None else None
    (render.chained if how == "chain" else render.orphaned).append(Removal(seq, key, ref, how))


# --- phase 4: orphan sweep (§7.6) ------------------------------------------------------------


def orphan_positions(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Positions of tool results without an open call of the latest assistant (no barrier)."""
    return _orphans(messages, set())


def _orphans(messages: Sequence[Mapping[str, Any]], open_ids: set[Any]) -> list[int]:
    """`orphan_positions` with the calls open before `messages` in `open_ids`, which is left
    holding those open after them."""
    orphans = []
    for position, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            open_ids.clear()
            open_ids.update(b.get("id") for b in tool_calls(message))
        elif role == "toolResult":
            call_id = message.get("toolCallId")
            if call_id in open_ids:
                open_ids.discard(call_id)
            else:
                orphans.append(position)
        else:
            open_ids.clear()  # every other role is a barrier, unknown ones included
    return orphans


def _sweep_report(swept: Sequence[str]) -> tuple[str, str, str]:
    """The orphan sweep's diagnostic (kind, key, detail) for the ids it swept."""
    digest = hashlib.sha1(",".join(sorted(swept)).encode("utf-8", "surrogatepass")).hexdigest()
    more = f" ... +{len(swept) - 5} more" if len(swept) > 5 else ""
    detail = f"swept {len(swept)} orphan toolResult(s): {', '.join(swept[:5])}{more}"
    return "orphan-sweep", digest[:16], detail


# --- what a grown list's new messages may not touch ------------------------------------------


def _chain_stamps(chains: Sequence[ChainEntry]) -> Iterator[Any]:
    """The timestamps (as compared) a chain's range is found by."""
    for entry in chains:
        yield _stamp_key(entry.start_user_timestamp)
        yield _stamp_key(entry.final_assistant_timestamp)


def _reaches_chains(messages: Sequence[Mapping[str, Any]], stamps: frozenset[Any]) -> bool:
    """Whether new `messages` may change how the chain ranges resolve or what they drop: a user
    or assistant message at a range's timestamp (an ambiguous or a new end), a synthetic of
    its own, or a per-batch summary (which a range may drop)."""
    for message in messages:
        role = message.get("role")
        if role in ("user", "assistant"):
            if _stamp_key(message.get("timestamp")) in stamps:
                return True
            if role == "user" and SYNTHETIC_ID.match(_first_text(message)):
                return True
        elif is_summary_message(message):
            return True
    return False
