"""The model port and the offline summarizer.

`ModelPort.summarize` takes one flush request and returns its compaction: for each batch the
request sends to the model, a final summary text citing the batch's `tN` refs and ending with
the footer of reference §6.4 (or a failure); batches the fold already skipped are echoed as
skips. `OfflineSummarizer` is deterministic and needs no network: one honest bullet per call.
The prompt serialization (§6.1) and the inline-ref substitution (§6.4) are here for model ports
that call a real model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Protocol

from sessionfold.events.envelope import PRUNING_PRODUCER
from sessionfold.events.flush import (
    BatchResult,
    CompactionPayload,
    FlushBatch,
    FlushCall,
    FlushRequestPayload,
    ModelUsage,
)
from sessionfold.projections.ledger.commands import failure_line, is_shell_tool
from sessionfold.projections.pruning.capture import js_length
from sessionfold.projections.text_lines import line_at

# --- shared text formats ---------------------------------------------------------------------

BATCH_INSTRUCTIONS = (
    "Summarize this batch of tool calls made by an AI coding assistant. For each call give the "
    "tool name and a one-sentence description, the key outcome with file paths, identifiers, "
    "signatures and error strings copied verbatim, and any findings worth remembering. Use 1-3 "
    "bullets per call and skip calls that succeeded with nothing reusable. Be concise. Begin the "
    "first bullet of each call with that call's [[N:toolname]] label copied verbatim and plain "
    "(no bold, backticks or numbering); never renumber, rename or invent labels; if you skip a "
    "call, skip its label."
)

_LEADING_LABEL = re.compile(r"^(\s*(?:[-*] )?)\[\[(\d+):([^\]\n]*)\]\]\s*")
_ANY_LABEL = re.compile(r"\[\[\d+:[^\]\n]*\]\]\s*")


def batch_prompt(batch: FlushBatch) -> str:
    """The single user message asking a model to summarize one batch (reference §6.1)."""
    parts = []
    for number, call in enumerate(batch.calls, start=1):
        args = json.dumps(call.arguments, indent=2, ensure_ascii=False)
        status = "ERROR" if call.is_error else "OK"
        tail = f" ...[{call.truncated_chars} chars truncated]" if call.truncated_chars > 0 else ""
        parts.append(
            f"[[{number}:{call.tool_name}]] Tool: {call.tool_name}({args})\n"
            f"Result ({status}): {call.head}{tail}"
        )
    said = f"Assistant said: {batch.assistant_text}\n" if batch.assistant_text else ""
    body = said + "\n---\n".join(parts)
    return f"{BATCH_INSTRUCTIONS}\n\n<tool-call-batch>\n{body}\n</tool-call-batch>"


def substitute_inline_refs(text: str, refs: Sequence[str], tool_names: Sequence[str]) -> str:
    """Replace line-leading `[[N:name]]` labels by `tN` refs; strip every other label (§6.4)."""
    lines = []
    fenced = False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append(line)
            continue
        if fenced:
            lines.append(line)
            continue
        lines.append(_ANY_LABEL.sub("", _LEADING_LABEL.sub(_label_sub(refs, tool_names), line)))
    return "\n".join(lines)


def _label_sub(refs: Sequence[str], tool_names: Sequence[str]):
    def replace(match: re.Match[str]) -> str:
        number = int(match.group(2))
        named = match.group(3).strip().lower()
        if 1 <= number <= len(refs) and named == tool_names[number - 1].strip().lower():
            return f"{match.group(1)}`{refs[number - 1]}` "
        return match.group(1)

    return replace


def summary_footer(refs: Sequence[str]) -> str:
    """The footer every kept summary ends with (reference §6.4 step 2)."""
    listed = ", ".join(f"`{ref}`" for ref in refs)
    return (
        f"\n\n---\n**Summarized tool refs**: {listed}\n"
        "Use `context_tree_query` with these refs to retrieve the original full outputs."
    )


# --- the port --------------------------------------------------------------------------------


class ModelPort(Protocol):
    """Every model call the pipeline makes goes through one of these."""

    def summarize(self, request: FlushRequestPayload) -> CompactionPayload:
        """Answer a flush request with one compaction."""
        ...


class OfflineSummarizer:
    """Deterministic, networkless summaries: one bullet per call, never longer than the output."""

    model = "offline"

    def summarize(self, request: FlushRequestPayload) -> CompactionPayload:
        """Summarize every batch the request sends to the model; echo the fold's skips."""
        results = []
        for number, batch in enumerate(request.batches):
            if batch.disposition != "summarize":
                results.append(BatchResult(batch=number, outcome=batch.disposition))
                continue
            refs = tuple(call.ref or call.tool_call_id for call in batch.calls)
            results.append(
                BatchResult(
                    batch=number,
                    outcome="summarized",
                    text=offline_summary(batch.calls, refs),
                    refs=refs,
                    usage=ModelUsage(calls=1),
                )
            )
        usage = ModelUsage(calls=sum(r.usage.calls for r in results))
        return CompactionPayload(
            request_id=request.request_id,
            session_id=request.session_id,
            model=self.model,
            results=tuple(results),
            usage=usage,
        )

    def summarize_document(self, request: FlushRequestPayload) -> dict[str, Any]:
        """`self.summarize(request).model_dump(mode="json")`, built as that dict itself: the
        answer is only ever sent, and its models' validation and dump cost as much as the
        summaries' text (the same keys, in the same order, as the dump's)."""
        results = []
        for number, batch in enumerate(request.batches):
            if batch.disposition != "summarize":
                results.append(_result_document(number, batch.disposition, None, [], 0))
                continue
            refs = tuple(call.ref or call.tool_call_id for call in batch.calls)
            text = offline_summary(batch.calls, refs)
            results.append(_result_document(number, "summarized", text, list(refs), 1))
        return {
            "producer": PRUNING_PRODUCER,
            "request_id": request.request_id,
            "session_id": request.session_id,
            "model": self.model,
            "results": results,
            "usage": _usage_document(sum(r["usage"]["calls"] for r in results)),
            "error": None,
        }


