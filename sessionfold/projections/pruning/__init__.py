"""The pruning projections: branch digest, frontier, pending batches, index, flushes, metrics."""
