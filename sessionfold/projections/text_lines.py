"""Lines as `str.splitlines` reads them, found around one position instead of by splitting.

The offline summary names the first line of a tool's output that a pattern matches; when no
match spans a line break, that line is the one around the first match in the whole text, and
cutting it out around that position costs a few `find`s, not a split of the text.
"""

from __future__ import annotations

import re

#: The characters `str.splitlines` ends a line at ("\r\n" ends one line, as "\r" then "\n").
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_BREAK = re.compile(f"[{re.escape(LINE_BREAKS)}]")


def line_at(text: str, at: int) -> str:
    """The line of `text` (without its break) that holds `text[at]`, which is not a break."""
    start = max(text.rfind(mark, 0, at) for mark in LINE_BREAKS) + 1
    end = _BREAK.search(text, at)
    return text[start : len(text) if end is None else end.start()]