def _usage_document(calls: int) -> dict[str, Any]:
    """`ModelUsage(calls=calls).model_dump(mode="json")`."""
    return {
        "input_tokens": 0,
        "output_tokens": 0,
        "cost": 0.0,
        "calls": calls,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }


def _result_document(
    batch: int, outcome: str, text: str | None, refs: list[str], calls: int
) -> dict[str, Any]:
    """`BatchResult(...).model_dump(mode="json")` of an offline result (no error)."""
    return {
        "batch": batch,
        "outcome": outcome,
        "text": text,
        "refs": refs,
        "usage": _usage_document(calls),
        "error": None,
    }


# --- the offline summary ---------------------------------------------------------------------

_ERROR_WORDS = (
    "error",
    "failed",
    "failure",
    "exception",
    "traceback",
    "fatal",
    "cannot",
    "not found",
    "denied",
)
_ERROR_WORDS_BYTES = tuple(word.encode("ascii") for word in _ERROR_WORDS)
_ERROR_LINE = re.compile("|".join(_ERROR_WORDS), re.IGNORECASE)
#: The non-ASCII letters re.I equates with ASCII ones (dotted and dotless i, long s, Kelvin
#: sign; the tests ask `re` for them).
_ASCII_FOLDS = ("\u0130", "\u0131", "\u017f", "\u212a")
_PRINTED_PATH = re.compile(r"(?<![\w/.-])(?:\.{1,2}/|/)?(?:[\w.@-]+/)+[\w.@-]+\.[A-Za-z]\w*")
#: Every character a `_PRINTED_PATH` match can hold, as maximal runs.
_PATH_RUN = re.compile(r"[\w.@/-]*")
#: Runs with a slash `_printed_path` searches one by one before it searches the rest whole.
_PATH_RUNS_TRIED = 8
_PATH_TOOLS = frozenset({"read", "write", "edit", "ls", "find", "grep"})
#: More than an error line shows (`_clip` cuts it to 120): the line is read whole first.
_ERROR_LINE_CHARS = 1000
_GIST_KEYS = ("path", "command", "pattern", "query", "url", "file", "cmd")


def offline_summary(calls: Sequence[FlushCall], refs: Sequence[str]) -> str:
    """Bullets plus footer, at the most detail that keeps the text within the raw output."""
    raw = sum(call.raw_chars for call in calls)
    footer = summary_footer(refs)
    text = ""
    for detail in (2, 1, 0):
        bullets = "\n".join(
            _bullet(call, ref, detail) for call, ref in zip(calls, refs, strict=True)
        )
        text = bullets + footer
        if js_length(text) <= raw:
            return text
    return text  # smaller than any honest summary: the fold will discard it as oversized


