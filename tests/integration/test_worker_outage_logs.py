"""A fold worker's log through a real broker outage: bounded, then one recovery line.

The test stops a broker of its own (never the shared one) under a fold worker for about 25 s
and starts it again on the same port and data dir. The Kafka clients retry several times a
second meanwhile, each failure a log line (about 70 a second here); with the worker's repeat
interval at 10 s, each kind of line may appear once per interval, the line that ends a hold
says how many it held, a `kafka clients recovered` line follows the outage, and the worker
folds what is published after it.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import unique_topic_prefix
from kafka.errors import KafkaError
from kafka_workers import WorkerProcess, committed, generate_fleet, publish_tree

from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.logs import RECOVERED
from sessionfold.streams.tools import broker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 2
INTERVAL_S = 10.0
OUTAGE_S = 25.0
_LEVEL = re.compile(r"\[(ERROR|WARNING|CRITICAL)\]: (.*)")
_FACTS = re.compile(r" suppressed=\d+ kind=\S+$")


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[broker.BrokerConfig]:
    """A broker of this test's own, which it may stop and start."""
    config = broker.BrokerConfig(port=broker.free_port_pair(), data_dir=tmp_path / "kafka")
    broker.up(config)
    try:
        yield config
    finally:
        broker.stop(config)


def _failures(text: str) -> list[str]:
    """The warning and error lines of a log, each reduced to its template: digits, and the
    facts the filter adds, left out (a kind's lines differ in ids, ports and counts)."""
    lines = []
    for line in text.splitlines():
        match = _LEVEL.search(line)
        if match and RECOVERED not in line:
            lines.append(re.sub(r"\d+", "N", _FACTS.sub("", match.group(2))))
    return lines


def test_an_outage_logs_each_kind_once_per_interval_then_the_recovery(
    own_broker: broker.BrokerConfig, tmp_path: Path
) -> None:
    """Stopped for 25 s and started again, the broker's absence costs each kind of client
    failure at most one line per 10 s interval (plus the first), one recovery line counting
    what was held follows, and events published afterwards are folded."""
    bootstrap = own_broker.bootstrap
    prefix = unique_topic_prefix()
    topics = Topics(prefix)
    group = f"{prefix}worker"
    before = generate_fleet(tmp_path / "before", 4, 10, seed=3)
    after = generate_fleet(tmp_path / "after", 4, 10, seed=4)
    published = publish_tree(bootstrap, prefix, PARTITIONS, [before], tmp_path / "pub.json")
    worker = WorkerProcess(
        bootstrap,
        prefix,
        "fold",
        PARTITIONS,
        tmp_path,
        env={"SESSIONFOLD_LOG_REPEAT_INTERVAL": str(INTERVAL_S)},
    )
    try:
        worker.start().wait_web()
        _wait_folded(bootstrap, group, topics, published)
        offset = worker.log_path.stat().st_size
        stopped = time.monotonic()
        broker.stop(own_broker)
        time.sleep(OUTAGE_S)
        broker.up(own_broker)  # same port and data dir: the worker's bootstrap holds
        published += publish_tree(bootstrap, prefix, PARTITIONS, [after], tmp_path / "pub.json")
        _wait_folded(bootstrap, group, topics, published)  # it folds again
        deadline = time.monotonic() + 30
        while RECOVERED not in (text := _since(worker.log_path, offset)):
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        window_s = time.monotonic() - stopped
    finally:
        worker.stop()
    failures = _failures(text)
    per_template = Counter(failures)
    recoveries = [line.split(": ", 1)[1] for line in text.splitlines() if RECOVERED in line]
    told = sum(int(n) for n in re.findall(r" suppressed=(\d+)", text))
    print(
        f"\n{window_s:.0f} s from the stop to the recovery line: {len(failures)} failure lines "
        f"({len(text)} bytes) of {len(per_template)} templates, {told} held back; {recoveries}"
    )
    bound = math.ceil(window_s / INTERVAL_S) + 1
    assert max(per_template.values()) <= bound, per_template.most_common(3)
    assert len(recoveries) == 1, worker.log_tail()
    assert told > len(failures)  # the outage did repeat, and most of it was held


def _wait_folded(bootstrap: str, group: str, topics: Topics, total: int) -> None:
    """Wait until the group has committed `total` session events (a coordinator that is not
    ready yet, at the start or just after the broker's, is asked again)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if committed(bootstrap, group, topics.session_events) >= total:
                return
        except KafkaError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the worker did not fold the {total} events")


def _since(path: Path, offset: int) -> str:
    with path.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")
