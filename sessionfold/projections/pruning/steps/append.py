"""Step 4, digest append: the entry joins the session tree, its message the branch.

The branch digest (`digest.apply_facts`) writes the message row, the tree node, the call-id and
occurrence indexes and the metrics' running sums (`context_metrics.fold_row`), its head last as
the event's commit point. Nothing more is folded for an entry that changed neither the branch
nor its messages (the header, a known id, a non-message entry on the leaf).
"""

from __future__ import annotations

from sessionfold.projections.pruning import digest
from sessionfold.projections.pruning.steps import EntryStep


def run(step: EntryStep) -> bool:
    """Fold the entry into the branch digest (True: nothing joined or switched)."""
    session = step.session
    step.appended = digest.apply_facts(
        session.store, session.session_id, step.facts, step.envelope.seq
    )
    return step.appended is None
