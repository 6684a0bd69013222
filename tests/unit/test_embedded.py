"""The embedded runtime on the two real sessions: the flush-attempt figures of
reference/metrics-figures.md, routing between topics, idempotence, and the `fold` command."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import typer
from typer.testing import CliRunner

from sessionfold.events.envelope import decode, encode
from sessionfold.events.flush import read_compaction, read_flush_metrics, read_request
from sessionfold.projections.pruning.config import build_config
from sessionfold.projections.store import DictStore
from sessionfold.streams.cli import fold as fold_cli
from sessionfold.streams.publishing.session_file import read_session_file
from sessionfold.streams.runtime.embedded import EmbeddedRuntime, fold_files
from sessionfold.streams.runtime.step import fold_step

SESSIONS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "sessions"
BEFORE = "before-compaction.jsonl"
LARGE = "large-session.jsonl"
BEFORE_ID = "ffae836b-9420-4060-ac13-7745215f90ff"
LARGE_ID = "d703a1a9-1b7b-4fb1-b512-c9738b1fe617"


@pytest.fixture(scope="module")
def sessions_dir() -> Path:
    """The real sessions beside the repository; skip when ../shared is absent."""
    if not SESSIONS.is_dir():
        pytest.skip(f"real sessions not found at {SESSIONS} (../shared/data/sessions is absent)")
    return SESSIONS


@pytest.fixture(scope="module")
def folded(sessions_dir: Path) -> dict[str, Any]:
    """Both real sessions folded with the default configuration."""
    return fold_files([sessions_dir / BEFORE, sessions_dir / LARGE])


def _row(attempt: dict[str, Any]) -> tuple[str, int, int]:
    m = attempt["metrics"]
    return attempt["outcome"], m["open_cycle_thinking_tokens"], m["frontier_gap_tokens"]


@pytest.mark.parametrize(
    ("session_id", "total", "outcomes", "first_six"),
    [
        (
            BEFORE_ID,
            47,
            {"summarized": 28, "skipped-trivial": 3, "empty": 16},
            [
                ("summarized", 0, 49_629),
                ("empty", 0, 0),
                ("skipped-trivial", 125, 51),
                ("empty", 0, 0),
                ("empty", 0, 0),
                ("summarized", 569, 472),
            ],
        ),
        (
            LARGE_ID,
            84,
            {"summarized": 24, "skipped-trivial": 44, "empty": 16},
            [
                ("empty", 0, 0),
                ("summarized", 0, 14_343),
                ("summarized", 0, 2_550),
                ("summarized", 0, 18_013),
                ("summarized", 0, 13_955),
                ("summarized", 0, 4_579),
            ],
        ),
    ],
)
def test_flush_attempts_match_the_reference_figures(
    folded: dict[str, Any],
    session_id: str,
    total: int,
    outcomes: dict[str, int],
    first_six: list[tuple[str, int, int]],
) -> None:
    """Default config: attempt count, outcomes and the first six entry snapshots are exact."""
    state = folded["sessions"][session_id]
    attempts = state["flush_attempts"]
    assert len(attempts) == total
    assert Counter(a["outcome"] for a in attempts) == outcomes
    assert all(a["trigger"] == "message-end" for a in attempts)
    assert [_row(a) for a in attempts[:6]] == first_six
    assert state["metrics"]["open_cycle_thinking_tokens"] == 0
    assert state["metrics"]["frontier_gap_tokens"] == 0
    assert state["pending_batches"] == 0
    assert state["dead_letters"] == 0


def test_disabled_fold_gives_the_reference_metrics(sessions_dir: Path) -> None:
    """With enabled=false nothing flushes and the final metrics are the reference's."""
    result = fold_files(
        [sessions_dir / BEFORE, sessions_dir / LARGE], build_config({"enabled": False})
    )
    before = result["sessions"][BEFORE_ID]
    large = result["sessions"][LARGE_ID]
    assert before["flush_attempts"] == [] and large["flush_attempts"] == []
    assert before["frontier"] is None
    assert before["metrics"] == {
        "open_cycle_thinking_tokens": 0,
        "largest_chain_share_pct": 12,
        "frontier_gap_tokens": 331_859,
    }
    assert large["metrics"]["frontier_gap_tokens"] == 113_446
    assert before["counts"]["messages"] == {
        "user": 55,
        "assistant": 484,
        "toolResult": 448,
        "bashExecution": 3,
    }


