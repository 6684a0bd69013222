"""Facts read straight off one pi message or content block, shared by every pruning module.

Below the digest and the metrics (both import it), so the naive definitions and the
incremental folds read a message the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def is_text_only_assistant(message: Mapping[str, Any]) -> bool:
    """An assistant message without toolCall blocks (non-array content counts): a final reply."""
    if message.get("role") != "assistant":
        return False
    content = message.get("content")
    if not isinstance(content, list):
        return True
    return not any(isinstance(b, dict) and b.get("type") == "toolCall" for b in content)


def call_path(block: Mapping[str, Any]) -> str | None:
    """The `path` argument of a toolCall block, when it is a str (else None)."""
    # §3.2: the protection predicate receives `input ?? arguments`.
    args = block.get("input")
    if args is None:
        args = block.get("arguments")
    path = args.get("path") if isinstance(args, dict) else None
    return path if isinstance(path, str) else None
