"""The Translator protocol: another agent's transcript mapped, line by line, onto pi v3 entries."""

from __future__ import annotations

from typing import Any, Protocol


class MappingError(ValueError):
    """A line that cannot be mapped; the message is a reason with field names, never text."""


class Translator(Protocol):
    format: str  # "claude-code" | "codex"

    def feed(self, value: dict[str, Any], line: int) -> list[dict[str, Any]]:
        """The pi v3 entry dicts this JSON object completes, in order (the synthetic session header
        first, once). Empty while the object only adds to a group that is still open (e.g. one
        Claude Code API response written as several lines sharing message.id; a Codex assistant
        turn made of reasoning + message + function_call items). Raises MappingError for an object
        that cannot be mapped (the reader dead-letters it and keeps its place with a placeholder).
        """
        ...

    def close(self) -> list[dict[str, Any]]:
        """The entries of the group still open at the end of the file (final read only)."""
        ...

    @property
    def open_since(self) -> int | None:
        """The line number of the first line of the open group, or None."""
        ...
