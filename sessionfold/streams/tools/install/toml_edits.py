"""Edits to Codex's config.toml: text in, text out, through tomlkit so that comments, key
order and layout stay as the user wrote them.

tomlkit is imported here only (the `install` command imports this module when it runs).
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError

from sessionfold.streams.tools.install.changes import (
    Change,
    Edit,
    KeyPath,
    apply_edits,
    revert_changes,
)
from sessionfold.streams.tools.install.json_edits import UnreadableDocument
from sessionfold.streams.tools.install.text_patch import Hunk, undo


def parse_toml(text: str) -> tomlkit.TOMLDocument:
    """The TOML document `text` holds."""
    try:
        return tomlkit.parse(text)
    except TOMLKitError as error:
        # The message names a line and column; tomlkit's messages quote no value.
        line, col = getattr(error, "line", None), getattr(error, "col", None)
        where = f" (line {line}, column {col})" if line is not None else ""
        raise UnreadableDocument(f"not valid TOML{where}") from None


def install_toml(text: str, edits: list[Edit]) -> tuple[str, list[Change]]:
    """`text` with `edits` applied, and what changed (no change: `text` itself)."""
    doc = parse_toml(text)
    changes = apply_edits(doc, edits, _new_table)
    if not changes:
        return text, []
    return tomlkit.dumps(doc), changes


def uninstall_toml(text: str, changes: list[Change], patches: Sequence[list[Hunk]] = ()) -> str:
    """`text` with `changes` undone, as far as it still holds what they wrote; in the user's
    own bytes where the installs' `patches` still apply (tomlkit alone leaves blank lines
    where the tables it added were)."""
    doc = parse_toml(text)
    revert_changes(doc, changes)
    return undo(text, list(patches), tomlkit.dumps(doc), _same_toml)


def _same_toml(a: str, b: str) -> bool:
    try:
        return parse_toml(a).unwrap() == parse_toml(b).unwrap()
    except UnreadableDocument:
        return False


def _new_table(path: KeyPath) -> MutableMapping[str, Any]:
    # `[mcp_servers.sessionfold]` alone, not an empty `[mcp_servers]` header above it.
    return tomlkit.table(is_super_table=path in SUPER_TABLES)


#: Tables that only hold named sub-tables (`[mcp_servers.NAME]`, `[model_providers.NAME]`,
#: `[hooks.state."KEY"]`).
SUPER_TABLES = frozenset({("mcp_servers",), ("model_providers",), ("hooks",), ("hooks", "state")})
