"""Event contracts: the envelope, pi session entries, migration and serialization."""
