"""Topic names, the partitioner and topic creation: every topic keyed by session id, with the
same partition count, so a session's records share a partition number on every topic."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError
from kafka.partitioner.default import murmur2

from sessionfold.streams.kafka import clients
from sessionfold.streams.kafka.limits import MAX_MESSAGE_BYTES
from sessionfold.streams.kafka.security import PLAINTEXT, KafkaSecurity

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "sessionfold."
DEFAULT_PARTITIONS = 4
_MAX_MESSAGE = "max.message.bytes"


@dataclass(frozen=True, slots=True)
class Topics:
    """The names of sessionfold's topics under one prefix."""

    prefix: str = DEFAULT_PREFIX

    @property
    def session_events(self) -> str:
        return f"{self.prefix}session-events"

    @property
    def flush_requests(self) -> str:
        return f"{self.prefix}flush-requests"

    @property
    def compaction_events(self) -> str:
        return f"{self.prefix}compaction-events"

    @property
    def flush_metrics(self) -> str:
        return f"{self.prefix}flush-metrics"

    @property
    def dead_letters(self) -> str:
        return f"{self.prefix}dead-letters"

    def all(self) -> list[str]:
        """Every topic name, session-events first."""
        return [
            self.session_events,
            self.flush_requests,
            self.compaction_events,
            self.flush_metrics,
            self.dead_letters,
        ]


def partition_of(key: str | bytes, partitions: int) -> int:
    """The partition of a keyed record among `partitions`: Kafka's default partitioner (murmur2
    of the key, as the publisher's and Faust's producers place records)."""
    raw = key.encode() if isinstance(key, str) else key
    return (murmur2(raw) & 0x7FFFFFFF) % partitions


def ensure_topics(
    bootstrap: str,
    topics: Topics,
    partitions: int = DEFAULT_PARTITIONS,
    replication: int = 1,
    timeout_s: float = 30.0,
    security: KafkaSecurity = PLAINTEXT,
) -> list[str]:
    """Create the topics that do not exist yet; return the names created.

    Every topic keeps its records forever: session-events is the archive the index points into,
    and the derived topics are what analysts replay. Every topic takes records of up to
    `MAX_MESSAGE_BYTES`; an existing topic that takes less is raised to it. A broker that does
    not answer within `timeout_s` raises a KafkaError.
    """
    admin = clients.admin(bootstrap, "sessionfold-admin", security, timeout_s)
    try:
        existing = set(admin.list_topics())
        wanted = [
            NewTopic(
                name,
                num_partitions=partitions,
                replication_factor=replication,
                topic_configs={
                    "retention.ms": "-1",
                    "retention.bytes": "-1",
                    _MAX_MESSAGE: str(MAX_MESSAGE_BYTES),
                },
            )
            for name in topics.all()
            if name not in existing
        ]
        if wanted:
            # Another publisher may win the race; the topics are there either way.
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(wanted)
            log.info("created topics", extra={"count": len(wanted)})
        _raise_record_limits(admin, [name for name in topics.all() if name in existing])
        return [t.name for t in wanted]
    finally:
        admin.close()


def _raise_record_limits(admin: KafkaAdminClient, names: list[str]) -> None:
    """Let topics created before the 16 MiB limit (or by hand) take records that large."""
    if not names:
        return
    described = admin.describe_configs(
        [_topic_resource(name, None) for name in names], config_filter="all"
    )
    small = [
        name
        for name, configs in described.get("topic", {}).items()
        if int(configs.get(_MAX_MESSAGE, {}).get("value") or 0) < MAX_MESSAGE_BYTES
    ]
    if small:
        admin.alter_configs([_topic_resource(name, str(MAX_MESSAGE_BYTES)) for name in small])
        log.info("raised record limits", extra={"count": len(small)})


def _topic_resource(name: str, value: str | None) -> ConfigResource:
    return ConfigResource(ConfigResourceType.TOPIC, name, configs={_MAX_MESSAGE: value})
