"""Facts read straight off one pi message or content block, shared by every pruning module.

Below the digest and the metrics (both import it), so the naive definitions and the
incremental folds read a message the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_COMPRESSED_CHAIN_PREFIX = "<compressed-chain"


def is_text_only_assistant(message: Mapping[str, Any]) -> bool:
    """An assistant message without toolCall blocks (non-array content counts): a final reply."""
    if message.get("role") != "assistant":
        return False
    content = message.get("content")
    if not isinstance(content, list):
        return True
    return not any(isinstance(b, dict) and b.get("type") == "toolCall" for b in content)


def is_passthrough(message: Mapping[str, Any]) -> bool:
    """A user message whose text starts with `<compressed-chain`: a chain synthetic."""
    content = message.get("content")
    if isinstance(content, str):
        return content.lstrip().startswith(_COMPRESSED_CHAIN_PREFIX)
    if not isinstance(content, list) or not content:
        return False
    first = content[0]
    return (
        isinstance(first, dict)
        and first.get("type") == "text"
        and isinstance(first.get("text"), str)
        and first["text"].lstrip().startswith(_COMPRESSED_CHAIN_PREFIX)
    )


#: The arguments that name a file tool's file, by tool: pi's tools take `path`; Claude Code's
#: Read, Edit and Write take `file_path`, NotebookEdit `notebook_path`.
PATH_ARGUMENTS = ("path", "file_path", "notebook_path")


def path_argument(args: Any) -> str | None:
    """The file a tool call's arguments name (`PATH_ARGUMENTS`, first found), when a str."""
    if not isinstance(args, dict):
        return None
    for name in PATH_ARGUMENTS:
        path = args.get(name)
        if isinstance(path, str):
            return path
    return None


def call_path(block: Mapping[str, Any]) -> str | None:
    """The file argument of a toolCall block, when it is a str (else None)."""
    # §3.2: the protection predicate receives `input ?? arguments`.
    args = block.get("input")
    if args is None:
        args = block.get("arguments")
    return path_argument(args)
