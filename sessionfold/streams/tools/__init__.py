"""Tools beside the runtimes: replay, compare, synthetic sessions, the Kafka broker, the
agents' settings edits of `sessionfold install` and the names of `sessionfold mcp`'s tools.

No module is private to it.
"""

__all__ = [
    "broker",
    "compare",
    "install",
    "mcp_names",
    "replay",
    "synthetic",
    "synthetic_claude",
    "synthetic_codex",
]
