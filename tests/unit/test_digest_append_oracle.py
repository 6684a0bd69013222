"""The digest's append (digest.apply_facts) against the way it was written before, kept here
as the oracle: the entry's node looked up by `_folded_before` and its parent by `_parent_of`
for every entry. The append now builds each key once and skips the parent's lookup when the
parent is the leaf. Drawn trees: repeated ids, self and unknown parents, gaps, reloads."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.projections.pruning import context_metrics as metrics
from sessionfold.projections.pruning import digest
from sessionfold.projections.pruning.entry_facts import EntryFacts, entry_facts
from sessionfold.projections.store import DictStore, Store, key

SID = "s"


def _old_apply_facts(
    store: Store, session_id: str, facts: EntryFacts, seq: int | None = None
) -> digest.Appended | None:
    """apply_facts as it was."""
    entry_id = facts.id
    if facts.kind == "session" or entry_id is None:
        return None
    stored: Any = store.get(key(session_id, "h"))
    if stored is None:
        state = metrics.empty_head()
    else:
        mx = stored["mx"].copy()
        mx["gx"] = list(mx["gx"])
        state = {**stored, "mx": mx}
    if digest._folded_before(store, session_id, state, entry_id):  # type: ignore[arg-type]
        return None
    parent = digest._parent_of(store, session_id, state, facts.parent, entry_id)  # type: ignore[arg-type]
    return digest._append(store, session_id, state, entry_id, parent, facts, seq)  # type: ignore[arg-type]


_IDS = [f"e{n}" for n in range(8)]
# An op: an entry (id, parent choice, message or not), a gap (a dead line), or a reload.
_PARENT = st.sampled_from(("leaf", "none", "self", "unknown")) | st.sampled_from(_IDS)
_OP = (
    st.tuples(st.just("entry"), st.sampled_from(_IDS), _PARENT, st.booleans())
    | st.tuples(st.just("gap"))
    | st.tuples(st.just("reload"), st.sampled_from((None, *_IDS)))
)


def _entry(entry_id: str, parent: Any, message: bool, leaf: Any) -> dict[str, Any]:
    parent_id = {"leaf": leaf, "none": None, "self": entry_id, "unknown": "zz"}.get(parent, parent)
    entry: dict[str, Any] = {"type": "message" if message else "label", "id": entry_id}
    entry["parentId"] = parent_id
    if message:
        entry["message"] = {"role": "user", "content": "go", "timestamp": 1}
    return entry


@settings(deadline=None, max_examples=300)
@given(st.lists(_OP, max_size=25))
def test_the_append_matches_the_old_one(ops: list[tuple[Any, ...]]) -> None:
    """The same answer and the same rows after every op."""
    new, old = DictStore(), DictStore()
    for seq, op in enumerate(ops, start=1):
        if op[0] == "entry":
            leaf = digest.head(new, SID)["leaf"]
            facts = entry_facts(_entry(op[1], op[2], op[3], leaf))
            assert digest.apply_facts(new, SID, facts, seq) == _old_apply_facts(
                old, SID, facts, seq
            )
        elif op[0] == "gap":
            digest.apply_placeholder(new, SID, None, None)
            digest.apply_placeholder(old, SID, None, None)
        else:
            assert digest.apply_reload(new, SID, op[1]) == digest.apply_reload(old, SID, op[1])
        assert new == old
