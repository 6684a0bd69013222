"""Runtimes, adapters and the command line: everything that does I/O.

No module is private to it.
"""

__all__ = [
    "cli",
    "kafka",
    "logs",
    "private_dirs",
    "publishing",
    "runtime",
    "tools",
    "web",
    "worker",
]
