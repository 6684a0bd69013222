"""kafka/clients.py's kafka-python clients, built against the real broker (they bootstrap)."""

from __future__ import annotations

import pytest

from sessionfold.streams.kafka import clients
from sessionfold.streams.kafka.limits import MAX_MESSAGE_BYTES
from sessionfold.streams.publishing.publisher import make_producer

pytestmark = pytest.mark.kafka


def test_a_reader_joins_no_group_and_fetches_the_largest_record(kafka_bootstrap: str) -> None:
    """A reader commits nothing, joins no group and fetches records up to the topics' limit;
    an option given overrides its default."""
    reader = clients.reader(kafka_bootstrap, "sessionfold-test", bootstrap_timeout_ms=9_000)
    try:
        config = reader.config
        assert (config["client_id"], config["group_id"]) == ("sessionfold-test", None)
        assert config["enable_auto_commit"] is False
        assert config["max_partition_fetch_bytes"] == MAX_MESSAGE_BYTES
        assert config["fetch_max_bytes"] == clients.FETCH_MAX_BYTES
        assert config["bootstrap_timeout_ms"] == 9_000
    finally:
        reader.close()


def test_producers_send_the_largest_record(kafka_bootstrap: str) -> None:
    """Every producer, the publisher's included, may send a record as large as a topic takes."""
    for producer in (
        clients.producer(kafka_bootstrap, "sessionfold-test"),
        make_producer(kafka_bootstrap),
    ):
        try:
            assert producer.config["max_request_size"] == MAX_MESSAGE_BYTES
        finally:
            producer.close(timeout=0)
    assert make_producer(kafka_bootstrap).config["client_id"] == "sessionfold-publish"


def test_an_admin_client_takes_one_timeout_for_bootstrap_and_requests(kafka_bootstrap: str) -> None:
    """`timeout_s` bounds both the bootstrap and every request."""
    admin = clients.admin(kafka_bootstrap, "sessionfold-test", timeout_s=7.5)
    try:
        assert admin.config["client_id"] == "sessionfold-test"
        assert (admin.config["bootstrap_timeout_ms"], admin.config["request_timeout_ms"]) == (
            7_500,
            7_500,
        )
        assert isinstance(admin.list_topics(), list)
    finally:
        admin.close()
