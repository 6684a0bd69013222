"""The model ports: every call to a model (batch summaries, the ledger's compaction pass)."""
