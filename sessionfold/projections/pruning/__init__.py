"""The pruning projections: branch digest, frontier, pending batches, index, flushes, metrics.

Private to it: `flush_request` (the request and stored plan `flushing` builds),
`message_facts` (the text-only and chain checks the folds share) and `steps` (the fold's steps
for one entry, in order, that `fold` runs).
"""

__all__ = [
    "capture",
    "config",
    "context_metrics",
    "digest",
    "entry_facts",
    "flush_pipeline",
    "flushing",
    "fold",
    "frontier",
    "index",
    "records",
    "session",
    "triggers",
    "windows",
]
