"""Step 6, turn end: the turn the entry completed is evaluated (live capture and triggers).

An assistant without tool calls (or an errored or aborted one) ends its turn with its message;
one with calls ends it with the result of its last call. `flushing.turn_end` captures the
turn's batch, counts it as queued and runs the budget and delta triggers.
"""

from __future__ import annotations

from sessionfold.projections.pruning import flushing
from sessionfold.projections.pruning.steps import EntryStep


def run(step: EntryStep) -> bool:
    """Evaluate the turn end the entry completed, if it did (the last step)."""
    if step.ended:
        envelope = step.envelope
        step.outputs.extend(flushing.turn_end(step.session, envelope.seq, envelope.time))
    return True
