"""Where a moved frontier's boundary is (context_metrics._locate) against the way it was found
before, kept here as the oracle: a scan of the branch's rows from the old boundary for the
frontier's turn. `_locate` now asks the call index first and scans only when the index does
not name that turn's row on this branch. Drawn trees: branch switches by parent and reload,
call ids repeated within and across assistants, frontiers at every turn and call (and none),
and old boundaries anywhere."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.projections.pruning import context_metrics as metrics
from sessionfold.projections.pruning import digest
from sessionfold.projections.pruning.entry_facts import entry_facts
from sessionfold.projections.pruning.records import ContextMetricsState, DigestHead
from sessionfold.projections.store import DictStore, Store

SID = "s"


def _old_locate(
    store: Store,
    session_id: str,
    state: DigestHead,
    frontier: list[Any] | None,
    mx: ContextMetricsState,
) -> tuple[int, list[Any]] | None:
    """_locate as it was: the scan alone."""
    if frontier is None:
        return None
    turn, call_id = frontier
    if not isinstance(turn, int) or isinstance(turn, bool) or not 0 <= turn < state["turns"]:
        return None
    start = mx["gb"] if 0 <= mx["gt"] <= turn else 0
    for n in range(start, state["n"]):
        row: Any = store.get(f"{session_id}/m/{n}")
        if row["role"] == "assistant" and row["turn"] == turn:
            excluded = metrics._excluded_ids(row, call_id)
            return None if excluded is None else (n, excluded)
    return None


_IDS = [f"e{n}" for n in range(10)]
_CALL_IDS = ("a", "b", "c")
_MESSAGE = st.one_of(
    st.just(None),  # not a message
    st.just("user"),
    st.lists(st.sampled_from(_CALL_IDS), max_size=3),  # an assistant's call ids
)
_OP = st.tuples(
    st.just("entry"), st.sampled_from(_IDS), st.sampled_from(("leaf", *_IDS)), _MESSAGE
) | st.tuples(st.just("reload"), st.sampled_from((None, *_IDS)))


def _entry(entry_id: str, parent: str | None, message: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "label", "id": entry_id, "parentId": parent}
    if message == "user":
        entry["type"] = "message"
        entry["message"] = {"role": "user", "content": "go", "timestamp": 1}
    elif message is not None:
        entry["type"] = "message"
        blocks = [{"type": "toolCall", "id": c, "name": "bash", "arguments": {}} for c in message]
        entry["message"] = {"role": "assistant", "content": blocks, "timestamp": 2}
    return entry


@settings(deadline=None, max_examples=300)
@given(st.lists(_OP, max_size=30), st.integers(-1, 6), st.integers(-1, 6))
def test_locate_matches_the_scan(ops: list[tuple[Any, ...]], gb: int, gt: int) -> None:
    """The same boundary (or none) for every frontier after every op, from any old one."""
    store = DictStore()
    for seq, op in enumerate(ops, start=1):
        if op[0] == "entry":
            parent = digest.head(store, SID)["leaf"] if op[2] == "leaf" else op[2]
            digest.apply_facts(store, SID, entry_facts(_entry(op[1], parent, op[3])), seq)
        else:
            digest.apply_reload(store, SID, op[1])
        state = digest.head(store, SID)
        # An old boundary: none (the whole branch: -1, -1), or a row and a turn.
        mx = {**state["mx"], "gb": gb, "gt": gt if gb >= 0 else -1}
        for turn in range(-1, state["turns"] + 1):
            for call_id in (*_CALL_IDS, "zz"):
                frontier = [turn, call_id]
                new = metrics._locate(store, SID, state, frontier, mx)  # type: ignore[arg-type]
                assert new == _old_locate(store, SID, state, frontier, mx)  # type: ignore[arg-type]
