"""What one pass knows: the messages it offers, the rules in the state, the ids it may cite."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from sessionfold.ports.ledger.reading import standing_region_of
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
    # Taking over from another compactor: its compaction (entry, seq, summary head and tail),
    # and the messages before it that read as standing rules, with the region code records.
    earlier: dict[str, Any] | None = None
    standing: dict[str, Region] = field(default_factory=dict)
    chunk: tuple[int, int] = (1, 1)  # (index, of): which call of a chunked span this is
    # (after, upto] sequence numbers whose commands and errors a chunk's prompt shows
    window: tuple[float, float] = (-math.inf, math.inf)

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
            # What the ledger knows of the turn: the command, its output's head and tail, and
            # the values code read verbatim from the whole output.
            found = "\n".join(str(v[0]) for v in command.get("values") or [])
            turns[command["id"]] = (
                f"{command.get('command', '')}\n{command.get('excerpt', '')}\n{found}"
            )
        for error in state.get("errors", []):
            turns[error["id"]] = error.get("head", "")
        known = set(turns) | set(rules)
        for kind in ("decisions", "deadEnds", "values"):
            known |= {row["id"] for row in state.get(kind, [])}
        earlier = request.get("earlier") if isinstance(request.get("earlier"), dict) else None
        standing: dict[str, Region] = {}
        if earlier is not None:
            for message in messages.values():
                if message.seq < int(earlier.get("seq") or 0):
                    region = standing_region_of(message.text)
                    if region is not None:
                        standing[message.id] = region
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
            earlier=earlier,
            standing=standing,
        )

    def is_earlier(self, message: OfferedMessage) -> bool:
        """True for a message the earlier compactor's summary replaced (taking over)."""
        return self.earlier is not None and message.seq < int(self.earlier.get("seq") or 0)

    def in_force(self) -> list[StateRule]:
        """Rules of the state not lifted, oldest first."""
        return [rule for rule in self.rules.values() if not rule.lifted]

    def span_rows(self, kind: str) -> list[dict[str, Any]]:
        """The state's commands ("C") or errors ("E") that belong to this span (and chunk)."""
        first, last = self.bounds.get(kind, [1, 0])
        name = "commands" if kind == "C" else "errors"
        after, upto = self.window
        return [
            row
            for row in self.state.get(name, [])
            if first <= int(row["id"][1:]) <= last and after < int(row.get("seq", 0)) <= upto
        ]

    def chunks(self, chars: int, most: int) -> list[PassContext]:
        """The span as up to `most` contiguous chunks of about `chars` message characters.

        One chunk (this context) when the messages fit. Otherwise the fewest chunks that fit,
        at most `most`, cut where the running size crosses an even share, so no chunk is
        empty and each is about as large as the others. A chunk's prompt shows the commands
        and errors that ran up to its last message (the last chunk: all that remain).
        """
        messages = list(self.messages.values())
        sizes = [len(m.text) + 80 for m in messages]  # 80: a message's id line and excerpt
        total = sum(sizes)
        count = min(most, len(messages), math.ceil(total / max(chars, 1)))
        if count <= 1:
            return [self]
        share = total / count
        groups: list[list[OfferedMessage]] = [[] for _ in range(count)]
        running = 0
        for message, size in zip(messages, sizes, strict=True):
            middle = running + size / 2
            groups[min(count - 1, int(middle // share))].append(message)
            running += size
        groups = [group for group in groups if group]
        views = []
        after: float = -math.inf
        for index, group in enumerate(groups, start=1):
            upto = math.inf if index == len(groups) else float(group[-1].seq)
            views.append(
                replace(
                    self,
                    messages={m.id: m for m in group},
                    chunk=(index, len(groups)),
                    window=(after, upto),
                )
            )
            after = upto
        return views
