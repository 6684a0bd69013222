"""Every fold over one envelope: the pruning folds, then the rule ledger.

Both read the same session events and write apart in the Store (`sid/pr/...` and
`sid/ledger/...`); each keeps its own sequence guard and flush barrier, so neither waits on the
other's model. A compaction event goes to the fold whose request it answers (its envelope class
says which). Outputs are envelopes: the pruning fold's flush requests and flush-metrics records,
and the ledger's pass requests as flush-requests records (LedgerRequestEnvelope).
"""

from __future__ import annotations

from sessionfold.events.envelope import CompactionEnvelope, Envelope, LedgerPassEnvelope
from sessionfold.events.ledger import request_envelope
from sessionfold.projections.ledger.config import LedgerConfig
from sessionfold.projections.ledger.fold import LedgerFold
from sessionfold.projections.pruning import fold as session_fold
from sessionfold.projections.pruning.config import PruneConfig
from sessionfold.projections.store import Store


def apply_folds(
    store: Store, envelope: Envelope, prune: PruneConfig, ledger: LedgerConfig | None
) -> list[Envelope]:
    """Fold one envelope through pruning and (unless `ledger` is None) the ledger."""
    outputs = session_fold.apply(store, envelope, prune)
    if ledger is None:
        return outputs
    if isinstance(envelope, CompactionEnvelope) and not isinstance(envelope, LedgerPassEnvelope):
        return outputs  # a pruning answer: not the ledger's
    requests = LedgerFold(store, ledger).apply(envelope)
    return outputs + [request_envelope(request) for request in requests]
