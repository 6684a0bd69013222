"""The install record: what `sessionfold install` changed in each file, so `--uninstall` can
undo exactly that.

One JSON file per agent and scope (beside the agent's settings). Per file: whether it existed,
where its backup is, the hash of the text install left (a file nobody touched since is restored
from the backup byte for byte), the changes (oldest first) and each install's text hunks
(text_patch.py: a file edited since gets back the user's own bytes where they still apply).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from sessionfold.streams.tools.install.changes import Change
from sessionfold.streams.tools.install.json_edits import UnreadableDocument
from sessionfold.streams.tools.install.text_patch import Hunk, diff

VERSION = 1


def digest(text: str) -> str:
    """The hash a record keeps of a text."""
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class FileRecord:
    """What install did to one file."""

    existed: bool
    backup: str | None
    installed_sha256: str
    changes: list[Change] = field(default_factory=list)
    patches: list[list[Hunk]] = field(default_factory=list)


@dataclass
class Record:
    """What install did to the files of one agent and scope, keyed by absolute path."""

    agent: str
    scope: str
    files: dict[str, FileRecord] = field(default_factory=dict)

    def add(
        self,
        path: str,
        before: str,
        existed: bool,
        backup: str | None,
        after: str,
        changes: list[Change],
    ) -> None:
        """Note an install's `changes` to `path` (text `before` -> `after`); a file already
        recorded keeps its first backup and state, and gains the new changes."""
        known = self.files.get(path)
        hunks = diff(before, after)
        if known is None:
            self.files[path] = FileRecord(existed, backup, digest(after), list(changes), [hunks])
            return
        known.changes.extend(changes)
        known.patches.append(hunks)
        # The backup stands for the file without sessionfold's entries only while nobody else
        # has edited it since the last install; after an edit, uninstall undoes entry by entry.
        untouched = known.installed_sha256 == digest(before)
        known.installed_sha256 = digest(after) if untouched else ""

    def to_text(self) -> str:
        """The record as the JSON text stored."""
        files = {
            path: {
                "existed": f.existed,
                "backup": f.backup,
                "installed_sha256": f.installed_sha256,
                "changes": [c.to_json() for c in f.changes],
                "patches": [[h.to_json() for h in hunks] for hunks in f.patches],
            }
            for path, f in self.files.items()
        }
        body = {"version": VERSION, "agent": self.agent, "scope": self.scope, "files": files}
        return json.dumps(body, indent=2) + "\n"


def parse_record(text: str) -> Record:
    """The record a text holds (`to_text`'s inverse)."""
    try:
        obj: Any = json.loads(text)
        if obj.get("version") != VERSION:
            raise UnreadableDocument(f"an install record of version {obj.get('version')!r}")
        files = {
            path: FileRecord(
                existed=bool(f["existed"]),
                backup=f["backup"],
                installed_sha256=f["installed_sha256"],
                changes=[Change.from_json(c) for c in f["changes"]],
                patches=[[Hunk.from_json(h) for h in hunks] for hunks in f["patches"]],
            )
            for path, f in obj["files"].items()
        }
        return Record(obj["agent"], obj["scope"], files)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        if isinstance(error, UnreadableDocument):
            raise
        raise UnreadableDocument(f"not an install record ({type(error).__name__})") from None
