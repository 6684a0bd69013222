"""`migrate_entry`, which hashes one id a v1 line (its parent's is the id made before it), makes
what the migration that hashed both ids (kept here as the oracle) made, key order included, for
any order of calls: entries in file order, resumed readers, files read in turn."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.events.migration import kept_position, migrate_entry


def _old_id(session_id: str, index: int) -> str:
    return hashlib.sha256(f"{session_id}/{index}".encode()).hexdigest()[:8]


def old_migrate_entry(
    entry: dict[str, Any], version: int, session_id: str, index: int
) -> dict[str, Any]:
    """The migration before one hash a line (the oracle)."""
    if version <= 1 and "id" not in entry:
        migrated = {
            "type": entry.get("type"),
            "id": _old_id(session_id, index),
            "parentId": _old_id(session_id, index - 1) if index > 1 else None,
        }
        migrated.update(entry)
        entry = migrated
        # Which values are a position is the shared rule (kept_position), not what is oracled.
        kept = kept_position(entry.pop("firstKeptEntryIndex", None))
        if entry.get("type") == "compaction" and kept is not None and 0 < kept < index:
            entry["firstKeptEntryId"] = _old_id(session_id, kept)
    if version <= 2 and entry.get("type") == "message":
        message = entry.get("message")
        if isinstance(message, dict) and message.get("role") == "hookMessage":
            message["role"] = "custom"
    return entry


ENTRY = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["message", "compaction", "custom", None, 3]),
        "id": st.sampled_from(["a1", None, 7]),
        "parentId": st.sampled_from(["a0", None]),
        "firstKeptEntryIndex": st.sampled_from([0, 1, 2, 5, 40, -1, "2", None, True, 2.0, 2.5]),
        "message": st.sampled_from([{"role": "hookMessage"}, {"role": "user"}, "x"]),
        "summary": st.just("s"),
    },
)

CALL = st.tuples(
    ENTRY,
    st.sampled_from([0, 1, 1, 1, 2, 3]),
    st.sampled_from(["s1", "s2", "d703a1a9-1b7b-4fb1-b512-c9738b1fe617"]),
    st.integers(0, 45),
)


@st.composite
def calls(draw: st.DrawFn) -> list[tuple[dict[str, Any], int, str, int]]:
    """Calls as readers make them: runs of consecutive indexes, and jumps between them."""
    out = []
    for entry, version, session_id, index in draw(st.lists(CALL, max_size=12)):
        for step in range(draw(st.integers(1, 4))):
            out.append((copy.deepcopy(entry), version, session_id, index + step))
    return out


def dumped(value: dict[str, Any]) -> bytes:
    return orjson.dumps(value)  # key order counts: the records carry it


@settings(max_examples=400, deadline=None)
@given(calls())
def test_migration_makes_what_the_two_hash_migration_made(
    drawn: list[tuple[dict[str, Any], int, str, int]],
) -> None:
    for entry, version, session_id, index in drawn:
        expected = old_migrate_entry(copy.deepcopy(entry), version, session_id, index)
        assert dumped(migrate_entry(entry, version, session_id, index)) == dumped(expected)
