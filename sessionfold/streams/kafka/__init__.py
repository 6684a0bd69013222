"""Kafka adapters: topic names and the partitioner, security settings, plain clients, topic
readers, the table-backed store and its changelog's fence, and the Faust internals the workers
rely on.

No module is private to it.
"""

__all__ = [
    "clients",
    "faust_compat",
    "fence",
    "limits",
    "security",
    "table_store",
    "topic_reader",
    "topics",
]
