"""Every plain Kafka client outside Faust, built in one place.

Each gets the cluster's security settings (kafka/security.py), a client id naming its use, and
sizes that fit the largest record a sessionfold topic holds (`MAX_MESSAGE_BYTES`); callers add
only what is particular to them (acks, timeouts of their own), and any option they pass
overrides the default (the security settings included).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from sessionfold.streams.kafka.limits import MAX_MESSAGE_BYTES
from sessionfold.streams.kafka.security import (
    PLAINTEXT,
    KafkaSecurity,
    aiokafka_options,
    kafka_python_options,
)

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer

#: A fetch response's limit: kafka-python's default, or one record of the largest size.
FETCH_MAX_BYTES = max(52_428_800, MAX_MESSAGE_BYTES)


def reader(
    bootstrap: str, client_id: str, security: KafkaSecurity = PLAINTEXT, **options: Any
) -> KafkaConsumer:
    """A group-less consumer (partitions assigned, nothing committed) that can fetch the
    largest record a sessionfold topic holds."""
    settings: dict[str, Any] = {
        **kafka_python_options(security),
        "enable_auto_commit": False,
        "group_id": None,
        "max_partition_fetch_bytes": MAX_MESSAGE_BYTES,
        "fetch_max_bytes": FETCH_MAX_BYTES,
    }
    settings.update(options)
    return KafkaConsumer(bootstrap_servers=bootstrap, client_id=client_id, **settings)


def producer(
    bootstrap: str, client_id: str, security: KafkaSecurity = PLAINTEXT, **options: Any
) -> KafkaProducer:
    """A producer that can send the largest record a sessionfold topic takes."""
    settings: dict[str, Any] = {
        **kafka_python_options(security),
        "max_request_size": MAX_MESSAGE_BYTES,
    }
    settings.update(options)
    return KafkaProducer(bootstrap_servers=bootstrap, client_id=client_id, **settings)


def admin(
    bootstrap: str,
    client_id: str,
    security: KafkaSecurity = PLAINTEXT,
    timeout_s: float | None = None,
    **options: Any,
) -> KafkaAdminClient:
    """An admin client; with `timeout_s`, bootstrapping and each request give up after it."""
    settings: dict[str, Any] = kafka_python_options(security)
    if timeout_s is not None:
        timeout_ms = int(timeout_s * 1000)
        settings.update(bootstrap_timeout_ms=timeout_ms, request_timeout_ms=timeout_ms)
    settings.update(options)
    return KafkaAdminClient(bootstrap_servers=bootstrap, client_id=client_id, **settings)


def async_reader(
    bootstrap: str, client_id: str, security: KafkaSecurity = PLAINTEXT, **options: Any
) -> AIOKafkaConsumer:
    """An aiokafka group-less consumer, reading from the earliest offset, that can fetch the
    largest record a sessionfold topic holds."""
    # Imported here: only the benchmarks read with aiokafka, and the CLI should not pay for it.
    from aiokafka import AIOKafkaConsumer

    settings: dict[str, Any] = {
        **aiokafka_options(security),
        "group_id": None,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_partition_fetch_bytes": MAX_MESSAGE_BYTES,
        "fetch_max_bytes": FETCH_MAX_BYTES,
    }
    settings.update(options)
    return AIOKafkaConsumer(bootstrap_servers=bootstrap, client_id=client_id, **settings)


__all__ = ["FETCH_MAX_BYTES", "admin", "async_reader", "producer", "reader"]
