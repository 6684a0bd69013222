"""Kafka adapters: topic names and the partitioner, security settings, plain clients, topic
readers, the table-backed store, and the Faust internals the workers rely on.

No module is private to it.
"""

__all__ = [
    "clients",
    "faust_compat",
    "limits",
    "security",
    "table_store",
    "topic_reader",
    "topics",
]
