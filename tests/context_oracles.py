"""Oracles for the context view, written independently of sessionfold.projections.context_*.

`views_at_turns` replays one session file through the replayer and renders the view after the
chosen assistant messages; `check_view` asserts the render invariants of reference §14 on one
view: no orphan tool result, byte-identical re-render, identity on a no-op, every removed output
recoverable by its ref from the log, and protected outputs never removed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from sessionfold.projections.pruning import digest
from sessionfold.projections.pruning.capture import call_arguments, content_hash, result_text
from sessionfold.projections.pruning.config import PruneConfig
from sessionfold.projections.pruning.context_metrics import Protection
from sessionfold.projections.views.context import ContextView, context_at, resolve_ref
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.tools.replay import Collector, Replayer, file_envelopes

_TOOLS_ATTR = re.compile(r'^<compressed-chain id="[^"]+" tools="([^"]*)">')
_HASHES: dict[int, tuple[Any, str]] = {}


def _hash(message: dict[str, Any]) -> str:
    """content_hash of a tool result, cached per message object (log messages never change)."""
    hit = _HASHES.get(id(message))
    if hit is None or hit[0] is not message:
        hit = (message, content_hash(str(message.get("toolName")), result_text(message)))
        _HASHES[id(message)] = hit
    return hit[1]


@dataclass
class Point:
    """One rendered point of a replay, with what the checks need to read the log."""

    turn: int  # -1: the end of the session
    view: ContextView
    render: Callable[[], ContextView]
    replayer: Replayer
    collector: Collector
    config: PruneConfig


def session_of(path: Path) -> str:
    """The session id of a one-session file."""
    for record in read_session_file(path):
        if not isinstance(record, DeadLetter):
            return record.session_id
    raise AssertionError(f"no session in {path}")


def views_at_turns(
    path: Path, config: PruneConfig, wanted: Callable[[int], bool] = lambda _turn: True
) -> Iterator[Point]:
    """Replay `path`; yield the view after each assistant message `wanted(turn)` accepts, then
    the view at the end (turn -1)."""
    session_id = session_of(path)
    collector = Collector(session_id)
    replayer = Replayer(config, [session_id])
    pending: list[int] = []
    seen = {"turns": 0}

    def render() -> ContextView:
        runtime = replayer.runtime
        return context_at(
            collector.entries,
            runtime.store,
            session_id,
            config,
            collector.compact_points(runtime),
        )

    def folded(envelope: Any) -> None:
        collector(envelope)
        turns = digest.head(replayer.runtime.store, session_id)["turns"]
        if turns > seen["turns"]:
            seen["turns"] = turns
            if wanted(turns - 1):
                pending.append(turns - 1)

    replayer.on_folded = folded
    for record in file_envelopes([path]):
        replayer.feed(record)
        while pending:
            turn = pending.pop(0)
            yield Point(turn, render(), render, replayer, collector, config)
    yield Point(-1, render(), render, replayer, collector, config)


# --- independent oracles ---------------------------------------------------------------------


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == "toolCall"]


def orphans(messages: list[dict[str, Any]]) -> list[int]:
    """Positions of tool results whose call is not open: the latest assistant has no unanswered
    call with that id, or another role came in between (written from §14.3, not from the code)."""
    found = []
    last_assistant = None
    answered: list[Any] = []
    for position, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            last_assistant = message
            answered = []
        elif role == "toolResult":
            ids = [b.get("id") for b in _calls(last_assistant)] if last_assistant else []
            call_id = message.get("toolCallId")
            if last_assistant is None or ids.count(call_id) <= answered.count(call_id):
                found.append(position)
            else:
                answered.append(call_id)
        else:
            last_assistant = None
    return found


def _protected_blocks(messages: list[dict[str, Any]]) -> str:
    texts = []
    for message in messages:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list) and content and isinstance(content[0], dict):
            text = content[0].get("text")
            if isinstance(text, str) and text.startswith("<compressed-chain"):
                texts.append(text)
    return "\n".join(texts)


def _tools_attributes(messages: list[dict[str, Any]]) -> set[str]:
    refs: set[str] = set()
    for message in messages:
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, list) and content:
            found = _TOOLS_ATTR.match(str(content[0].get("text", "")))
            if found:
                refs.update(r for r in found.group(1).split(",") if r)
    return refs


def _call_args(messages: list[dict[str, Any]]) -> list[dict[Any, Any]]:
    """Per position, the arguments of each call id in the nearest assistant before it."""
    latest: dict[Any, Any] = {}
    out = []
    for message in messages:
        out.append(latest)
        if message.get("role") == "assistant":
            latest = {**latest, **{b.get("id"): call_arguments(b) for b in _calls(message)}}
    return out


def check_view(point: Point) -> dict[str, int]:
    """Assert every render invariant on one view; return counts of what was checked."""
    view = point.view
    store = point.replayer.runtime.store
    session_id = point.collector.session_id
    log = {e.seq: e.entry for e in point.collector.entries}
    where = f"turn {point.turn}"

    # 1. No tool result without its open call.
    assert orphans(view.messages) == [], f"{where}: orphan tool results in the render"

    # 2. Rendering twice gives byte-identical output.
    first = orjson.dumps(view.messages)
    assert orjson.dumps(point.render().messages) == first, f"{where}: renders differ"

    # 3. A render that changes nothing returns its input unchanged (the same list object).
    if not view.pruned:
        assert view.messages is view.base, f"{where}: no-op render returned a copy"
    if first == orjson.dumps(view.base):
        assert view.messages is view.base, f"{where}: unchanged render returned a copy"

    # 4. Every output taken out resolves by its ref to the original in the log.
    kept = {id(m) for m in view.messages}
    verbatim = _protected_blocks(view.messages)
    protection = Protection(point.config.protectedTools, point.config.protectedPaths)
    base_orphans = set(orphans(view.base))
    removed = {r.seq: r for r in view.removed}
    visible = _tools_attributes(view.messages)
    stub_texts = "\n".join(result_text(m) for m in view.messages if m.get("role") == "toolResult")
    gone = 0
    protected = 0
    args_at = _call_args(view.base)
    for position, message in enumerate(view.base):
        if message.get("role") != "toolResult":
            continue
        seq = view.origin.get(id(message))
        if seq is None:
            continue
        tool = message.get("toolName")
        text = result_text(message)
        is_protected = protection.is_protected(
            tool, args_at[position].get(message.get("toolCallId"))
        )
        if is_protected and position not in base_orphans:
            # 5. Protected outputs are never removed: verbatim in place or relocated verbatim.
            protected += 1
            relocated = f'<protected-output tool="{tool}">\n{text}\n</protected-output>'
            assert id(message) in kept or relocated in verbatim, f"{where}: protected output lost"
            continue
        if id(message) in kept:
            continue
        if not is_protected and f'<protected-output tool="{tool}">\n{text}\n' in verbatim:
            continue  # relocated with the protected ones of its range (a reused id)
        gone += 1
        removal = removed.get(seq)
        assert removal is not None and removal.ref, f"{where}: seq {seq} removed without a ref"
        original_seq = resolve_ref(store, session_id, removal.ref)
        assert original_seq is not None, f"{where}: ref {removal.ref} resolves to nothing"
        original = digest.message_of(log[original_seq])
        assert original is not None and original.get("role") == "toolResult"
        assert _hash(original) == _hash(message), (
            f"{where}: ref {removal.ref} resolves to another output"
        )
        if removal.how in ("stub", "chain"):
            # The model sees the ref: on the stub, or on the synthetic that replaced the range.
            cited = f"`{removal.ref}`" in stub_texts or removal.ref in visible
            assert cited, f"{where}: {removal.how} ref {removal.ref} is not in the render"
    return {"removed": gone, "protected": protected}