def test_requests_compactions_and_records_are_routed(sessions_dir: Path) -> None:
    """Every request gets one compaction; every attempt one flush-metrics record on its topic."""
    runtime = EmbeddedRuntime()
    for record in read_session_file(sessions_dir / LARGE):
        runtime.publish(record)
    requests = runtime.log["flush-requests"]
    compactions = runtime.log["compaction-events"]
    assert [read_request(r).request_id for r in requests] == [
        c.payload.model_dump()["request_id"] for c in compactions
    ]
    records = [read_flush_metrics(e) for e in runtime.log["flush-metrics"]]
    assert len(records) == 84
    assert len({r.request_id for r in records}) == 84
    assert runtime.store.get(f"{LARGE_ID}/pr/h")["held"] == []


def test_real_session_fed_twice_is_byte_identical(sessions_dir: Path) -> None:
    """Every folded envelope applied twice (pruning and ledger) gives the same store, byte for
    byte; the ledger's passes included."""
    runtime = EmbeddedRuntime()
    for record in read_session_file(sessions_dir / BEFORE):
        runtime.publish(record)
    assert any(key.startswith(f"{BEFORE_ID}/ledger/S/") for key in runtime.store)
    twice = DictStore()
    for envelope in runtime.folded:
        fold_step(twice, envelope, runtime.config)
        fold_step(twice, envelope, runtime.config)
    dump = orjson.OPT_SORT_KEYS
    assert orjson.dumps(dict(twice), option=dump) == orjson.dumps(dict(runtime.store), option=dump)


# --- the fold command ------------------------------------------------------------------------


def _app() -> typer.Typer:
    app = typer.Typer()
    fold_cli.register(app)

    @app.command("noop")
    def _noop() -> None:  # a second command keeps `fold` a named subcommand
        """Nothing."""

    return app


def test_fold_json_is_stable_and_equals_fold_files(sessions_dir: Path) -> None:
    """`fold --json` prints fold_files's result with sorted keys, the same on every run."""
    runner = CliRunner()
    path = str(sessions_dir / LARGE)
    first = runner.invoke(_app(), ["fold", path, "--json"])
    second = runner.invoke(_app(), ["fold", path, "--json"])
    assert first.exit_code == 0, first.output
    assert first.stdout == second.stdout
    assert orjson.loads(first.stdout) == orjson.loads(
        orjson.dumps(fold_files([sessions_dir / LARGE]))
    )


def test_fold_set_enabled_false_folds_with_no_flushes(sessions_dir: Path) -> None:
    """`--set enabled=false` folds without any flush attempt."""
    result = CliRunner().invoke(
        _app(), ["fold", str(sessions_dir / LARGE), "--set", "enabled=false", "--json"]
    )
    assert result.exit_code == 0
    assert orjson.loads(result.stdout)["sessions"][LARGE_ID]["flush_attempts"] == []


def test_fold_invalid_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    """An invalid setting exits with status 2 and names the key."""
    result = CliRunner().invoke(
        _app(), ["fold", str(tmp_path), "--set", "chainCompression.rollingWindow=0"]
    )
    assert result.exit_code == 2
    assert "chainCompression.rollingWindow" in result.output


def test_fold_human_output_has_a_table_per_session(tmp_path: Path) -> None:
    """Without --json one table per session goes to stdout."""
    path = tmp_path / "s.jsonl"
    path.write_text(
        '{"type":"session","version":3,"id":"abc"}\n'
        '{"type":"message","id":"u1","parentId":null,"timestamp":"2026-01-01T00:00:00Z",'
        '"message":{"role":"user","content":"hi","timestamp":1}}\n',
        encoding="utf-8",
    )
    result = CliRunner().invoke(_app(), ["fold", str(path)])
    assert result.exit_code == 0
    assert "session abc" in result.stdout
    assert "flush attempts" in result.stdout


def test_derived_envelopes_survive_the_wire(sessions_dir: Path) -> None:
    """Flush requests, compactions and flush-metrics records round-trip through JSON bytes."""
    runtime = EmbeddedRuntime()
    for record in read_session_file(sessions_dir / BEFORE):
        runtime.publish(record)
    readers = {
        "flush-requests": read_request,
        "compaction-events": read_compaction,
        "flush-metrics": read_flush_metrics,
    }
    for topic, read in readers.items():
        assert runtime.log[topic]
        for envelope in runtime.log[topic][:5]:
            assert read(decode(encode(envelope))) == read(envelope)
