"""Step 5, windows and metrics: the tool windows, turn gates and pending turns of the message.

A branch switch rebuilds the windows from the new branch (rare); otherwise the message that
joined opens an assistant's tool window and turn gate, pairs a tool result with its call, or
counts a user turn (`windows.on_row`). Whether that ended the turn is left for `turn_end`.
"""

from __future__ import annotations

from sessionfold.projections.pruning import windows
from sessionfold.projections.pruning.steps import EntryStep


def run(step: EntryStep) -> bool:
    """Fold the joined message into the windows (never stops the entry)."""
    appended = step.appended
    if appended is None:
        return True
    if appended.switched:
        windows.on_switch(step.session)
    if appended.row is not None and step.facts.message is not None:
        step.ended = windows.on_row(step.session, appended.row, step.facts)
    return False
