"""Codex's trust of the hook install wrote, recorded the way Codex records it.

Codex 0.169 runs a hook only once the user has trusted it: it keeps, per hook, the hash of the
hook as it was reviewed (`[hooks.state."<key>"] trusted_hash = "sha256:..."` in config.toml)
and skips a hook whose current hash has none. The key and the hash are Codex's own: install asks
Codex for them (`codex app-server`, JSON-RPC over stdio: `initialize`, `initialized`,
`hooks/list`) rather than computing them, and writes the hash through the same recorded TOML
edit as everything else, so `--uninstall` takes it out again.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sessionfold.streams.tools.install.changes import SetKey

#: How long install waits for Codex's answer, seconds (it answers in well under one here).
TIMEOUT_S = 20.0


class CodexUnavailable(RuntimeError):
    """Codex could not be asked (not found, exited, no answer in time, an error answer)."""


def hook_list(codex: str, env: Mapping[str, str], cwd: Path) -> dict[str, Any]:
    """Codex's `hooks/list` answer for `cwd` (its hooks, each with key, command, source path,
    current hash and trust status)."""
    try:
        process = subprocess.Popen(
            [codex, "app-server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=dict(env),
            cwd=cwd,
        )
    except OSError as error:
        raise CodexUnavailable(type(error).__name__) from None
    assert process.stdin is not None and process.stdout is not None
    try:
        hello = {"clientInfo": {"name": "sessionfold", "version": "0"}}
        requests = [
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello},
            {"jsonrpc": "2.0", "method": "initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "hooks/list", "params": {"cwds": [str(cwd)]}},
        ]
        process.stdin.write(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
        process.stdin.flush()
        return _answer(process.stdout.fileno(), 2)
    except OSError as error:
        raise CodexUnavailable(type(error).__name__) from None
    finally:
        process.kill()
        process.wait()


def _answer(fd: int, request_id: int) -> dict[str, Any]:
    """The result of request `request_id`, read from Codex's stdout within `TIMEOUT_S`."""
    deadline = time.monotonic() + TIMEOUT_S
    buffer = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise CodexUnavailable("no answer in time")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            raise CodexUnavailable("codex app-server exited")
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict) and message.get("id") == request_id:
                if not isinstance(message.get("result"), dict):
                    raise CodexUnavailable("an error answer")
                result: dict[str, Any] = message["result"]
                return result


def trust_edits(listing: Mapping[str, Any], hooks_file: Path, command: str) -> list[SetKey]:
    """The edits that record Codex's trust of each hook `hooks_file` holds with `command` and
    that Codex does not trust yet (none: all trusted already)."""
    edits = []
    for entry in listing.get("data") or []:
        for hook in entry.get("hooks") or []:
            ours = hook.get("sourcePath") == str(hooks_file) and hook.get("command") == command
            key, digest = hook.get("key"), hook.get("currentHash")
            if ours and hook.get("trustStatus") != "trusted" and key and digest:
                edits.append(SetKey(("hooks", "state", str(key), "trusted_hash"), str(digest)))
    return edits
