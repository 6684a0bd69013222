"""The size limit every sessionfold topic and Kafka client shares."""

from __future__ import annotations

from sessionfold.events.envelope import MAX_ENTRY_BYTES

#: The largest record on any sessionfold topic: the longest line the reader accepts (16 MiB)
#: plus room for its envelope (re-encoded JSON is never longer than pi's for the same value) and
#: the record batch around it. Topics get it as `max.message.bytes`; the publisher's
#: `max_request_size` and every consumer's partition fetch size match it (kafka/clients.py).
MAX_MESSAGE_BYTES = MAX_ENTRY_BYTES + 1024 * 1024

__all__ = ["MAX_MESSAGE_BYTES"]
