"""Step 2, turn close: a non-result message ends the previous assistant's turn.

pi evaluates an assistant's turn end once its tool results are in, or when the next message
that is not a result arrives; the still-open turn gate (`windows`) is evaluated here, before the
entry. When that raises the flush barrier the entry is held and resumes here after the answer.
Reloads and commands close the turn the same way (`close`).
"""

from __future__ import annotations

from sessionfold.events.envelope import Envelope
from sessionfold.projections.pruning import flushing
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.steps import EntryStep, hold


def close(session: pruning.Session, envelope: Envelope) -> list[Envelope]:
    """Evaluate a still open turn end before `envelope`; hold it if that raised the barrier."""
    head = session.head
    if head["gate"] is None:
        return []
    outputs = flushing.turn_end(session, envelope.seq, envelope.time)
    if head["out"] is not None:
        hold(session, envelope)
    return outputs


def run(step: EntryStep) -> bool:
    """Close the open turn before a message that is not a tool result (True: held)."""
    if step.facts.role in (None, "toolResult"):
        return False  # not a message (role None), or a result: the turn goes on
    step.outputs.extend(close(step.session, step.envelope))
    return step.session.head["out"] is not None
