"""Edits to a JSON settings file (Claude Code's settings and MCP files, Codex's hooks.json):
text in, text out.

The object's key order is kept (new keys go last); the text is written back in the file's own
indent (two spaces for a new file) with its trailing newline, so a document written that way
(as Claude Code writes its own) comes back byte for byte once the changes are undone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from sessionfold.streams.tools.install.changes import (
    Change,
    Edit,
    KeyPath,
    apply_edits,
    revert_changes,
)
from sessionfold.streams.tools.install.text_patch import Hunk, undo


class UnreadableDocument(ValueError):
    """The file is not a document install can edit (its text is never in the message)."""


def parse_json(text: str) -> dict[str, Any]:
    """The JSON object `text` holds ("" is an empty object)."""
    if not text.strip():
        return {}
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as error:
        raise UnreadableDocument(
            f"not valid JSON (line {error.lineno}, column {error.colno})"
        ) from None
    if not isinstance(doc, dict):
        raise UnreadableDocument(f"the top level is a JSON {type(doc).__name__}, not an object")
    return doc


def install_json(text: str, edits: list[Edit]) -> tuple[str, list[Change]]:
    """`text` with `edits` applied, and what changed (no change: `text` itself)."""
    doc = parse_json(text)
    changes = apply_edits(doc, edits, _new_object)
    if not changes:
        return text, []
    return _dump(doc, text), changes


def uninstall_json(text: str, changes: list[Change], patches: Sequence[list[Hunk]] = ()) -> str:
    """`text` with `changes` undone, as far as it still holds what they wrote; in the user's
    own bytes where the installs' `patches` still apply (text_patch.py)."""
    doc = parse_json(text)
    revert_changes(doc, changes)
    return undo(text, list(patches), _dump(doc, text), _same_json)


def _same_json(a: str, b: str) -> bool:
    try:
        return parse_json(a) == parse_json(b)
    except UnreadableDocument:
        return False


def _new_object(_path: KeyPath) -> dict[str, Any]:
    return {}


def _dump(doc: dict[str, Any], like: str) -> str:
    """`doc` in the layout of `like`: its indent (none for a one-line document), its trailing
    newline."""
    stripped = like.strip()
    if not stripped:
        return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    found = re.search(r"\n([ \t]+)\S", stripped)
    # A one-line document stays on one line; an empty multi-line one gets two spaces.
    indent: str | None = found.group(1) if found else ("  " if "\n" in stripped else None)
    body = json.dumps(doc, indent=indent, ensure_ascii=False)
    return body + like[len(like.rstrip()) :]
