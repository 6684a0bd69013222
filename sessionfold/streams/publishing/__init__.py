"""Reading pi session files and publishing their entries to Kafka.

No module is private to it.
"""

__all__ = ["publisher", "session_file", "world"]
