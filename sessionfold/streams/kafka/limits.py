"""The size limit every sessionfold topic and Kafka client shares, and how to tell a record
refused for its size from any other failure to send."""

from __future__ import annotations

from sessionfold.events.envelope import MAX_ENTRY_BYTES

#: The largest record on any sessionfold topic: the longest line the reader accepts (16 MiB)
#: plus room for its envelope and the record batch around it. Topics get it as
#: `max.message.bytes`; the publisher's `max_request_size` and every consumer's partition fetch
#: size match it (kafka/clients.py). An entry whose envelope outgrows it anyway (JSON written
#: shorter than orjson writes it) is dead-lettered by the reader (publishing/session_file.py).
MAX_MESSAGE_BYTES = MAX_ENTRY_BYTES + 1024 * 1024


def refused_for_size(error: BaseException) -> bool:
    """Whether `error`, or one it was raised from (Faust wraps the producer's errors in
    ProducerSendError), says a record was too large to send: the producer's own check against
    its `max_request_size`, or the broker's against the topic's `max.message.bytes`."""
    # Imported here: the file reader needs only the size above, and a hook starts faster
    # without the Kafka client.
    from aiokafka.errors import (
        MessageSizeTooLargeError,
        RecordListTooLargeError,
        RecordTooLargeError,
    )

    size_errors = (MessageSizeTooLargeError, RecordTooLargeError, RecordListTooLargeError)
    seen: BaseException | None = error
    for _ in range(8):  # a chain of causes is short; a cycle must not hang us
        if seen is None:
            return False
        if isinstance(seen, size_errors):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


__all__ = ["MAX_MESSAGE_BYTES", "refused_for_size"]
