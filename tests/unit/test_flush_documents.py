"""The flush path's hand-built documents equal what the typed models build: the flush request
(`request_envelope` against `wrap(request_payload(...))`), the flush-metrics record and its
envelope, and the flush barrier's held rows and the envelopes taken back from them.

Folded over generated sessions under configs that exercise every trigger, grouping, spills,
dedup and protection; compared as wire bytes, so a value of another type (a float for an int)
fails as well as a field out of order.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionfold.events.envelope import (
    EntryEnvelope,
    FlushMetricsEnvelope,
    PruningRequestEnvelope,
    encode,
    from_dict,
)
from sessionfold.events.flush import read_flush_metrics, read_request, wrap
from sessionfold.projections.pruning import flush_request, steps
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.config import DEFAULT_CONFIG, PruneConfig, build_config
from sessionfold.projections.pruning.session import row_key
from sessionfold.projections.store import DictStore
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.runtime.embedded import EmbeddedRuntime
from sessionfold.streams.tools.synthetic import write_fleet

CONFIGS = {
    "default": DEFAULT_CONFIG,
    "grouped": build_config(
        {
            "batchingMode": "agent-message",
            "spillThreshold": 4000,
            "minBatchChars": 200,
            "protectedTools": ["grep"],
            "autoBudgetThreshold": 0.3,
            "budgetTurnDelta": 0.05,
        }
    ),
    "budget": build_config(
        {"pruneOn": "on-demand", "autoBudgetThreshold": 0.2, "contextWindow": 60000}
    ),
}


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("fleet")
    return [written.path for written in write_fleet(out, sessions=3, turns=120, seed=11)]


def _fold(path: Path, config: PruneConfig) -> EmbeddedRuntime:
    runtime = EmbeddedRuntime(config, ledger=None)
    for record in read_session_file(path):
        runtime.publish(record)
    return runtime


@pytest.mark.parametrize("config", CONFIGS.values(), ids=list(CONFIGS))
def test_requests_and_records_are_what_the_typed_models_build(
    sessions: list[Path], config: PruneConfig
) -> None:
    requests = records = 0
    for path in sessions:
        runtime = _fold(path, config)
        for envelope in runtime.log["flush-requests"]:
            assert isinstance(envelope, PruningRequestEnvelope)
            typed = wrap(read_request(envelope), envelope.seq)
            assert encode(envelope) == encode(typed)
            assert envelope == typed
            requests += 1
        for envelope in runtime.log["flush-metrics"]:
            assert isinstance(envelope, FlushMetricsEnvelope)
            assert encode(envelope) == encode(wrap(read_flush_metrics(envelope), envelope.seq))
            records += 1
    assert requests > 0 and records > requests  # the configs do flush, with and without model


def test_request_envelope_is_the_wrapped_request_payload(sessions: list[Path]) -> None:
    """Captured at the moment of the flush: both constructions from the same plan."""
    seen = 0
    original = flush_request.request_envelope

    def both(*args: object) -> PruningRequestEnvelope:
        nonlocal seen
        session, plan, info, seq = args
        built = original(session, plan, info, seq)  # type: ignore[arg-type]
        typed = wrap(flush_request.request_payload(session, plan, info), seq)  # type: ignore[arg-type]
        assert encode(built) == encode(typed)
        seen += 1
        return built

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sessionfold.projections.pruning.flushing.request_envelope", both)
        _fold(sessions[0], CONFIGS["grouped"])
    assert seen > 0


def test_held_rows_dump_and_read_back_as_validation_does(sessions: list[Path]) -> None:
    held = 0
    original_hold = steps.hold

    def checked_hold(session: pruning.Session, envelope: object) -> None:
        nonlocal held
        original_hold(session, envelope)  # type: ignore[arg-type]
        row = session.store.get(row_key(session.session_id, "held", envelope.seq))  # type: ignore[attr-defined]
        assert row == envelope.model_dump(mode="json")  # type: ignore[attr-defined]
        held += 1

    with pytest.MonkeyPatch.context() as patch:
        for module in ("close_turn", "message_end"):
            patch.setattr(f"sessionfold.projections.pruning.steps.{module}.hold", checked_hold)
        for path in sessions:
            _fold(path, DEFAULT_CONFIG)
    assert held > 0


def test_a_held_entry_is_taken_back_equal_to_its_validation(sessions: list[Path]) -> None:
    entries = [r for r in read_session_file(sessions[0]) if not isinstance(r, DeadLetter)][:40]
    state = pruning.open_session(DictStore(), entries[0].session_id, DEFAULT_CONFIG)
    for envelope in entries:
        steps.hold(state, envelope)
        expected = from_dict(envelope.model_dump(mode="json"))
        taken = steps.take_held(state)
        assert isinstance(taken, EntryEnvelope)
        assert taken == expected == envelope
        assert encode(taken) == encode(expected)
