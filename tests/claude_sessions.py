"""Claude Code transcripts for tests: the generator's, written to disk, and what their lines say.

The counts here are read from the source lines alone (never from the translator), so a test that
compares them with what the reader yields checks the mapping against the format.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessionfold.streams.tools.synthetic_claude import (
    generate_claude_session,
    write_claude_session,
)

INJECTED = re.compile(r"\A\s*<(command-name|command-message|local-command-[a-z]+)>")


def write_transcript(folder: Path, seed: int, turns: int) -> list[Path]:
    """The main transcript and its subagents' files, written under `folder`."""
    return [w.path for w in write_claude_session(folder, generate_claude_session(seed, turns))]


def lines_of(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a transcript, one per line."""
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


@dataclass(frozen=True)
class SourceCounts:
    """What a transcript's lines hold, counted the way the format defines it."""

    responses: int  # distinct message.id of assistant lines on the chain
    results: int  # tool_result blocks
    prompts: int  # user lines that are the user's turns
    meta: int  # injected user lines
    calls: dict[str, str]  # tool_use id -> tool name
    result_bytes: int  # UTF-8 bytes of the tool results' text
    compactions: int
    attachments: int = 0  # attachment lines with `rendered` text (the model is sent them)
    usages: dict[str, dict[str, int]] | None = None  # message.id -> the lines' usage


def _on_chain(line: dict[str, Any]) -> bool:
    if not isinstance(line.get("uuid"), str):
        return False
    return not (line.get("isSidechain") is True and not line.get("agentId"))


def source_counts(lines: list[dict[str, Any]]) -> SourceCounts:
    """Count a transcript's messages from its lines."""
    responses: set[str] = set()
    results = prompts = meta = compactions = result_bytes = attachments = 0
    calls: dict[str, str] = {}
    usages: dict[str, dict[str, int]] = {}
    for line in lines:
        if not _on_chain(line):
            continue
        message = line.get("message")
        if line["type"] == "attachment":
            rendered = line.get("rendered")
            attachments += bool(rendered) and any("content" in part for part in rendered)
        elif line["type"] == "assistant":
            responses.add(message["id"])
            usages[message["id"]] = message["usage"]
            for block in message["content"]:
                if block.get("type") == "tool_use":
                    calls[block["id"]] = block["name"]
        elif line["type"] == "user":
            content = message["content"]
            if line.get("isCompactSummary"):
                compactions += 1
                continue
            blocks = content if isinstance(content, list) else []
            found = [b for b in blocks if b.get("type") == "tool_result"]
            if found:
                results += len(found)
                for block in found:
                    body = block["content"]
                    text = body if isinstance(body, str) else "\n".join(b["text"] for b in body)
                    result_bytes += len(text.encode())
                continue
            text = content if isinstance(content, str) else ""
            if line.get("isMeta") or INJECTED.match(text):
                meta += 1
            else:
                prompts += 1
    return SourceCounts(
        len(responses),
        results,
        prompts,
        meta,
        calls,
        result_bytes,
        compactions,
        attachments,
        usages,
    )
