"""Kafka adapters: topic names, security settings, topic readers, the table-backed store.

No module is private to it.
"""

__all__ = ["security", "table_store", "topic_reader", "topics"]
