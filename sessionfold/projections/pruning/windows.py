"""Capture (reference §3): tool windows, turn gates, pending turns, and the rescan's result.

A result pairs with the latest assistant's call of the same id, first result per id
(positional pairing, §3.2); its facts (occurrence key, size, hash, 2,000-char head) are kept
in `r/<seq>` until the call is indexed. A pending turn `w/<turn>` maps call ids to result seqs.
`capture` returns what pi-condense's branch rescan would: ready, unprotected, unsummarized calls
per turn, trimmed by the frontier and grouped. A turn gate records that an assistant's turn end
is still to be evaluated (it closes when every call has a result or a non-result message comes).
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable

from sessionfold.events.flush import Frontier
from sessionfold.projections.pruning import context_metrics as metrics
from sessionfold.projections.pruning import digest, index
from sessionfold.projections.pruning.capture import (
    Batch,
    Call,
    group_batches,
    head_preview,
    result_record,
)
from sessionfold.projections.pruning.entry_facts import EntryFacts
from sessionfold.projections.pruning.frontier import mark_of
from sessionfold.projections.pruning.records import (
    AssistantCall,
    AssistantFacts,
    MessageRow,
    PendingTurn,
    ResultFacts,
    ToolWindow,
    TurnGate,
)
from sessionfold.projections.pruning.session import Session, row_key
from sessionfold.projections.store import key

#: A ready call of a pending turn: the assistant's call, its result's seq and its result row.
ReadyCall = tuple[AssistantCall, int, ResultFacts]
#: A pending turn's rows as the capture reads them: assistant seq, its facts, its ready calls.
TurnCalls = tuple[int, AssistantFacts, list[ReadyCall]]

# --- the tool window and the turn gate --------------------------------------------------------


def gate_open(session: Session) -> bool:
    """Whether a turn end is still to be evaluated (the next non-result message closes it)."""
    return session.head["gate"] is not None


def on_row(session: Session, row: MessageRow, facts: EntryFacts) -> bool:
    """Fold one message that joined the branch; True when its turn has just ended."""
    role = row["role"]
    if role == "user":
        session.head["group"] += 1
    elif role == "assistant":
        return _open_turn(session, row, facts)
    elif role == "toolResult":
        return _pair_result(session, row, facts)
    return False


def _open_turn(session: Session, row: MessageRow, facts: EntryFacts) -> bool:
    head = session.head
    if facts.usage is not None:
        # An assistant's usage is the context size pi reports at its turn end.
        head["tokens"] = facts.usage
    blocks = [c for c in facts.calls if isinstance(c.id, str)]
    seq = row.get("seq")
    turn = row["turn"]
    _close_window(session)
    gate: TurnGate = {"turn": turn, "has": False, "wait": []}
    head["gate"] = gate
    if not blocks or seq is None:
        return True  # a turn without tool calls ends with its message
    calls: list[AssistantCall] = [
        {"id": c.id, "name": str(c.name), "args": c.args, "path": c.path} for c in blocks
    ]
    kept: AssistantFacts = {
        "turn": turn,
        "ts": facts.stamp,
        "text": facts.text,
        "group": head["group"],
        "calls": calls,
    }
    session.store.put(f"{session.session_id}/pr/a/{seq}", kept)
    ids = [c["id"] for c in calls]
    head["win"] = {"turn": turn, "a": seq, "ids": ids, "names": [c["name"] for c in calls]}
    gate["wait"] = list(dict.fromkeys(ids))
    # pi ends an errored or aborted turn at once, with no tool results.
    return row.get("stop") in ("error", "aborted")


def _close_window(session: Session) -> None:
    """A new assistant ends the latest one's window; a window no result paired with is dropped."""
    win = session.head["win"]
    session.head["win"] = None
    if win is not None and win["turn"] not in session.head["pending"]:
        session.store.delete(f"{session.session_id}/pr/a/{win['a']}")


def note_usage_event(session: Session, tokens: int | None, window: int | None) -> None:
    """A usage event: the context tokens (null right after a compaction) and the window."""
    session.head["tokens"] = tokens
    if window is not None and window > 0:
        session.head["window"] = window


