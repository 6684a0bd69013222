"""Topic names and their creation: every topic keyed by session id, same partition count."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError

from sessionfold.streams.kafka_security import PLAINTEXT, KafkaSecurity, kafka_python_options

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "sessionfold."
DEFAULT_PARTITIONS = 4


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


def ensure_topics(
    bootstrap: str,
    topics: Topics,
    partitions: int = DEFAULT_PARTITIONS,
    replication: int = 1,
    security: KafkaSecurity = PLAINTEXT,
) -> list[str]:
    """Create the topics that do not exist yet; return the names created.

    Every topic keeps its records forever: session-events is the archive the index points into,
    and the derived topics are what analysts replay.
    """
    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap, client_id="sessionfold-admin", **kafka_python_options(security)
    )
    try:
        existing = set(admin.list_topics())
        wanted = [
            NewTopic(
                name,
                num_partitions=partitions,
                replication_factor=replication,
                topic_configs={"retention.ms": "-1", "retention.bytes": "-1"},
            )
            for name in topics.all()
            if name not in existing
        ]
        if wanted:
            # Another publisher may win the race; the topics are there either way.
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(wanted)
            log.info("created topics", extra={"count": len(wanted)})
        return [t.name for t in wanted]
    finally:
        admin.close()
