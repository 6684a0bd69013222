"""`python -m sessionfold.streams.cli mcp ...` spawned on stdio and spoken to with the MCP SDK's
client: it lists its two read-only tools, recalls by ref (paged), refuses another session's
call and bad arguments as tool errors, and goes on answering after them."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.views.recall import recall_text
from sessionfold.streams.tools.replay import Collector, replay_files
from sessionfold.streams.tools.synthetic import generate_session, write_session

REPO = Path(__file__).resolve().parents[2]


def _text(result: Any) -> str:
    return "".join(block.text for block in result.content if block.type == "text")


async def _talk(path: Path, refs: list[str]) -> dict[str, Any]:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    env = {
        "PYTHONPATH": str(REPO),
        "PATH": os.environ.get("PATH", ""),
        "SESSIONFOLD_SERVE_URL": "http://127.0.0.1:9",  # nothing listens: the file is folded
    }
    args = ["-m", "sessionfold.streams.cli", "mcp", "codex", "--session-file", str(path)]
    server = StdioServerParameters(command=sys.executable, args=args, env=env, cwd=REPO)
    seen: dict[str, Any] = {}
    with open(os.devnull, "w") as errlog:
        async with (
            stdio_client(server, errlog=errlog) as (read, write),
            ClientSession(read, write) as client,
        ):
            await client.initialize()
            seen["tools"] = (await client.list_tools()).tools
            seen["whole"] = await client.call_tool("context_tree_query", {"toolCallIds": refs})
            pages, offset = [], 0
            while offset is not None:
                answer = await client.call_tool(
                    "context_tree_query", {"toolCallIds": refs, "offset": offset, "limit": 500}
                )
                body, _, note = _text(answer).rpartition("\n\n[Page: ")
                pages.append(body)
                offset = (
                    int(note.rpartition("offset=")[2].rstrip(".]")) if "offset=" in note else None
                )
            seen["pages"] = pages
            seen["foreign"] = await client.call_tool(
                "context_tree_query", {"toolCallIds": refs}, meta={"sessionId": "someone-else"}
            )
            seen["bad"] = await client.call_tool("context_tree_query", {"toolCallIds": []})
            seen["two"] = await client.call_tool(
                "ledger", {"session_id": "one-session"}, meta={"sessionId": "another-session"}
            )
            seen["ledger"] = await client.call_tool("ledger", {})
            seen["after"] = await client.call_tool("context_tree_query", {"toolCallIds": refs})
    return seen


def test_the_server_over_stdio(tmp_path: Path) -> None:
    """Tools listed read-only; a recall whole and in pages equal to the fold's text; another
    session's call and an empty id list are tool errors naming why; the server goes on."""
    pytest.importorskip("mcp")
    path = write_session(tmp_path, generate_session(5, 60)).path
    session_id = orjson.loads(path.read_bytes().splitlines()[0])["id"]
    collector = Collector(session_id)
    replayer = replay_files([path], DEFAULT_CONFIG, [session_id], on_folded=collector)
    store = replayer.runtime.store
    prefix = f"{session_id}/pr/i/"
    refs = [v["ref"] for k, v in store.items() if k.startswith(prefix) and v.get("ref")][:4]
    log = {item.seq: item.entry for item in collector.entries}
    expected, found = recall_text(store, session_id, refs, log.get, whole=True)
    assert found == len(refs) and len(expected) > 1000

    seen = asyncio.run(_talk(path, refs))

    tools = {tool.name: tool for tool in seen["tools"]}
    assert set(tools) == {"context_tree_query", "ledger"}
    assert all(tool.annotations.read_only_hint for tool in tools.values())
    assert "toolCallIds" in tools["context_tree_query"].input_schema["properties"]
    assert not seen["whole"].is_error and _text(seen["whole"]) == expected
    assert len(seen["pages"]) > 2 and "".join(seen["pages"]) == expected
    assert seen["foreign"].is_error and "not this agent's session" in _text(seen["foreign"])
    assert seen["bad"].is_error and "toolCallIds" in _text(seen["bad"])
    assert seen["two"].is_error and "not this agent's session" in _text(seen["two"])
    assert not seen["ledger"].is_error and _text(seen["ledger"])
    assert _text(seen["after"]) == expected
