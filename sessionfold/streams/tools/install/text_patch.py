"""The lines an install changed in a file's text, and putting them back: a reverse patch.

A structural undo (parse, remove the entries, write the document out) gives the same data, but
not always the same bytes: tomlkit, for one, leaves a blank line where a table it appended was
removed. So install also records its edit as hunks of lines (with two lines of context), and
uninstall takes the hunks out again wherever the context still stands (the user may have added
lines above since), which gives the file back byte for byte. The caller checks that the result
holds the same data as the structural undo, and falls back to the latter when a hunk no longer
applies.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

CONTEXT = 2


@dataclass(frozen=True)
class Hunk:
    """Lines `after` (at line `at` of the text install wrote) stand where `before` stood;
    `lead` and `trail` are the lines around them then."""

    at: int
    before: tuple[str, ...]
    after: tuple[str, ...]
    lead: tuple[str, ...]
    trail: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The hunk as a JSON object (the record's form)."""
        return {
            "at": self.at,
            "before": list(self.before),
            "after": list(self.after),
            "lead": list(self.lead),
            "trail": list(self.trail),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Hunk:
        """The hunk a record holds."""
        return cls(
            int(obj["at"]),
            *(tuple(str(x) for x in obj[k]) for k in ("before", "after", "lead", "trail")),
        )


def diff(before: str, after: str) -> list[Hunk]:
    """The hunks that turn `before` into `after`."""
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    hunks = []
    ops = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    for n, (tag, i1, i2, j1, j2) in enumerate(ops):
        if tag == "equal":
            continue
        # Context only from the unchanged lines beside the hunk: a neighbour's lines change
        # back when it is undone.
        start = ops[n - 1][3] if n and ops[n - 1][0] == "equal" else j1
        end = ops[n + 1][4] if n + 1 < len(ops) and ops[n + 1][0] == "equal" else j2
        lead = tuple(new[max(start, j1 - CONTEXT) : j1])
        trail = tuple(new[j2 : min(end, j2 + CONTEXT)])
        hunks.append(Hunk(j1, tuple(old[i1:i2]), tuple(new[j1:j2]), lead, trail))
    return hunks


def reverse(text: str, hunks: list[Hunk]) -> str | None:
    """`text` with `hunks` taken out (each where its lines and context stand, nearest its old
    place), or None when one of them no longer applies."""
    lines = text.splitlines(keepends=True)
    for hunk in sorted(hunks, key=lambda h: h.at, reverse=True):
        width = len(hunk.after)
        lead, trail = _ends(hunk.lead), _ends(hunk.trail)
        places = [
            p
            for p in range(len(lead), len(lines) - width - len(trail) + 1)
            if _ends(lines[p - len(lead) : p]) == lead
            and tuple(lines[p : p + width]) == hunk.after
            and _ends(lines[p + width : p + width + len(trail)]) == trail
        ]
        if not places:
            return None
        p = min(places, key=lambda q: abs(q - hunk.at))
        lines[p : p + width] = hunk.before
    return "".join(lines)


def _ends(lines: Sequence[str]) -> tuple[str, ...]:
    """Context lines without their line ends: a line the user has since ended (to add lines
    below the file's last) is still the same context."""
    return tuple(line.rstrip("\r\n") for line in lines)


def undo(
    text: str, patches: list[list[Hunk]], structural: str, same: Callable[[str, str], bool]
) -> str:
    """`text` with each install's hunks taken out, newest install first, when that gives the
    data of `structural` (the structural undo) in the user's own bytes; else `structural`."""
    patched: str | None = text
    for hunks in reversed(patches):
        patched = reverse(patched, hunks) if patched is not None else None
    return patched if patched is not None and same(patched, structural) else structural
