"""Kafka adapters: topic names and the partitioner, security settings, plain clients, topic
readers (a whole topic, one key of a partition), the table-backed store and its changelog's
fence, and the Faust internals the workers rely on.

No module is private to it.
"""

__all__ = [
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
