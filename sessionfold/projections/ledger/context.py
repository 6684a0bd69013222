"""What one pass knows: the messages it offers, the rules in the state, the ids it may cite."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sessionfold.projections.ledger.text import Region, quotable_regions


@dataclass(frozen=True, slots=True)
class OfferedMessage:
    """A user message the pass labels: its whole text and where the user's own words stand."""

    id: str  # u<n>
    entry: str | None
    seq: int
    text: str
    regions: tuple[Region, ...]

    @property
    def quotable_chars(self) -> int:
        """How long the user's own words are (the objective alone in a /goal message)."""
        return sum(end - start for start, end in self.regions)

    def region_of(self, start: int, end: int) -> Region | None:
        """The quotable region that holds text[start:end], if one does."""
        for region in self.regions:
            if region[0] <= start and end <= region[1]:
                return region
        return None

    def whole(self) -> Region | None:
        """The region a whole-message rule records: the longest quotable region."""
        return max(self.regions, key=lambda r: r[1] - r[0], default=None)


@dataclass(frozen=True, slots=True)
class StateRule:
    """A rule already in the state."""

    id: str
    words: str
    u: str
    lifted: bool
    replaced_by: str | None


@dataclass(slots=True)
class PassContext:
    """Everything verification and the prompt read, built once from a pass request."""

    request: str
    session: str
    span: int
    seq: int
    trigger: str
    entry: str | None
    messages: dict[str, OfferedMessage]
    rules: dict[str, StateRule]
    counters: dict[str, int]
    bounds: dict[str, list[int]]
    state: dict[str, Any]
    turns: dict[str, str] = field(default_factory=dict)  # id -> text a value may stand in
    known: set[str] = field(default_factory=set)  # ids evidence may cite

    @classmethod
    def from_request(cls, request: dict[str, Any]) -> PassContext:
        """Build the context of a pass request the fold emitted."""
        state = request["state"]
        messages = {
            row["id"]: OfferedMessage(
                row["id"],
                row.get("entry"),
                int(row.get("seq", 0)),
                row["text"],
                tuple(quotable_regions(row["text"])),
            )
            for row in sorted(request.get("offered", []), key=lambda r: r.get("seq", 0))
        }
        rules = {
            row["id"]: StateRule(
                row["id"],
                row["words"],
                row["u"],
                bool(row.get("lifted")),
                (row.get("lifted") or {}).get("replacedBy"),
            )
            for row in state.get("rules", [])
        }
        turns = {m.id: m.text for m in messages.values()}
        for command in state.get("commands", []):
            turns[command["id"]] = f"{command.get('command', '')}\n{command.get('excerpt', '')}"
        for error in state.get("errors", []):
            turns[error["id"]] = error.get("head", "")
        known = set(turns) | set(rules)
        for kind in ("decisions", "deadEnds", "values"):
            known |= {row["id"] for row in state.get(kind, [])}
        return cls(
            request=request["request"],
            session=request["session"],
            span=int(request["span"]),
            seq=int(request["seq"]),
            trigger=request.get("trigger", "compact-request"),
            entry=request.get("entry"),
            messages=messages,
            rules=rules,
            counters=dict(request.get("counters", {})),
            bounds={k: list(v) for k, v in request.get("bounds", {}).items()},
            state=state,
            turns=turns,
            known=known,
        )

    def in_force(self) -> list[StateRule]:
        """Rules of the state not lifted, oldest first."""
        return [rule for rule in self.rules.values() if not rule.lifted]

    def span_rows(self, kind: str) -> list[dict[str, Any]]:
        """The state's commands ("C") or errors ("E") that belong to this span."""
        first, last = self.bounds.get(kind, [1, 0])
        name = "commands" if kind == "C" else "errors"
        return [row for row in self.state.get(name, []) if first <= int(row["id"][1:]) <= last]
