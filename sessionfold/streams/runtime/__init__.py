"""The runtimes' shared step and the embedded runtime.

No module is private to it.
"""

__all__ = [
    "agent_dirs",
    "answer_journal",
    "config_files",
    "embedded",
    "heap",
    "ledger_log",
    "ledger_loop",
    "live",
    "step",
]
