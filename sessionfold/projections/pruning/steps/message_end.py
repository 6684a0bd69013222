"""Step 3, message-end flush: a final reply flushes before it is folded.

pi-condense's agent-message trigger (reference §2.4): pi runs its `message_end` handler before
it saves the message, so the flush a text-only assistant starts sees the branch without it.
The head's `me` remembers the seq whose flush was attempted, so a held reply resumed after the
answer does not flush again.
"""

from __future__ import annotations

from sessionfold.projections.pruning import flushing
from sessionfold.projections.pruning.steps import EntryStep, hold


def run(step: EntryStep) -> bool:
    """Start the message-end flush of a final reply (True: the entry is held until answered)."""
    facts, session, envelope = step.facts, step.session, step.envelope
    config = session.config
    if not (
        facts.role == "assistant"
        and facts.text_only
        and facts.message is not None
        and config.enabled
        and config.pruneOn == "agent-message"
        and session.head["me"] != envelope.seq
    ):
        return False
    step.outputs.extend(flushing.start_flush(session, "message-end", envelope.seq, envelope.time))
    if session.head["out"] is None:
        return False
    hold(session, envelope)
    return True
