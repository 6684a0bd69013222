"""The prompt data one diff call gets, and its text form for models that read text."""

from __future__ import annotations

import json
from typing import Any

from sessionfold.ports.ledger.context import PassContext
from sessionfold.ports.ledger.verify import Question
from sessionfold.projections.ledger.text import clip, quotable_text

INSTRUCTIONS = """\
You keep a ledger of a coding session. Answer with one JSON object:
{"labels": [{"message": "u<n>", "label": "...", "words": "..."}],
 "decisions": [{"text": "...", "evidence": ["C<n>", "E<n>", "u<n>"]}],
 "deadEnds": [{"text": "...", "evidence": [...]}],
 "values": [{"value": "...", "turn": "u<n>|C<n>|E<n>", "what": "..."}],
 "narrative": "one line: what this span did", "now": "where the work stands"}
Label every user message: `rule` (a standing rule over later work), `not a rule`,
`lifts R<n>` (it withdraws a rule; `lifts u<n>` for a rule given earlier in this span) or
`rule and lifts R<n>` (a new rule that replaces or narrows one). A description of what is being
built is not a rule unless the user states it as standing over later work. A permission is a
one-off: only a message that says a rule no longer holds lifts it. For a message over 600
characters give the rule's exact words in "words", whole words, copied from the message.
In a /goal message only the objective is the user's. Name a value only with the turn that
shows it verbatim. Evidence ids must be ids listed here."""

TAKEOVER = (
    "Another compactor (pi's own or an extension's) summarized the conversation before this\n"
    "pass; its summary is shown, head and tail. Carry forward what it still holds: decisions\n"
    "and dead ends (evidence: ids listed here), and each value it records (a measurement, a\n"
    "hash, a port) named with the turn listed here that shows it verbatim; a value no listed\n"
    "turn shows is dropped. A summary paraphrases, so the user's own messages decide the\n"
    "rules: a message marked [standing] reads as a standing rule and is recorded as written\n"
    "unless you label it `not a rule` (a one-off: a request, an answer or a question); label\n"
    "it `rule and lifts u<n>` when it replaces an earlier rule. Label every other message as\n"
    "usual; a withdrawal of an earlier message's rule is `lifts u<n>`."
)


def build_prompt(
    context: PassContext,
    *,
    excerpt_chars: int = 240,
    note: str | None = None,
    questions: list[Question] | None = None,
    span_rules: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """The prompt data of one diff call: the span's messages, the state's rules, the ledger.

    `span_rules` are (u<n>, words) of rules earlier chunks of this span accepted: a later
    chunk may lift them by their u<n>.
    """
    messages = []
    for message in context.messages.values():
        own = quotable_text(message.text)
        item: dict[str, Any] = {
            "id": message.id,
            "entry": message.entry,
            "chars": message.quotable_chars,
            "excerpt": clip(own, excerpt_chars),
            "text": message.text,
        }
        if context.is_earlier(message):
            item["earlier"] = True
        if message.id in context.standing:
            item["standing"] = True
        messages.append(item)
    prompt: dict[str, Any] = {
        "instructions": INSTRUCTIONS,
        "span": context.span,
        "messages": messages,
        "rules": [{"id": r.id, "from": r.u, "words": r.words} for r in context.in_force()]
        + [{"id": u, "from": u, "words": words} for u, words in span_rules or []],
        "commands": [
            {
                "id": row["id"],
                "command": clip(row.get("command") or "", 200),
                "exit": row.get("exit"),
                "status": row.get("status"),
                "error": row.get("error"),
                "output": row.get("excerpt") or "",
                "values": [list(v) for v in row.get("values") or []],
            }
            for row in context.span_rows("C")
        ],
        "errors": [
            {
                "id": row["id"],
                "tool": row.get("tool"),
                "command": row.get("command"),
                "head": row.get("head"),
            }
            for row in context.span_rows("E")
        ],
        "world": context.state.get("world"),
        "now": context.state.get("now"),
    }
    if context.earlier is not None:
        earlier = context.earlier
        prompt["earlier"] = {
            "entry": earlier.get("entry"),
            "chars": earlier.get("chars", 0),
            "head": earlier.get("head", ""),
            "tail": earlier.get("tail", ""),
        }
    if context.chunk[1] > 1:
        prompt["chunk"] = {"index": context.chunk[0], "of": context.chunk[1]}
    if note:
        prompt["retryNote"] = note
    if questions:
        prompt["questions"] = [
            {
                "message": q.message,
                "kind": q.kind,
                "target": q.target,
                "allowed": list(q.allowed),
                "text": q.text,
            }
            for q in questions
        ]
    return prompt


def prompt_text(prompt: dict[str, Any]) -> str:
    """The prompt as text: instructions, the label list (each message whole up to its excerpt),
    the conversation's user messages whole, the rules, the ledger, notes and questions."""
    title = f"# Span {prompt['span']}"
    if prompt.get("chunk"):
        chunk = prompt["chunk"]
        title += (
            f" (part {chunk['index']} of {chunk['of']}: label only the messages listed here; "
            "the others are asked in other calls)"
        )
    parts = [prompt["instructions"], "", title, "## Messages to label"]
    parts += [
        f"- {m['id']} ({m['chars']} chars){' [standing]' if m.get('standing') else ''}: "
        f"{m['excerpt']}"
        for m in prompt["messages"]
    ]
    parts.append("## User messages, whole")
    parts += [f"### {m['id']}\n{m['text']}" for m in prompt["messages"]]
    parts.append("## Rules in force")
    parts += [f"- {r['id']} (from {r['from']}): {json.dumps(r['words'])}" for r in prompt["rules"]]
    parts.append("## Commands")
    for c in prompt["commands"]:
        parts.append(f"- {c['id']} {c['status']} {c['exit']}: {c['command']}")
        output = " ".join(str(c.get("output") or "").split())
        if output:
            # The output's start and end, where a value a later turn needs usually stands.
            if len(output) > 300:
                output = output[:150] + " … " + output[-150:]
            parts.append(f"  output: {output}")
        if c.get("values"):
            parts.append("  values: " + "; ".join(f"{v} ({what})" for v, what in c["values"]))
    parts.append("## Errors")
    parts += [f"- {e['id']} ({e['tool']}, {e['command']}): {e['head']}" for e in prompt["errors"]]
    if prompt.get("world"):
        parts += ["## World", json.dumps(prompt["world"], sort_keys=True)]
    if prompt.get("earlier"):
        earlier = prompt["earlier"]
        parts += [
            f"## The earlier compactor's summary (entry {earlier['entry']}, "
            f"{earlier['chars']} chars, head and tail)",
            TAKEOVER,
            "### Head",
            earlier["head"],
        ]
        if earlier["tail"]:
            parts += ["### Tail", earlier["tail"]]
    if prompt.get("retryNote"):
        parts += ["## Fix these and answer again in full", prompt["retryNote"]]
    if prompt.get("questions"):
        parts.append("## Questions (answer only these messages' labels)")
        parts += [f"- {q['text']}" for q in prompt["questions"]]
    return "\n".join(parts)


def fit_whole(items: list[str], limit: int) -> list[str]:
    """The items that fit in `limit` characters, each whole or not at all, in order."""
    kept, used = [], 0
    for item in items:
        if used + len(item) + 1 > limit:
            continue
        kept.append(item)
        used += len(item) + 1
    return kept
