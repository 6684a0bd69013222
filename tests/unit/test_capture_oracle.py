"""A flush's capture (windows.capture) against the way it was done before, kept here as the
oracle: every pending turn's batch built (`turn_batch`), trimmed by the frontier and the index
(`trim_batches`), then grouped. The capture now builds each batch once, with only the calls the
trim keeps; the batches it hands the flush are the same, field for field, in the same order."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pruning_session import (
    CALL_IDS,
    SESSION_ID,
    Drawn,
    assistant_calling,
    driver,
    result,
    turns_and_frontier,
    user,
)

from sessionfold.projections.pruning import windows
from sessionfold.projections.pruning.capture import Batch, group_batches
from sessionfold.projections.pruning.frontier import mark_of, trim_batches
from sessionfold.projections.pruning.session import Session, row_key


def _oracle_capture(session: Session) -> list[Batch]:
    """The capture as it was: build every pending turn, trim, group."""
    batches = [
        b for t in session.head["pending"] if (b := windows.turn_batch(session, t)) is not None
    ]
    mark = mark_of(session.head["frontier"])
    trimmed = trim_batches(batches, mark, windows.summarized_predicate(session))
    return group_batches(trimmed, session.config.batchingMode)


_CALL = st.tuples(
    st.sampled_from(CALL_IDS),  # repeated ids: the first result per id pairs
    st.sampled_from(("bash", "read")),
    st.booleans(),  # a result comes
    st.booleans(),  # its occurrence key is already indexed (summarized)
)


@settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns_and_frontier(_CALL),
    st.sampled_from(((), ("read",))),
    st.sampled_from(("turn", "agent-message")),
    st.booleans(),  # the frontier row stored without its turn (a restored head)
)
def test_capture_matches_the_built_and_trimmed_batches(
    drawn: Drawn,
    protected: tuple[str, ...],
    mode: str,
    no_turn: bool,
) -> None:
    """Same batches (calls, texts, groups, turns) after every turn, whatever the frontier."""
    turns, frontier = drawn
    d = driver(protectedTools=list(protected), batchingMode=mode)
    session = d.session
    if frontier is not None:
        stored: dict[str, Any] = {"last_attempted_tool_call_id": frontier[1]}
        if not (no_turn and frontier[0] == 0):
            stored["last_attempted_turn_index"] = frontier[0]
        session.head["frontier"] = stored
    for calls, user_first in turns:
        if user_first:
            d.add(session, user())
        d.add(session, assistant_calling([(c, tool) for c, tool, *_ in calls]))
        for call_id, tool, comes, summarized in calls:
            if not comes:
                continue
            at = d.seq + 1  # the result's timestamp: its occurrence key is id@at
            if summarized:
                d.store.put(row_key(SESSION_ID, "i", f"{call_id}@{at}"), {"id": call_id})
            d.add(session, result(call_id, "y" * 40, tool=tool, at=at))
            assert windows.capture(session) == _oracle_capture(session)
        assert windows.capture(session) == _oracle_capture(session)
