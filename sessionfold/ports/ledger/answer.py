"""The diff answer a model returns: its schema, and the shape slips code repairs first.

Shape slips that say nothing about content (`null` for an absent optional, an omitted empty
list, one item where a list belongs, `{"u3": "rule"}` for a label list, `Rule` for `rule`) are
normalized before the schema check; every list and item is bounded by the schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class AnswerError(ValueError):
    """An answer that is not usable as a whole; the message names the defect, never content."""


class _Item(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class LabelItem(_Item):
    """A label for one user message, with the rule's exact words when it gives them."""

    message: str = Field(max_length=16)
    label: str = Field(max_length=200)
    words: str | None = Field(default=None, max_length=4_000)


class NoteItem(_Item):
    """A decision or a dead end, with the ledger ids that back it."""

    text: str = Field(min_length=1, max_length=400)
    evidence: list[str] = Field(default_factory=list, max_length=12)


class ValueItem(_Item):
    """A value a later turn may need, with the turn it came from."""

    value: str = Field(min_length=1, max_length=200)
    turn: str = Field(max_length=16)
    what: str = Field(default="", max_length=120)


class Answer(_Item):
    """A whole diff answer."""

    labels: list[LabelItem] = Field(default_factory=list, max_length=400)
    decisions: list[NoteItem] = Field(default_factory=list, max_length=20)
    deadEnds: list[NoteItem] = Field(default_factory=list, max_length=20)
    values: list[ValueItem] = Field(default_factory=list, max_length=20)
    narrative: str = Field(default="", max_length=400)
    now: str = Field(default="", max_length=800)


_ALIASES = {
    "dead_ends": "deadEnds",
    "deadends": "deadEnds",
    "dead ends": "deadEnds",
    "Labels": "labels",
    "Decisions": "decisions",
    "Narrative": "narrative",
    "Now": "now",
}
_LABEL_ALIASES = {"id": "message", "msg": "message", "user": "message", "quote": "words"}
_ID = re.compile(r"^\s*([RrUu])\s*(\d+)\s*$")
_TARGET = r"(?:[Rr]\d+|[Uu]\d+)"
_TARGETS = rf"{_TARGET}(?:\s*(?:,|and|&)\s*{_TARGET})*"
_LABEL = re.compile(
    rf"^(?:(?P<rule>rule)|(?P<not>not[\s_-]*a[\s_-]*rule)|lifts?\s+(?P<lifts>{_TARGETS})"
    rf"|rule\s+and\s+lifts?\s+(?P<both>{_TARGETS}))$",
    re.I,
)


def canonical_id(value: str) -> str:
    """`r3` -> `R3`, `U7` -> `u7`; anything else unchanged."""
    match = _ID.match(value)
    if not match:
        return value.strip()
    return ("R" if match.group(1) in "Rr" else "u") + match.group(2)


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list):
        return value
    return [value]


def _evidence(value: Any) -> list[str]:
    if isinstance(value, str):
        value = re.split(r"[\s,;]+", value)
    return [canonical_id(str(item)) for item in _as_list(value) if str(item).strip()]


def _labels(value: Any) -> list[Any]:
    if isinstance(value, dict):  # {"u3": "rule"} or {"u3": {"label": ..., "words": ...}}
        items = []
        for message, body in value.items():
            item = dict(body) if isinstance(body, dict) else {"label": body}
            items.append({"message": message, **item})
        value = items
    labels = []
    for item in _as_list(value):
        if isinstance(item, dict):
            item = {_LABEL_ALIASES.get(k, k): v for k, v in item.items() if v is not None}
            if isinstance(item.get("message"), str):
                item["message"] = canonical_id(item["message"])
            if isinstance(item.get("label"), str):
                item["label"] = " ".join(item["label"].split())
            if isinstance(item.get("words"), str):
                item["words"] = item["words"].strip() or None
                if item["words"] is None:
                    del item["words"]
        labels.append(item)
    return labels


def normalize(raw: Any) -> dict[str, Any]:
    """Repair shape slips in a parsed answer; raise AnswerError when it is no JSON object."""
    if not isinstance(raw, dict):
        raise AnswerError(f"the answer is a JSON {type(raw).__name__}, not an object")
    answer: dict[str, Any] = {}
    for name, value in raw.items():
        name = _ALIASES.get(name, name)
        if value is None:
            continue  # null for an absent optional
        answer[name] = value
    answer["labels"] = _labels(answer.get("labels"))
    for name in ("decisions", "deadEnds"):
        notes = []
        for item in _as_list(answer.get(name)):
            if isinstance(item, str):
                item = {"text": item}
            if isinstance(item, dict):
                item = {k: v for k, v in item.items() if v is not None}
                item["evidence"] = _evidence(item.get("evidence"))
            notes.append(item)
        answer[name] = notes
    values = []
    for item in _as_list(answer.get("values")):
        if isinstance(item, dict):
            item = {k: v for k, v in item.items() if v is not None}
            if isinstance(item.get("turn"), str):
                item["turn"] = canonical_id(item["turn"])
            if isinstance(item.get("value"), int | float):
                item["value"] = str(item["value"])
        values.append(item)
    answer["values"] = values
    for name in ("narrative", "now"):
        if isinstance(answer.get(name), list):
            answer[name] = " ".join(str(part) for part in answer[name])
    return answer


def parse_answer(raw: Any) -> Answer:
    """Normalize, then schema-check an answer; AnswerError names what failed, not content."""
    try:
        return Answer.model_validate(normalize(raw))
    except ValidationError as exc:
        where = ", ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['type']}" for e in exc.errors()[:5]
        )
        raise AnswerError(f"the answer does not fit the schema ({where})") from None


@dataclass(frozen=True, slots=True)
class ParsedLabel:
    """A label read: is it a rule, and which rules (R<n>) or messages (u<n>) does it lift."""

    rule: bool
    lifts: tuple[str, ...]


def parse_label(label: str) -> ParsedLabel | None:
    """Read `rule`, `not a rule`, `lifts R1, u2` or `rule and lifts R1`; None if unreadable."""
    match = _LABEL.match(label.strip())
    if not match:
        return None
    if match.group("rule"):
        return ParsedLabel(True, ())
    if match.group("not"):
        return ParsedLabel(False, ())
    targets = match.group("lifts") or match.group("both")
    lifts = tuple(
        dict.fromkeys(canonical_id(t) for t in re.split(r"\s*(?:,|and|&)\s*", targets) if t)
    )
    return ParsedLabel(bool(match.group("both")), lifts)
