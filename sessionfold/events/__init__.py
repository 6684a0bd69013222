"""Event contracts: the envelope, pi session entries, migration and serialization.

No module is private to it.
"""

__all__ = ["entries", "envelope", "flush", "ledger", "lines", "migration"]
