"""JSON the CLI prints: stable, and safe to show in a terminal."""

from __future__ import annotations

import re

import orjson

# JSON escapes C0 controls itself; C1 controls, DEL, bidi controls and line separators it
# leaves raw inside strings, where a \u escape means the same and a terminal sees nothing.
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def safe_json(value: object) -> str:
    """Stable JSON (sorted keys, indented) with no raw control character in it."""
    text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2).decode()
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)
