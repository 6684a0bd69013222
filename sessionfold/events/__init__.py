"""Event contracts: the envelope, pi session entries, migration and serialization.

Private to it: `errors` (the base of its refusals, and the way they name a field).
"""

__all__ = ["entries", "envelope", "exit_codes", "flush", "formats", "ledger", "lines", "migration"]