def _pair_result(session: Session, row: MessageRow, facts: EntryFacts) -> bool:
    """Pair a result with the latest assistant's call (first result per id wins, §3.2)."""
    head = session.head
    win = head["win"]
    call_id = row.get("callId")
    seq = row.get("seq")
    if win is None or seq is None or call_id not in win["ids"]:
        return False
    window_key = f"{session.session_id}/pr/w/{win['turn']}"
    stored: PendingTurn | None = session.store.get(window_key)
    window: PendingTurn = stored or {"a": win["a"], "r": {}}
    if call_id in window["r"]:
        return False
    name = win["names"][win["ids"].index(call_id)]
    session.store.put(f"{session.session_id}/pr/r/{seq}", _result_facts(session, row, facts, name))
    window["r"][call_id] = seq
    session.store.put(window_key, window)
    if win["turn"] not in head["pending"]:
        insort(head["pending"], win["turn"])
    gate = head["gate"]
    if gate is None or gate["turn"] != win["turn"]:
        return False
    gate["has"] = True
    gate["wait"] = [w for w in gate["wait"] if w != call_id]
    return not gate["wait"]


def _result_facts(
    session: Session, row: MessageRow, entry: EntryFacts, tool_name: str
) -> ResultFacts:
    text = entry.text
    raw = entry.raw
    content, head = result_record(tool_name, text)
    facts: ResultFacts = {
        "key": row["occ"],
        "raw": raw,
        "hash": content,
        "head": head,
        "err": row.get("isError") is True,
        "rts": row.get("ts"),
    }
    if raw >= session.config.spillThreshold:
        facts["spill"] = {
            "bytes": len(text.encode("utf-8", "surrogatepass")),
            "preview": head_preview(text, session.config.spillPreviewBytes),
        }
    return facts


# --- capture ---------------------------------------------------------------------------------


def ready_calls(session: Session, turn: int) -> TurnCalls | None:
    """A pending turn's assistant seq, its facts and its ready, unprotected calls, each with its
    result row, in call order; None when the turn's rows are gone.

    The one reading of a turn's rows that `turn_batch`, `capture` and the live trim check share:
    a call counts once its result is folded, and the protection globs run once per (name, path)."""
    store, sid = session.store, session.session_id
    window = store.get(f"{sid}/pr/w/{turn}")
    facts = store.get(f"{sid}/pr/a/{window['a']}") if window is not None else None
    if window is None or facts is None:
        return None
    results = window["r"]
    protection = session.protection
    protected = protection.memo  # (name, path) -> bool: the globs run once per pair
    ready: list[ReadyCall] = []
    for call in facts["calls"]:
        seq = results.get(call["id"])
        result = store.get(f"{sid}/pr/r/{seq}") if seq is not None else None
        if result is None:
            continue
        pair = (call["name"], call["path"])
        hit = protected.get(pair)
        if hit is None:
            hit = protected[pair] = protection.protects(*pair)
        if not hit:
            ready.append((call, seq, result))
    return window["a"], facts, ready


def _call(call: AssistantCall, seq: int, result: ResultFacts, assistant_seq: int) -> Call:
    return Call(
        key=result["key"],
        tool_call_id=call["id"],
        tool_name=call["name"],
        raw_chars=result["raw"],
        content_hash=result["hash"],
        head=result["head"],
        seq=seq,
        is_error=result["err"],
        arguments=call["args"],
        result_ts=result["rts"],
        assistant_seq=assistant_seq,
    )


def turn_batch(session: Session, turn: int) -> Batch | None:
    """The ready, unprotected calls of one pending turn as a batch (untrimmed)."""
    rows = ready_calls(session, turn)
    if rows is None or not rows[2]:
        return None
    assistant_seq, facts, ready = rows
    calls = tuple(_call(call, seq, result, assistant_seq) for call, seq, result in ready)
    return Batch(turn, facts["ts"], calls, facts["text"], facts["group"])


def summarized_predicate(session: Session) -> Callable[[str], bool]:
    """Strict summarized check by occurrence key, against the session's index."""
    return index.summarized_check(session.store, session.session_id)


def frontier_of(session: Session) -> Frontier | None:
    """The session's prune frontier, or None."""
    raw = session.head["frontier"]
    return Frontier.model_validate(raw) if raw is not None else None


