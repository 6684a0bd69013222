"""The two memos of the pruning fold against the reads they skip, kept as the oracle: an
answer finds its outstanding plan (flushing._PLANS) instead of rebuilding it from the stored row
(`plan_from_row`), and an entry taken back from the flush barrier finds its facts
(steps._HELD_FACTS) instead of reading its entry again. Folded with the memos, without them,
and over a store that hands back copies (as a restored one does, so the memos never apply),
every topic's records and every stored row are the same."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionfold.events.envelope import encode
from sessionfold.projections.pruning import flushing, steps
from sessionfold.projections.store import DictStore
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.runtime.embedded import EmbeddedRuntime
from sessionfold.streams.tools.synthetic import generate_session, write_session


class _Forgetful(dict):  # type: ignore[type-arg]
    """A memo that keeps nothing: every lookup misses, as before the memos."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


class _CopyingStore(DictStore):
    """A store whose reads hand back copies, as a store restored from bytes does."""

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return copy.deepcopy(super().get(key, default))


class _Counting(dict):  # type: ignore[type-arg]
    """The memo as it is, counting the lookups that found their row."""

    hits = 0

    def pop(self, key: Any, default: Any = None) -> Any:
        found = super().pop(key, default)
        _Counting.hits += found is not None
        return found


def _folded(path: Path, store: DictStore | None = None) -> tuple[list[Any], list[Any]]:
    runtime = EmbeddedRuntime(store=store, ledger=None)
    for record in read_session_file(path):
        runtime.publish(record)
    logs = [
        (topic, [repr(r) if isinstance(r, DeadLetter) else encode(r) for r in records])
        for topic, records in runtime.log.items()
    ]
    rows = [(key, repr(runtime.store[key])) for key in sorted(runtime.store)]
    return logs, rows


def _check(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(flushing, "_PLANS", _Counting())
        patch.setattr(steps, "_HELD_FACTS", _Counting())
        _Counting.hits = 0
        remembered = _folded(path)
        hits = _Counting.hits
    with monkeypatch.context() as patch:
        patch.setattr(flushing, "_PLANS", _Forgetful())
        patch.setattr(steps, "_HELD_FACTS", _Forgetful())
        read = _folded(path)
    copied = _folded(path, _CopyingStore())
    assert remembered == read
    assert copied == read
    requests = dict(read[0])["flush-requests"]
    assert hits >= len(requests)  # each answer found its plan: the memo path was taken


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.integers(0, 10_000))
def test_generated_sessions_fold_alike_with_and_without_the_memos(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    out = tmp_path_factory.mktemp("memo")
    _check(write_session(out, generate_session(seed, 60)).path, monkeypatch)


def test_a_real_session_folds_alike_with_and_without_the_memos(
    shared_sessions: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _check(shared_sessions / "large-session.jsonl", monkeypatch)
