"""A pruning session driven one message at a time, for the windows and flushing tests.

Not a test module: `tests/unit/test_windows.py`, `test_flushing.py` and the capture oracles
import it (`from pruning_session import ...`; pytest puts `tests/` on sys.path for its rootdir
conftest). It folds entries into the digest and the tool windows as the pruning fold's entry
step does, without the fold's flush triggers, so a test calls the function under test itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from sessionfold.projections.pruning import digest, windows
from sessionfold.projections.pruning.config import PruneConfig, build_config
from sessionfold.projections.pruning.entry_facts import entry_facts
from sessionfold.projections.pruning.session import Session, open_session
from sessionfold.projections.store import DictStore

SESSION_ID = "s-test"


def user(text: str = "go") -> dict[str, Any]:
    """A user message."""
    return {"role": "user", "content": text, "timestamp": 1}


def assistant(*call_ids: str, tool: str = "bash", stop: str = "toolUse", **extra: Any) -> dict:
    """An assistant message calling `tool` once per call id (none: a final text reply)."""
    calls = [
        {"type": "toolCall", "id": c, "name": tool, "arguments": {"command": f"run {c}"}}
        for c in call_ids
    ]
    return {
        "role": "assistant",
        "content": [{"type": "text", "text": "working"}, *calls],
        "stopReason": stop,
        "timestamp": 2,
        **extra,
    }


def result(call_id: str, text: str = "out", *, tool: str = "bash", at: int = 3) -> dict:
    """A tool result for `call_id` whose text is `text`."""
    return {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": tool,
        "content": [{"type": "text", "text": text}],
        "isError": False,
        "timestamp": at,
    }


@dataclass
class Driver:
    """A session under `config`; `add` folds one message and tells whether its turn ended."""

    config: PruneConfig
    store: DictStore = field(default_factory=DictStore)
    seq: int = 0
    parent: str | None = None

    @property
    def session(self) -> Session:
        """The session as a fold step opens it (the head as last saved)."""
        return open_session(self.store, SESSION_ID, self.config)

    def add(self, session: Session, message: dict[str, Any]) -> bool:
        """Fold one message entry into `session`; True when it ended its turn."""
        self.seq += 1
        entry_id = f"e{self.seq}"
        entry = {
            "type": "message",
            "id": entry_id,
            "parentId": self.parent,
            "timestamp": f"2025-01-01T00:00:{self.seq % 60:02d}Z",
            "message": message,
        }
        self.parent = entry_id
        facts = entry_facts(entry)
        appended = digest.apply_facts(self.store, SESSION_ID, facts, self.seq)
        assert appended is not None and appended.row is not None
        return windows.on_row(session, appended.row, facts)


def driver(**settings: Any) -> Driver:
    """A driver whose config is the defaults with `settings` (camelCase keys) on top."""
    return Driver(build_config(settings))


# --- drawn turns, for the capture oracles (test_capture_oracle, test_live_capture_oracle) -------

#: Call ids the drawn turns pick from: repeated ids test that the first result per id pairs.
CALL_IDS = ("a", "b", "c", "d")
#: Drawn turns (each: its calls as the test's call strategy draws them, whether a user message
#: comes first) and a frontier (turn, call id) or None.
Drawn = tuple[list[tuple[list[tuple[Any, ...]], bool]], tuple[int, str] | None]


def assistant_calling(calls: list[tuple[str, str]]) -> dict[str, Any]:
    """An assistant message with one toolCall per (id, tool), each on its own file path."""
    blocks = [
        {"type": "toolCall", "id": c, "name": tool, "arguments": {"path": f"src/{c}.py"}}
        for c, tool in calls
    ]
    return {"role": "assistant", "content": blocks, "stopReason": "toolUse", "timestamp": 2}


@st.composite
def turns_and_frontier(draw: st.DrawFn, call: st.SearchStrategy[tuple[Any, ...]]) -> Drawn:
    """Turns (each: its drawn calls, whether a user message comes first) and a frontier mostly
    in one of them (at one of its calls, or at none)."""
    turns = draw(
        st.lists(
            st.tuples(st.lists(call, min_size=1, max_size=4), st.booleans()), min_size=1, max_size=6
        )
    )
    if draw(st.integers(0, 4)) == 0:
        return turns, None
    turn = draw(st.integers(-1, len(turns)))
    ids = [c[0] for c in turns[turn][0]] if 0 <= turn < len(turns) else []
    return turns, (turn, draw(st.sampled_from((*ids, "zz"))))
