"""Other agents' transcript formats, mapped at read time onto pi v3 entries.

`detect` names a file's format from its first JSON object; `translator_for` gives a fresh
translator (base.Translator) for a format other than pi, whose entries the reader folds
exactly as it folds a pi file's. Everything past the reader stays format-blind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, get_args

from sessionfold.events.formats.base import Translator
from sessionfold.events.formats.claude_code import ClaudeCodeTranslator, is_claude_code
from sessionfold.events.formats.codex import CodexTranslator

__all__ = [
    "FORMATS",
    "TRANSLATORS",
    "Format",
    "base",
    "claude_code",
    "codex",
    "detect",
    "translator_for",
]

Format = Literal["pi", "claude-code", "codex"]
FORMATS: tuple[str, ...] = get_args(Format)

#: The translators by format (pi needs none: its entries are read as they are).
TRANSLATORS: dict[str, Callable[[], Translator]] = {
    "claude-code": ClaudeCodeTranslator,
    "codex": CodexTranslator,
}

#: Codex rollout line types (`type` with a `payload`), for detection.
CODEX_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})


def detect(value: Any) -> Format | None:
    """The format a file's first JSON object says it is in, or None when it names none."""
    if not isinstance(value, dict):
        return None
    kind = value.get("type")
    if kind == "session":
        return "pi"
    if isinstance(kind, str) and kind in CODEX_TYPES and isinstance(value.get("payload"), dict):
        return "codex"
    if is_claude_code(value):
        return "claude-code"
    return None


def translator_for(format: str) -> Translator | None:
    """A fresh translator for `format`; None for pi. Raises ValueError for a format not read."""
    if format == "pi":
        return None
    make = TRANSLATORS.get(format)
    if make is None:
        raise ValueError(f"format {format!r} is not read by this build")
    return make()
