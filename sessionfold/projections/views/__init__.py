"""Views over the folded state: the context the model is given at a point.

No module is private to it.
"""

__all__ = [
    "base",
    "chains",
    "context",
    "phases",
    "recall",
    "rewrite",
    "status",
    "validity",
]
