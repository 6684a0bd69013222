"""The protocol every translator of another agent's transcript format implements.

A translator maps the JSON objects of one file, in order, onto the pi v3 entry dicts the reader
already folds (the synthetic session header first, once), the way `events/migration.py` maps
v1 and v2 pi entries. It is pure and deterministic: the same objects give the same entries,
byte for byte. Its state may span the whole file (Codex: the session id, the chain's last id,
the calls waiting for their outputs); a reader resumed at a position feeds a new translator
the file's lines before it and drops what they give, so it reads on exactly as one reader of
the whole file. A checkpoint taken while a group is open stands at its first line
(`open_since`), and the group's lines are read again.
"""

from __future__ import annotations

from typing import Any, Protocol


class MappingError(ValueError):
    """A line that cannot be mapped; the message is a reason with field names, never text.

    `id` and `parent_id`, when the line names them, let the reader's placeholder keep the
    line's place in the session tree (as a dead-lettered pi entry's does).
    """

    def __init__(self, reason: str, *, id: str | None = None, parent_id: str | None = None) -> None:
        super().__init__(reason)
        self.id = id
        self.parent_id = parent_id


class Translator(Protocol):
    """Maps one file's JSON objects onto pi v3 entry dicts, one object at a time."""

    format: str  # "claude-code" | "codex"

    def feed(self, value: dict[str, Any], line: int) -> list[dict[str, Any]]:
        """The pi v3 entry dicts this JSON object completes, in order (the header first, once).

        Empty while the object only adds to a group that is still open. Raises MappingError for
        an object that cannot be mapped (the reader dead-letters it and keeps its place).
        """
        ...

    def close(self) -> list[dict[str, Any]]:
        """The entries of the group still open at the end of the file (final read only)."""
        ...

    @property
    def open_since(self) -> int | None:
        """The line number of the first line of the open group, or None."""
        ...