def _bullet(call: FlushCall, ref: str, detail: int) -> str:
    """One call: tool, argument gist, outcome, and (most detail) an error line or printed path."""
    outcome = "error" if call.is_error else "ok"
    if detail == 0:
        return f"- `{ref}` {call.tool_name}: {outcome}"
    gist = _argument_gist(call)
    line = (
        f"- `{ref}` {call.tool_name}{f' {gist}' if gist else ''}: {outcome}, {call.raw_chars} chars"
    )
    if detail == 1:
        return line
    evidence = _evidence(call)
    return f"{line}; {evidence}" if evidence else line


def _argument_gist(call: FlushCall) -> str:
    for name in _GIST_KEYS:
        value = call.arguments.get(name)
        if isinstance(value, str) and value.strip():
            return f"`{_clip(value.strip().splitlines()[0], 80)}`"
    keys = [k for k in call.arguments if isinstance(k, str)]
    return f"({', '.join(keys[:4])})" if keys else ""


def _evidence(call: FlushCall) -> str:
    """A failed call's failure line, read as the ledger reads its error (`failure_line`: a
    shell's from the end of what it printed, `FAILED test_io.py::test_read` before a
    banner); a call that worked, the first error line it printed; else (for tools not named
    by path) a path it printed."""
    if call.is_error:
        shell = is_shell_tool(call.tool_name)
        error: str | None = failure_line(call.head, _ERROR_LINE_CHARS, shell=shell) or None
    else:
        error = _first_error_line(call.head)
    if error is not None:
        return f"error line: `{_clip(error, 120)}`"
    if call.tool_name in _PATH_TOOLS:
        return ""
    found = _printed_path(call.head)
    return f"printed `{_clip(found, 100)}`" if found else ""


def _printed_path(text: str) -> str | None:
    """`_PRINTED_PATH`'s first match in `text`, looked for only around its slashes.

    A match is made of path characters alone (`_PATH_RUN`) and holds a slash, so it lies in
    one maximal run of them that holds a slash, and the first match is in the first such run
    that has one. The pattern tried at every character of an output that prints no path
    costs several times a `find` per slash and a search of each run; after `_PATH_RUNS_TRIED`
    runs without one, the rest of the text is searched whole (never slower than that).
    """
    at = text.find("/")
    if at < 0:
        return None
    size = len(text)
    reverse = text[::-1]  # a run's start is where the run read backwards from a slash ends
    for _ in range(_PATH_RUNS_TRIED):
        start = size - _PATH_RUN.match(reverse, size - at).end()
        end = _PATH_RUN.match(text, at).end()
        found = _PRINTED_PATH.search(text, start, end)
        if found is not None:
            return found.group(0)
        at = text.find("/", end)
        if at < 0:
            return None
    start = size - _PATH_RUN.match(reverse, size - at).end()
    found = _PRINTED_PATH.search(text, start)
    return None if found is None else found.group(0)


def _first_error_line(text: str) -> str | None:
    """The first line of `text` that `_ERROR_LINE` matches, stripped; None if none does.

    No match spans a line break, so the line that holds the first match in the whole text is
    that line. In text without the non-ASCII letters re.I equates with ASCII ones
    (`_ASCII_FOLDS`), the first match starts where the first of the pattern's words does in
    the text with its ASCII letters lower-cased and every other character made a "?" (one
    byte each: the offsets stay the text's): a few `find`s instead of the pattern tried at
    every character.
    """
    if text.isascii() or not any(map(text.__contains__, _ASCII_FOLDS)):
        lowered = text.encode("ascii", "replace").lower()
        # Each word is looked for only before the earliest one found so far (no word is
        # another's prefix, so two never start at one place).
        at = size = len(lowered)
        for word in _ERROR_WORDS_BYTES:
            found = lowered.find(word, 0, at + len(word) - 1)
            if found >= 0:
                at = found
        if at == size:
            return None
    else:
        match = _ERROR_LINE.search(text)
        if match is None:
            return None
        at = match.start()
    return line_at(text, at).strip()


def _clip(text: str, limit: int) -> str:
    text = text.replace("`", "'")
    return text if len(text) <= limit else text[: limit - 1] + "…"
