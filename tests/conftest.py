"""Shared fixtures: the Kafka broker, unique topic prefixes, the real sessions in ../shared.

Tests that need Kafka are marked ``@pytest.mark.kafka`` and take ``kafka_bootstrap``. The broker is
the one at ``SESSIONFOLD_BOOTSTRAP`` when it answers (``.ci/run`` starts one), otherwise a broker
this session starts on a free port with a temporary data dir and stops at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from hypothesis import settings

from sessionfold.streams.tools import broker

# Property tests check behaviour, never time (speed belongs in bench/): no per-example deadline,
# which a loaded machine (a CI runner beside a broker) can miss on any input.
settings.register_profile("sessionfold", deadline=None)
settings.load_profile("sessionfold")

# ../shared beside the repository, or beside the folder of its worktrees (a git worktree at
# /work/wt/NAME has it two levels up): the nearest one found.
SHARED_SESSIONS = next(
    (
        root / "shared" / "data" / "sessions"
        for root in Path(__file__).resolve().parents[1].parents
        if (root / "shared" / "data" / "sessions").is_dir()
    ),
    Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sessions",
)

# Set by .ci/run next to SESSIONFOLD_BOOTSTRAP so tests can query the CI broker's status. It is not
# SESSIONFOLD_BROKER_DATA_DIR on purpose: that one would become every CLI call's default data dir.
ENV_TEST_BROKER_DATA_DIR = "SESSIONFOLD_TEST_BROKER_DATA_DIR"


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers (also listed in pyproject.toml) so `--strict-markers` accepts them."""
    config.addinivalue_line("markers", "kafka: needs the real Kafka broker")


@dataclass(frozen=True)
class KafkaBroker:
    """The session's broker: its bootstrap address, and its config when we know its data dir."""

    bootstrap: str
    config: broker.BrokerConfig | None
    started_here: bool


def free_port_pair() -> int:
    """Return a free port P whose neighbour P + 1 (the controller port) is free too."""
    return broker.free_port_pair()


def unique_topic_prefix() -> str:
    """A topic prefix no other test uses, e.g. ``t1a2b3c4d.``."""
    return f"t{uuid4().hex[:8]}."


def _external_broker() -> KafkaBroker | None:
    bootstrap = os.environ.get("SESSIONFOLD_BOOTSTRAP", "").strip()
    if not bootstrap or not broker.probe(bootstrap, timeout_s=10.0):
        return None
    config = None
    data_dir = os.environ.get(ENV_TEST_BROKER_DATA_DIR)
    if data_dir:
        port = int(bootstrap.rpartition(":")[2])
        config = broker.BrokerConfig(port=port, data_dir=Path(data_dir))
    return KafkaBroker(bootstrap=bootstrap, config=config, started_here=False)


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """The broker for this test session: SESSIONFOLD_BOOTSTRAP's if it answers, else our own."""
    external = _external_broker()
    if external is not None:
        yield external
        return
    config = broker.BrokerConfig(
        port=free_port_pair(), data_dir=tmp_path_factory.mktemp("kafka-broker")
    )
    broker.up(config)
    try:
        yield KafkaBroker(bootstrap=config.bootstrap, config=config, started_here=True)
    finally:
        broker.stop(config)


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: KafkaBroker) -> str:
    """Bootstrap address (HOST:PORT) of a running, answering Kafka broker."""
    return kafka_broker.bootstrap


@pytest.fixture(scope="session")
def kafka_broker_config(kafka_broker: KafkaBroker) -> broker.BrokerConfig | None:
    """Config (port, data dir) of the session's broker; None for an external one of unknown dir."""
    return kafka_broker.config


@pytest.fixture
def port_pair() -> int:
    """A free broker port whose controller port (port + 1) is free too."""
    return free_port_pair()


@pytest.fixture
def topic_prefix() -> str:
    """A fresh topic prefix for this test, so tests never read each other's records."""
    return unique_topic_prefix()


@pytest.fixture(scope="session")
def shared_sessions() -> Path:
    """The real pi sessions beside the repository; skip when ../shared is absent."""
    if not SHARED_SESSIONS.is_dir():
        pytest.skip(f"real sessions not found at {SHARED_SESSIONS} (../shared is absent)")
    return SHARED_SESSIONS


@pytest.fixture(autouse=True, scope="session")
def _every_render_is_a_context_a_provider_accepts() -> Iterator[None]:
    """Hold every context the suite renders in this process to the provider's pairing rule
    (views/validity.py): each call answered once right after its assistant message, no result
    without its call. The render's last step (`repaired`) is wrapped, so a render that breaks
    the rule fails whichever test made it."""
    from sessionfold.projections.views import context, validity

    plain = context.repaired

    def checked(messages: list[Any]) -> tuple[list[Any], list[validity.Problem]]:
        out, repairs = plain(messages)
        broken = validity.problems(out)
        assert not broken, f"a rendered context a provider would refuse: {broken[:3]}"
        return out, repairs

    context.repaired = checked  # type: ignore[assignment]
    yield
    context.repaired = plain
