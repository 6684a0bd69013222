"""The edits install makes to a settings document, and how each is undone.

A document is a nested mapping (a parsed JSON object, a tomlkit document). An edit either sets
a key to a value or adds an item to a list; what it did is a `Change`, the record uninstall
needs: the value it wrote, the value it replaced (if any) and the containers it created. Undoing
a change touches only what install wrote: a value the user has changed since stays, an item the
user has removed stays removed, a container the user has added to stays.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

#: The keys from the document's root to a value.
KeyPath = tuple[str, ...]
#: Makes the empty container of the document's own kind (a dict, a tomlkit table).
NewContainer = Callable[[KeyPath], MutableMapping[str, Any]]


class EditConflict(ValueError):
    """A key on an edit's path holds something that is not a mapping (or not a list)."""


@dataclass(frozen=True)
class SetKey:
    """Set the key at `path` to `value`."""

    path: KeyPath
    value: Any


@dataclass(frozen=True)
class AddItem:
    """Add `item` to the end of the list at `path` (created if missing), unless it is there."""

    path: KeyPath
    item: Any


Edit = SetKey | AddItem


@dataclass(frozen=True)
class Change:
    """What one edit did. `kind` is "set" or "add"; `previous` is the replaced value, when
    `replaced`; `created` are the containers (mappings, the list) it made, outermost first."""

    kind: str
    path: KeyPath
    value: Any
    replaced: bool = False
    previous: Any = None
    created: tuple[KeyPath, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        """The change as a JSON object (the record's form)."""
        out: dict[str, Any] = {"kind": self.kind, "path": list(self.path), "value": self.value}
        if self.replaced:
            out["previous"] = self.previous
        if self.created:
            out["created"] = [list(p) for p in self.created]
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Change:
        """The change a record holds (`to_json`'s inverse)."""
        return cls(
            kind=obj["kind"],
            path=tuple(obj["path"]),
            value=obj["value"],
            replaced="previous" in obj,
            previous=obj.get("previous"),
            created=tuple(tuple(p) for p in obj.get("created", ())),
        )

    def describe(self) -> str:
        """One line for the user: what the change sets or adds (no value of theirs)."""
        verb = "set" if self.kind == "set" else "add an entry to"
        return f"{verb} {'.'.join(self.path)}"


def plain(value: object) -> object:
    """A document's value as plain Python (tomlkit items unwrapped), for comparisons."""
    unwrap = getattr(value, "unwrap", None)
    return unwrap() if callable(unwrap) else value


def apply_edits(
    doc: MutableMapping[str, Any], edits: list[Edit], new: NewContainer
) -> list[Change]:
    """Apply `edits` to `doc` in place; the changes made (an edit already in effect makes none,
    so applying the same edits twice changes nothing the second time)."""
    changes: list[Change] = []
    for edit in edits:
        created: list[KeyPath] = []
        parent = _parent(doc, edit.path, new, created)
        key = edit.path[-1]
        if isinstance(edit, SetKey):
            if key in parent and plain(parent[key]) == edit.value:
                continue
            replaced = key in parent
            previous = plain(parent[key]) if replaced else None
            parent[key] = _fresh(edit.value, edit.path, new)
            changes.append(Change("set", edit.path, edit.value, replaced, previous, tuple(created)))
        else:
            if key not in parent:
                parent[key] = []
                created.append(edit.path)
            items = parent[key]
            if not isinstance(items, list):
                raise EditConflict(f"{'.'.join(edit.path)} is not a list")
            if any(plain(i) == edit.item for i in items):
                continue
            items.append(edit.item)
            changes.append(Change("add", edit.path, edit.item, created=tuple(created)))
    return changes


def revert_changes(doc: MutableMapping[str, Any], changes: list[Change]) -> None:
    """Undo `changes` in `doc` in place, newest first, as far as the document still holds what
    they wrote; containers they created are removed once empty."""
    for change in reversed(changes):
        parent = _existing_parent(doc, change.path)
        key = change.path[-1]
        if parent is not None and key in parent:
            if change.kind == "set" and plain(parent[key]) == change.value:
                if change.replaced:
                    parent[key] = change.previous
                else:
                    del parent[key]
            elif change.kind == "add" and isinstance(parent[key], list):
                items = parent[key]
                for i, item in enumerate(items):
                    if plain(item) == change.value:
                        del items[i]
                        break
        for path in reversed(change.created):
            holder = _existing_parent(doc, path)
            if holder is not None and path[-1] in holder and not plain(holder[path[-1]]):
                del holder[path[-1]]


def _parent(
    doc: MutableMapping[str, Any], path: KeyPath, new: NewContainer, created: list[KeyPath]
) -> MutableMapping[str, Any]:
    """The mapping that holds `path`'s last key, making the missing ones (noted in
    `created`)."""
    node = doc
    for depth, key in enumerate(path[:-1], start=1):
        if key not in node:
            node[key] = new(path[:depth])
            created.append(path[:depth])
        child = node[key]
        if not isinstance(child, MutableMapping):
            raise EditConflict(f"{'.'.join(path[:depth])} is not a table or object")
        node = child
    return node


def _existing_parent(
    doc: MutableMapping[str, Any], path: KeyPath
) -> MutableMapping[str, Any] | None:
    """The mapping that holds `path`'s last key, or None if the path is gone."""
    node: Any = doc
    for key in path[:-1]:
        if not isinstance(node, MutableMapping) or key not in node:
            return None
        node = node[key]
    return node if isinstance(node, MutableMapping) else None


def _fresh(value: object, path: KeyPath, new: NewContainer) -> object:
    """`value` for the document: a mapping becomes a container of the document's kind."""
    if not isinstance(value, dict):
        return value
    container = new(path)
    for key, item in value.items():
        container[key] = item
    return container
