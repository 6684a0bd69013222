"""The size limit every sessionfold topic and Kafka client shares."""

from __future__ import annotations

from sessionfold.events.envelope import MAX_ENTRY_BYTES

#: The largest record on any sessionfold topic: the longest line the reader accepts (16 MiB)
#: plus room for its envelope and the record batch around it. Topics get it as
#: `max.message.bytes`; the publisher's `max_request_size` and every consumer's partition fetch
#: size match it (kafka/clients.py). An entry whose envelope outgrows it anyway (JSON written
#: shorter than orjson writes it) is dead-lettered by the reader (publishing/session_file.py).
MAX_MESSAGE_BYTES = MAX_ENTRY_BYTES + 1024 * 1024

__all__ = ["MAX_MESSAGE_BYTES"]
