"""The runtimes' shared step and the embedded runtime.

No module is private to it.
"""

__all__ = ["config_files", "embedded", "ledger_log", "ledger_loop", "step"]
