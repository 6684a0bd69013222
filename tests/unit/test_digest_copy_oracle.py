"""The head's private copy (`metrics.load_head`, and the same copy inlined in
`digest.apply_facts`) and the occurrence index's update (`digest._index_row`) against the way
they were written before, kept here as the oracles: the copy built as `{**stored, "mx": mx}`
and the positions always filtered by a comprehension. The copy is now `dict.copy` with `mx`
set after it, and a result with no stored positions skips the comprehension."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.projections.pruning import context_metrics as metrics
from sessionfold.projections.pruning import digest
from sessionfold.projections.store import DictStore, Store

SID = "s"


def _old_load_head(store: Store, session_id: str) -> Any:
    """metrics.load_head as it was."""
    stored = store.get(f"{session_id}/h")
    if stored is None:
        return metrics.empty_head()
    mx = stored["mx"].copy()
    mx["gx"] = list(mx["gx"])
    return {**stored, "mx": mx}


def _old_index_row(store: Store, session_id: str, state: Any, row: Any) -> None:
    """digest._index_row as it was (its toolResult branch; assistants are unchanged)."""
    role = row["role"]
    if role == "assistant":
        digest._index_row(store, session_id, state, row)
    elif role == "toolResult":
        occ_key = f"{session_id}/o/{row['occ']}"
        kept = [n for n in store.get(occ_key) or () if n < row["n"]]
        store.put(occ_key, [*kept, row["n"]])


_SCALAR = st.none() | st.integers(-3, 50) | st.text(max_size=3) | st.booleans()
_MX = st.dictionaries(st.sampled_from(("tot", "open", "gb", "fr", "gap")), _SCALAR).map(
    lambda d: {**d, "gx": []}
) | st.fixed_dictionaries({"gx": st.lists(_SCALAR, max_size=3), "gb": st.integers(-1, 9)})
_HEAD = st.tuples(
    st.dictionaries(st.sampled_from(("leaf", "last", "k", "n", "turns", "gen", "gap")), _SCALAR),
    _MX,
    st.integers(0, 7),
).map(lambda t: _with_mx(*t))


def _with_mx(fields: dict[str, Any], mx: dict[str, Any], at: int) -> dict[str, Any]:
    # `mx` at any place among the head's keys: the copy must keep the stored order.
    items = list(fields.items())
    items.insert(min(at, len(items)), ("mx", mx))
    return dict(items)


@settings(deadline=None, max_examples=300)
@given(st.none() | _HEAD)
def test_the_head_copy_matches_the_old_one(stored: dict[str, Any] | None) -> None:
    """Equal, in the same key order, and apart from the stored head (its mx and gx too)."""
    store = DictStore()
    if stored is not None:
        store.put(f"{SID}/h", stored)
    new, old = metrics.load_head(store, SID), _old_load_head(store, SID)
    assert new == old
    assert list(new) == list(old) and list(new["mx"]) == list(old["mx"])
    if stored is not None:
        before = repr(stored)
        new["k"] = "changed"
        new["mx"]["tot"] = "changed"
        new["mx"]["gx"].append("changed")
        assert repr(stored) == before


_ROW = st.tuples(st.sampled_from(("o1", "o2", "o3")), st.integers(0, 12))
_STORED = st.dictionaries(
    st.sampled_from(("o1", "o2", "o3")), st.none() | st.lists(st.integers(0, 12), max_size=4)
)


@settings(deadline=None, max_examples=300)
@given(_STORED, st.lists(_ROW, max_size=12))
def test_the_occurrence_index_matches_the_old_one(
    stored: dict[str, list[int] | None], rows: list[tuple[str, int]]
) -> None:
    """The same positions under every occurrence key after each result joins."""
    new, old = DictStore(), DictStore()
    for occ, positions in stored.items():
        if positions is not None:
            new.put(f"{SID}/o/{occ}", list(positions))
            old.put(f"{SID}/o/{occ}", list(positions))
    state = metrics.empty_head()
    for occ, n in rows:
        row = {"n": n, "id": f"e{n}", "role": "toolResult", "occ": occ}
        digest._index_row(new, SID, state, row)  # type: ignore[arg-type]
        _old_index_row(old, SID, state, row)
        assert new == old
