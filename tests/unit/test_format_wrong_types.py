"""Any field of a Claude Code or Codex line given the wrong JSON type (an object, an array, a
number, a boolean, null or a string where another type stands): the reader never raises (a line
it cannot map is a dead letter), the folds take what is read, and the context rendered from
it is one a provider accepts (views/validity.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from context_oracles import views_at_turns
from format_sessions import TRANSLATED, write_format_session
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz_sessions import check_counts, fold

from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.projections.views.validity import problems
from sessionfold.streams.publishing.session_file import DeadLetter

WRONG: list[Any] = [{}, [], {"type": "x"}, [{}], 0, -1, 2.5, True, None, "", "x"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[bytes]]:
    """Each translated format's generated file, as its lines."""
    out = {}
    for file_format in TRANSLATED:
        path = write_format_session(tmp_path_factory.mktemp(file_format), file_format, 11, 6)
        out[file_format] = path.read_bytes().splitlines()
    return out


def _paths(value: Any, prefix: tuple[Any, ...] = (), depth: int = 4) -> list[tuple[Any, ...]]:
    """Every place in a JSON value down to `depth` levels (the value itself included)."""
    found = [prefix]
    if depth == 0:
        return found
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key), depth - 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index), depth - 1)
    return found


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    value[path[0]] = _replaced(value[path[0]], path[1:], new)
    return value


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), file_format=st.sampled_from(TRANSLATED), wrong=st.sampled_from(WRONG))
def test_a_wrong_typed_field_is_read_folded_and_rendered_without_raising(
    sources: dict[str, list[bytes]],
    tmp_path_factory: pytest.TempPathFactory,
    data: st.DataObject,
    file_format: str,
    wrong: Any,
) -> None:
    lines = list(sources[file_format])
    number = data.draw(st.integers(0, len(lines) - 1), label="line")
    value = json.loads(lines[number])
    path = data.draw(st.sampled_from(_paths(value)), label="path")
    lines[number] = json.dumps(_replaced(value, path, wrong)).encode()
    target = Path(tmp_path_factory.mktemp("wrong")) / "session.jsonl"
    target.write_bytes(b"\n".join(lines) + b"\n")
    fold(target)  # a first line that no longer names a format makes every line a dead letter
    if number == 0:
        return  # no header: nothing to render
    end = list(views_at_turns(target, DEFAULT_CONFIG, lambda _turn: False))[-1]
    assert problems(end.view.messages) == []


@pytest.mark.parametrize(
    "line",
    [
        {"timestamp": "2026-01-01T00:00:01Z", "type": {}, "payload": {}},
        {"timestamp": "2026-01-01T00:00:01Z", "type": "response_item", "payload": {"type": []}},
        {"timestamp": "2026-01-01T00:00:01Z", "type": [], "payload": {"type": "message"}},
    ],
)
def test_the_issues_codex_lines_are_dead_letters(tmp_path: Path, line: dict[str, Any]) -> None:
    meta = {"timestamp": "2026-01-01T00:00:00Z", "type": "session_meta",
            "payload": {"id": "s1", "timestamp": "2026-01-01T00:00:00Z", "cwd": "/w"}}  # fmt: skip
    target = tmp_path / "rollout.jsonl"
    target.write_text(json.dumps(meta) + "\n" + json.dumps(line) + "\n")
    _runtime, records = fold(target)
    check_counts(target, records)  # one object a line here: each an entry or a dead letter
    assert sum(isinstance(r, DeadLetter) for r in records) == 1
