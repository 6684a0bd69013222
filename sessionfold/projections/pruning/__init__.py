"""The pruning projections: branch digest, frontier, pending batches, index, flushes, metrics.

Private to it: `flushing` (the fold's flush steps) and `flush_request` (the plan rows they keep).
"""

__all__ = [
    "capture",
    "config",
    "context_metrics",
    "digest",
    "flush_pipeline",
    "fold",
    "frontier",
    "index",
    "session",
    "triggers",
    "windows",
]