def capture(session: Session) -> list[Batch]:
    """The rescan's result (§3.2): ready batches on the branch, trimmed, then grouped.

    `turn_batch` of each pending turn trimmed by `trim_batches`, in one pass: a turn before the
    frontier's is not built, a summarized call gets no Call, and each batch is built once with
    the calls the trim keeps (a flush captures every pending turn)."""
    store, sid = session.store, session.session_id
    mark = mark_of(session.head["frontier"])
    mark_turn = mark.last_attempted_turn_index if mark is not None else -1
    batches: list[Batch] = []
    for turn in session.head["pending"]:
        if turn < mark_turn:
            continue  # before the frontier's turn: the trim drops it whole
        rows = ready_calls(session, turn)
        if rows is None:
            continue
        assistant_seq, facts, ready = rows
        calls = [
            _call(call, seq, result, assistant_seq)
            for call, seq, result in ready
            # summarized (`index.is_summarized`): the trim drops it
            if store.get(f"{sid}/pr/i/{result['key']}") is None
        ]
        if not calls:
            continue
        if turn == mark_turn:
            # The frontier's own turn: the calls after its call, or all of them when its call
            # is not among them (the miss rule); `trim_batch`'s steps 3-5.
            ids = [c.tool_call_id for c in calls]
            call_id = mark.last_attempted_tool_call_id  # type: ignore[union-attr]
            if call_id in ids:
                calls = calls[ids.index(call_id) + 1 :]
                if not calls:
                    continue
        batches.append(Batch(turn, facts["ts"], tuple(calls), facts["text"], facts["group"]))
    return group_batches(batches, session.config.batchingMode)


# --- reload and branch switch ----------------------------------------------------------------


def on_reload(session: Session) -> None:
    """A reload: the queue and delta reading reset; the rearm probe looks for ready work (§2.1)."""
    head = session.head
    head["gate"] = None
    head["queued"] = 0
    head["prev"] = None
    head["rearmed"] = bool(session.config.enabled and capture(session))


def on_switch(session: Session) -> None:
    """The branch switched: rebuild windows and pending turns from it; pick its frontier."""
    store, sid, head = session.store, session.session_id, session.head
    for turn in head["pending"]:
        store.delete(row_key(sid, "w", turn))
    windows: dict[int, PendingTurn] = {}
    win = None
    group = 0
    for row in digest.branch_rows(store, sid):
        role = row["role"]
        if role == "user":
            group += 1
        elif role == "assistant":
            win = _window_of(session, row)
        elif role == "toolResult" and win is not None and _pairs(session, win, row):
            window = windows.setdefault(win["turn"], {"a": win["a"], "r": {}})
            window["r"].setdefault(row["callId"], row["seq"])
    _restore_frontier(session)
    frontier = frontier_of(session)
    floor = frontier.last_attempted_turn_index if frontier is not None else -1
    head["pending"] = sorted(t for t in windows if t >= floor)
    for turn in head["pending"]:
        store.put(row_key(sid, "w", turn), windows[turn])
    head["group"], head["win"], head["gate"] = group, win, None


def _pairs(session: Session, win: ToolWindow, row: MessageRow) -> bool:
    """Whether a result row pairs with the window's calls and its facts are still kept."""
    seq = row.get("seq")
    if seq is None or row["callId"] not in win["ids"]:
        return False
    return session.store.get(row_key(session.session_id, "r", seq)) is not None


def _window_of(session: Session, row: MessageRow) -> ToolWindow | None:
    seq = row.get("seq")
    if seq is None:
        return None
    facts: AssistantFacts | None = session.store.get(row_key(session.session_id, "a", seq))
    if facts is None:
        return None
    ids = [c["id"] for c in facts["calls"]]
    return {"turn": row["turn"], "a": seq, "ids": ids, "names": [c["name"] for c in facts["calls"]]}


def _branch_entry_ids(session: Session) -> set[str]:
    """Ids of every entry on the path to the leaf (walking the digest's tree nodes)."""
    ids: set[str] = set()
    current = digest.head(session.store, session.session_id)["leaf"]
    while current is not None and current not in ids:
        ids.add(current)
        node = session.store.get(key(session.session_id, "t", current))
        current = node["p"] if node is not None else None
    return ids


def _restore_frontier(session: Session) -> None:
    """The frontier in force on this branch: the newest one set while its leaf was on it."""
    head = session.head
    on_branch = _branch_entry_ids(session)
    chosen = None
    for n in range(head["fn"], 0, -1):
        row = session.store.get(row_key(session.session_id, "f", n))
        if row is not None and row["leaf"] in on_branch:
            chosen = row["frontier"]
            break
    if chosen != head["frontier"]:
        head["frontier"] = chosen
        metrics.on_frontier(session.store, session.session_id, chosen)
