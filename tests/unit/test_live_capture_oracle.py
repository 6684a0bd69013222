"""Live capture at a turn end (flushing._push_live_batch) against the way it was done before,
kept here as the oracle: the turn's batch built (`turn_batch`), its oversized results spilled
(`_eager_spill`), trimmed by the frontier (`trim_batch`), counted as queued when a call is left.
The live path reads the rows instead and builds the batch only when a result may spill."""

from __future__ import annotations

import copy

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

from sessionfold.projections.pruning import flushing, index, windows
from sessionfold.projections.pruning.frontier import mark_of, trim_batch
from sessionfold.projections.pruning.session import Session, open_session, row_key
from sessionfold.projections.store import DictStore


def _oracle_push(session: Session, turn: int) -> bool:
    """The live capture as it was: build, spill, trim, count."""
    batch = windows.turn_batch(session, turn)
    if batch is None:
        return False
    batch = flushing._eager_spill(session, batch)
    if batch is None:
        return False
    summarized = index.summarized_check(session.store, session.session_id)
    if trim_batch(batch, mark_of(session.head["frontier"]), summarized) is None:
        return False
    session.head["queued"] += 1
    return True


_CALL = st.tuples(
    st.sampled_from(CALL_IDS),
    st.sampled_from(("bash", "read")),
    st.booleans(),  # a result comes
    st.sampled_from((1, 40, 600)),  # its size
    st.booleans(),  # its occurrence key is already indexed (summarized)
)


@settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns_and_frontier(_CALL),
    st.sampled_from((5, 40, 500, 65_536)),
    st.sampled_from(((), ("read",))),
)
def test_live_capture_matches_the_built_batch(
    drawn: Drawn, spill_threshold: int, protected: tuple[str, ...]
) -> None:
    """Same answer, same queue count and the same rows written (spills) at every turn end."""
    turns, frontier = drawn
    d = driver(spillThreshold=spill_threshold, protectedTools=list(protected))
    session = d.session
    if frontier is not None:
        session.head["frontier"] = {
            "last_attempted_turn_index": frontier[0],
            "last_attempted_tool_call_id": frontier[1],
        }
    for number, (calls, user_first) in enumerate(turns):
        if user_first:
            d.add(session, user())
        d.add(session, assistant_calling([(c, tool) for c, tool, *_ in calls]))
        for call_id, tool, comes, size, summarized in calls:
            if not comes:
                continue
            at = d.seq + 1  # the result's timestamp: its occurrence key is id@at
            if summarized:
                d.store.put(row_key(SESSION_ID, "i", f"{call_id}@{at}"), {"id": call_id})
            d.add(session, result(call_id, "y" * size, tool=tool, at=at))
        session.save()
        expected = open_session(DictStore(copy.deepcopy(dict(d.store))), SESSION_ID, d.config)
        pushed = flushing._push_live_batch(session, number)
        assert pushed == _oracle_push(expected, number)
        session.save()
        expected.save()
        assert dict(d.store) == expected.store
