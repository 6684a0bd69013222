"""The publish checkpoint file: what is saved loads back the same, however often it moved."""

from __future__ import annotations

import tempfile
from dataclasses import fields
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.streams.publishing.publisher import Checkpoints
from sessionfold.streams.publishing.session_file import ReadPosition

_counts = st.integers(min_value=0, max_value=2**40)
positions = st.builds(
    ReadPosition,
    offset=_counts,
    line=_counts,
    next_seq=st.integers(min_value=1, max_value=2**40),
    entries=_counts,
    session_id=st.none() | st.text(max_size=40),
    version=st.integers(min_value=0, max_value=3),
)
names = st.text(min_size=1, max_size=60)
floors = st.dictionaries(
    st.text(min_size=1, max_size=30),
    st.dictionaries(st.integers(min_value=0, max_value=64), _counts, max_size=4),
    max_size=2,
)


def test_a_position_saves_every_field() -> None:
    """to_dict names every field of a position, so a new one cannot be left out of the file."""
    position = ReadPosition(offset=9, line=2, next_seq=3, entries=4, session_id="s", version=3)
    assert set(position.to_dict()) == {f.name for f in fields(ReadPosition)}
    assert ReadPosition.from_dict(position.to_dict()) == position


@settings(max_examples=30, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.dictionaries(names, positions, max_size=6),
            st.dictionaries(names, floors, max_size=3),
            st.lists(names, max_size=3),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_saves_load_back_what_was_saved(
    steps: list[tuple[dict[str, ReadPosition], dict[str, dict[str, dict[int, int]]], list[str]]],
) -> None:
    """Positions moved, marks added and dropped between saves: each save loads back as it was
    (the saver re-encodes only the positions that moved)."""
    with tempfile.TemporaryDirectory() as tmp:
        checkpoints = Checkpoints(Path(tmp) / "state.json")
        for moved, marked, unmarked in steps:
            checkpoints.positions.update(moved)
            checkpoints.unsure.update(marked)
            for name in unmarked:
                checkpoints.unsure.pop(name, None)
            checkpoints.save()
            loaded = Checkpoints.load(checkpoints.path)
            assert loaded.positions == checkpoints.positions
            assert loaded.unsure == checkpoints.unsure
