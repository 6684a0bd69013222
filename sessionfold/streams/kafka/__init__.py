"""Kafka adapters: topic names, security settings, topic readers, the table-backed store."""
