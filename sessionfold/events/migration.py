"""Migration of v1 and v2 session entries to the v3 shape, one entry at a time.

pi migrates a whole file when it opens it (reference/pi-session-format.md §1.5). We migrate as we
stream, so the ids a v1 entry gets must be computable from its position alone: the id of the entry
at header-inclusive index i is a hash of (session id, i). That also resolves a v1 compaction's
`firstKeptEntryIndex` (header counted as index 0) without remembering earlier entries.
"""

from __future__ import annotations

import hashlib
from typing import Any

CURRENT_VERSION = 3

_sha256 = hashlib.sha256


def v1_entry_id(session_id: str, index: int) -> str:
    """Deterministic 8-hex id for the v1 entry at header-inclusive `index` (pi's id shape)."""
    return _sha256(f"{session_id}/{index}".encode()).hexdigest()[:8]


# The id `migrate_entry` made last, as (session id, index, id): a v1 entry's parent is the
# entry migrated just before it, so one hash a line instead of two (one tuple read and
# replaced whole, so threads migrating other files only miss it).
_last_id: tuple[str, int, str] = ("", -1, "")


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
    global _last_id
    kind = entry.get("type")  # the same object before and after the ids go in front
    if version <= 1 and "id" not in entry:
        parent = None
        if index > 1:
            last = _last_id
            if last[1] == index - 1 and last[0] == session_id:
                parent = last[2]
            else:
                parent = v1_entry_id(session_id, index - 1)
        own = _sha256(f"{session_id}/{index}".encode()).hexdigest()[:8]  # v1_entry_id, inline
        _last_id = (session_id, index, own)
        migrated = {"type": kind, "id": own, "parentId": parent}
        # `type` keeps its place (first) and its value: the same object `get` read.
        migrated.update(entry)
        entry = migrated
        if "firstKeptEntryIndex" in entry:
            kept = entry.pop("firstKeptEntryIndex")
            position = kept_position(kept)
            if kind == "compaction" and position is not None and 0 < position < index:
                entry["firstKeptEntryId"] = v1_entry_id(session_id, position)
    if version <= 2 and kind == "message":
        message = entry.get("message")
        if isinstance(message, dict) and message.get("role") == "hookMessage":
            message["role"] = "custom"
    return entry


def kept_position(kept: Any) -> int | None:
    """The entry position pi's `entries[firstKeptEntryIndex]` reads, None for none: pi takes any
    JSON number (`typeof === "number"`), so 2.0 is position 2, 2.5 is none, and true is none."""
    if type(kept) is int:
        return kept
    if type(kept) is float and kept.is_integer():
        return int(kept)
    return None
