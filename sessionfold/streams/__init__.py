"""Runtimes, adapters and the command line: everything that does I/O.

No module is private to it.
"""

__all__ = ["cli", "kafka", "logs", "publishing", "runtime", "tools", "web", "worker"]
