"""Kafka adapters: topic names and the partitioner, security settings, plain clients, topic
readers (a whole topic, one key of a partition), the table-backed store, its changelog's format
(one journal record per session per batch) and fence, and the Faust internals the workers rely on.

No module is private to it.
"""

__all__ = [
    "changelog",
    "clients",
    "faust_compat",
    "fence",
    "key_reader",
    "limits",
    "security",
    "table_store",
    "topic_reader",
    "topics",
]
