"""Pure, deterministic folds over session events.

No module is private to it.
"""

__all__ = ["folds", "jsjson", "ledger", "pruning", "store", "text_lines", "views"]
