"""Tools beside the runtimes: replay, compare, synthetic sessions, the Kafka broker.

No module is private to it.
"""

__all__ = ["broker", "compare", "replay", "synthetic", "synthetic_claude", "synthetic_codex"]
