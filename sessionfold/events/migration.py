"""Migration of v1 and v2 session entries to the v3 shape, one entry at a time.

pi migrates a whole file when it opens it (reference/pi-session-format.md §1.5). We migrate as we
stream, so the ids a v1 entry gets must be computable from its position alone: the id of the entry
at header-inclusive index i is a hash of (session id, i). That also resolves a v1 compaction's
`firstKeptEntryIndex` (header counted as index 0) without remembering earlier entries.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Any

CURRENT_VERSION = 3


# An entry's parent id is the previous entry's own id: a few cached ids halve the hashing.
@lru_cache(maxsize=16)
def v1_entry_id(session_id: str, index: int) -> str:
    """Deterministic 8-hex id for the v1 entry at header-inclusive `index` (pi's id shape)."""
    return hashlib.sha256(f"{session_id}/{index}".encode()).hexdigest()[:8]


def file_version(header: dict[str, Any]) -> int:
    """The format version a header declares; absent means 1."""
    version = header.get("version")
    return version if isinstance(version, int) and version > 0 else 1


def migrate_entry(
    entry: dict[str, Any], version: int, session_id: str, index: int
) -> dict[str, Any]:
    """Return `entry` in the v3 shape; `index` is its header-inclusive position in the file.

    The dict is changed in place where needed (it came straight from the parser); key order of
    everything that was already there is kept.
    """
    if version <= 1 and "id" not in entry:
        migrated = {
            "type": entry.get("type"),
            "id": v1_entry_id(session_id, index),
            "parentId": v1_entry_id(session_id, index - 1) if index > 1 else None,
        }
        # `type` keeps its place (first) and its value: the same object `get` read.
        migrated.update(entry)
        entry = migrated
        kept = entry.pop("firstKeptEntryIndex", None)
        if entry.get("type") == "compaction" and isinstance(kept, int) and 0 < kept < index:
            entry["firstKeptEntryId"] = v1_entry_id(session_id, kept)
    if version <= 2 and entry.get("type") == "message":
        message = entry.get("message")
        if isinstance(message, dict) and message.get("role") == "hookMessage":
            message["role"] = "custom"
    return entry
