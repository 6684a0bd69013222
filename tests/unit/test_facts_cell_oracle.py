"""The facts cell as a struct the collector does not track behaves as the plain class it
replaced (kept here as the oracle): equal to every cell and nothing else, copied and deep
copied empty, unhashable; and an envelope's payload compares, copies and encodes as before."""

from __future__ import annotations

import copy
import gc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.events.envelope import (
    EntryEnvelope,
    EntryPayload,
    FactsCell,
    encode,
    entry_envelope,
)
from sessionfold.projections.pruning.entry_facts import facts_of


class OldFactsCell:
    """The cell before it became a struct: the oracle."""

    __slots__ = ("entry", "facts")

    def __init__(self) -> None:
        self.entry: dict[str, Any] | None = None
        self.facts: Any = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OldFactsCell)

    __hash__ = None  # type: ignore[assignment]

    def __copy__(self) -> OldFactsCell:
        return OldFactsCell()

    def __deepcopy__(self, memo: dict[int, Any]) -> OldFactsCell:
        return OldFactsCell()


VALUES = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
)


def _state(cell: Any) -> tuple[Any, Any]:
    return cell.entry, cell.facts


@settings(max_examples=200, deadline=None)
@given(entry=st.none() | st.dictionaries(st.text(max_size=3), VALUES, max_size=3), facts=VALUES)
def test_cell_behaves_as_the_old_one(entry: dict[str, Any] | None, facts: Any) -> None:
    new, old = FactsCell(), OldFactsCell()
    assert _state(new) == _state(old)
    new.entry, new.facts = entry, facts
    old.entry, old.facts = entry, facts
    assert _state(new) == _state(old)
    assert (new == FactsCell()) == (old == OldFactsCell())
    assert (new != FactsCell()) == (old != OldFactsCell())
    for other in (entry, facts, 1, None, "x"):
        assert (new == other) == (old == other)
    for copier in (copy.copy, copy.deepcopy):
        copied_new, copied_old = copier(new), copier(old)
        assert copied_new is not new
        assert _state(copied_new) == _state(copied_old)
    with pytest.raises(TypeError):
        hash(new)
    with pytest.raises(TypeError):
        hash(old)


@settings(max_examples=100, deadline=None)
@given(
    text=st.text(max_size=20),
    seq=st.integers(min_value=0, max_value=2**40),
    line=st.none() | st.integers(min_value=1, max_value=10**6),
)
def test_envelopes_compare_copy_and_encode_alike(text: str, seq: int, line: int | None) -> None:
    entry = {
        "type": "message",
        "id": "a1",
        "parentId": None,
        "message": {"role": "user", "content": [{"type": "text", "text": text}]},
    }
    built = entry_envelope("s", seq, "p", None, entry, line)
    validated = EntryEnvelope(
        session_id="s", seq=seq, producer="p", payload=EntryPayload(entry=entry, line=line)
    )
    private = built.payload.__pydantic_private__
    assert private is not None
    assert isinstance(private["_facts"], FactsCell)
    # Neither the cell nor the dict holding it is the collector's to walk.
    assert not gc.is_tracked(private) and not gc.is_tracked(private["_facts"])
    facts = facts_of(built)  # derived and kept in the cell
    assert private["_facts"].entry is entry and private["_facts"].facts is facts
    for copied in (built.model_copy(), built.model_copy(deep=True), copy.deepcopy(built)):
        assert copied == built
        assert encode(copied) == encode(built)
    deep = built.model_copy(deep=True).payload.__pydantic_private__
    assert deep is not None and deep["_facts"].entry is None  # a copy's cell starts empty
    assert built.payload == EntryPayload(entry=entry, line=line)
    assert built == validated and encode(built) == encode(validated)
