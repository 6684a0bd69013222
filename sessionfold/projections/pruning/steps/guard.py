"""Step 1, guard and barrier: the sequence guard, the flush barrier, the duplicate entry id.

`admit` runs for every session event: one whose seq is not above the last accepted one is
ignored (redelivery, replay, duplicate publish); while a flush request is outstanding it is held
in the store, to be folded once the compaction is applied. `run` refuses an entry whose id an
earlier entry took (the reader dead-letters such a line; another producer may not), before it
can end a turn or start a flush.
"""

from __future__ import annotations

import logging

from sessionfold.events.envelope import Envelope
from sessionfold.projections.pruning import digest
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.steps import EntryStep, hold

log = logging.getLogger(__name__)


def admit(session: pruning.Session, envelope: Envelope) -> bool | None:
    """Whether to fold `envelope` now: None when it is old (ignored, nothing changed), False
    when the barrier holds it (the head changed: save it)."""
    head = session.head
    if envelope.seq <= head["seq"]:
        return None  # redelivery, replay or duplicate publish
    head["seq"] = envelope.seq
    if head["out"] is not None:
        hold(session, envelope)
        return False
    return True


def run(step: EntryStep) -> bool:
    """Refuse a second entry with an id already folded (True: stop here)."""
    session = step.session
    if not digest.is_folded(session.store, session.session_id, step.facts.id):
        return False
    log.warning(
        "duplicate entry id refused",
        extra={"session": session.session_id, "seq": step.envelope.seq, "code": "duplicate-id"},
    )
    return True
