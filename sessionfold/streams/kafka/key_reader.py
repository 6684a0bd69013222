"""One key's records of a topic partition, read back by offset without a consumer group.

The live routes on a fold worker render a session from its entries, and session-events is
their archive: `KeyReader.read` returns the records of one session (its key) from an offset up
to the partition's end, so a cache can be filled incrementally from the last offset it read.
One consumer is kept and reused (creating one costs a metadata round trip); kafka-python's
consumer is not thread-safe, so one read runs at a time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from kafka import KafkaConsumer, TopicPartition

from sessionfold.streams.kafka import clients
from sessionfold.streams.kafka.security import PLAINTEXT, KafkaSecurity

#: Longest one read may take before it returns what it has (the caller reads on next time).
READ_TIMEOUT_S = 10.0
#: How long the broker may hold a fetch for more records. A request on the connection waits
#: behind a fetch in flight (the broker answers a connection's requests in order), and the
#: consumer leaves one in flight after a read: at kafka-python's 500 ms every read began with
#: that wait.
FETCH_WAIT_MS = 10


@dataclass(frozen=True, slots=True)
class KeyRecords:
    """What one read found: the key's (offset, value) records, and the offset to read from next."""

    records: list[tuple[int, bytes]]
    next_offset: int


class KeyReader:
    """Reads one key's records of `topic`'s partitions (see the module docstring)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        security: KafkaSecurity = PLAINTEXT,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.security = security
        self.timeout_s = timeout_s
        self._consumer: KafkaConsumer | None = None
        self._lock = threading.Lock()

    def read(self, partition: int, start: int | None, key: bytes) -> KeyRecords:
        """`key`'s records of `partition` from offset `start` (None: the partition's first) up
        to the partition's end as it is now; blocking, so run it off the event loop."""
        with self._lock:
            consumer = self._open()
            tp = TopicPartition(self.topic, partition)
            consumer.assign([tp])
            end = consumer.end_offsets([tp])[tp]
            if start is None:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, start)
            position = consumer.position(tp)
            found: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + self.timeout_s
            while position < end and time.monotonic() < deadline:
                for record in consumer.poll(timeout_ms=200).get(tp, []):
                    if record.offset >= end:
                        break
                    if record.key == key and record.value is not None:
                        found.append((record.offset, record.value))
                position = consumer.position(tp)
            return KeyRecords(found, min(position, end))

    def close(self) -> None:
        """Close the consumer (a later read opens another)."""
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None

    def _open(self) -> KafkaConsumer:
        if self._consumer is None:
            self._consumer = clients.reader(
                self.bootstrap,
                "sessionfold-live",
                self.security,
                auto_offset_reset="earliest",
                fetch_max_wait_ms=FETCH_WAIT_MS,
            )
        return self._consumer
