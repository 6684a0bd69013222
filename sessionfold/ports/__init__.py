"""The model ports: every call to a model (batch summaries, the ledger's compaction pass).

No module is private to it.
"""

__all__ = [
    "anthropic_messages",
    "ledger",
    "ledger_http",
    "model_http",
    "summarizer",
    "summarizer_http",
]
