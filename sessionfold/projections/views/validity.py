"""What a provider accepts of a rendered context, and the repair that makes a context so.

Anthropic's Messages API and OpenAI's Responses API refuse a tool call without its result and a
result without its call. A pi context is valid when every `toolCall` of an assistant message is
answered exactly once by a `toolResult` in the run of results right after that message, and no
result stands anywhere else (any other role between a call and its result breaks the pair, as
the orphan sweep of reference §7.6 reads it). Assistant messages that ended in `error` or
`aborted` are dropped by pi-ai before sending, so their calls are not held to this; nor are
the calls of the last turn while nothing but their results follows them (still in flight).

`problems` says what breaks the rule (codes and ids, never text); `repaired` answers each
unanswered call with the placeholder result pi-ai itself writes for one ("No result provided",
an error), right after the results that did come, so what the model gets never depends on a
line the log lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sessionfold.projections.pruning.entry_facts import DROPPED_STOPS

#: The text of the result put in for a call the log has no result of (pi-ai's own words).
MISSING_RESULT = "No result provided"


@dataclass(frozen=True, slots=True)
class Problem:
    """One break of the pairing rule: `code` and the tool call id, never text."""

    code: str  # "call-without-result" | "result-without-call" | "result-twice"
    tool_call_id: str | None
    position: int  # index of the message it concerns


def _calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
    """(id, name) of each toolCall block of an assistant message pi-ai sends."""
    if message.get("stopReason") in DROPPED_STOPS:
        return []
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [
        (block["id"], block.get("name"))
        for block in content
        if isinstance(block, dict)
        and block.get("type") == "toolCall"
        and isinstance(block.get("id"), str)
    ]


def problems(messages: Sequence[Any]) -> list[Problem]:
    """Every break of the pairing rule in `messages`, in order (empty: a provider accepts it)."""
    found: list[Problem] = []
    open_calls: dict[str, bool] = {}  # the last assistant's call ids -> answered
    opened_at = -1

    def close() -> None:
        found.extend(
            Problem("call-without-result", call, opened_at)
            for call, done in open_calls.items()
            if not done
        )
        open_calls.clear()

    for position, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "toolResult":
            call = message.get("toolCallId")
            if not isinstance(call, str) or call not in open_calls:
                found.append(Problem("result-without-call", _str(call), position))
            elif open_calls[call]:
                found.append(Problem("result-twice", call, position))
            else:
                open_calls[call] = True
            continue
        close()
        if role == "assistant":
            open_calls.update((call, False) for call, _name in _calls(message))
            opened_at = position
    # The last turn's calls still open are in flight (the context of a point right after the
    # model asked for them), not lost: nothing after them says their results are missing.
    return found


def repaired(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Problem]]:
    """`messages` with a placeholder result after each call that has none, and those calls.

    The same list object comes back when every call is answered (the common case costs one
    pass and no copy). Results without a call are not touched: the orphan sweep removes them.
    """
    missing = [p for p in problems(messages) if p.code == "call-without-result"]
    if not missing:
        return messages, []
    by_turn: dict[int, list[str]] = {}
    for problem in missing:
        by_turn.setdefault(problem.position, []).append(str(problem.tool_call_id))
    out: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    for position, message in enumerate(messages):
        if pending and message.get("role") != "toolResult":
            out += pending
            pending = []
        out.append(message)
        calls = by_turn.get(position)
        if calls is not None:
            names = dict(_calls(message))
            pending = [_placeholder(call, names.get(call), message) for call in calls]
    return out + pending, missing


#: `details` of a placeholder result: tells it from a result the log holds.
_MARK = {"sessionfold": "missing-result"}


def _placeholder(call: str, name: Any, assistant: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {
        "role": "toolResult",
        "toolCallId": call,
        "toolName": name if isinstance(name, str) else "",
        "content": [{"type": "text", "text": MISSING_RESULT}],
        "details": dict(_MARK),
        "isError": True,
    }
    if isinstance(assistant.get("timestamp"), int):
        result["timestamp"] = assistant["timestamp"]
    return result


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None
