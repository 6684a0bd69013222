"""Tools beside the runtimes: replay, compare, synthetic sessions, the Kafka broker, the
agents' settings edits of `sessionfold install`.

No module is private to it.
"""

__all__ = [
    "broker",
    "compare",
    "install",
    "replay",
    "synthetic",
    "synthetic_claude",
    "synthetic_codex",
]
