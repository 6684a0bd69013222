"""`sessionfold compare` and `sessionfold context FILE` on a generated session."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from sessionfold.projections.jsjson import js_json_length
from sessionfold.projections.pruning.config import ConfigError
from sessionfold.streams.cli import app
from sessionfold.streams.tools.compare import config_of, split_settings, summary
from sessionfold.streams.tools.synthetic import generate_session, write_session

TURNS = 60
B_SETTINGS = "chainCompression.rollingWindow=1,minBatchChars=0"


@pytest.fixture(scope="module")
def session_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One generated session of 60 assistant messages."""
    return write_session(tmp_path_factory.mktemp("compare"), generate_session(3, TURNS)).path


def test_split_settings_keeps_lists_and_quotes_whole() -> None:
    """Commas inside brackets, braces or quotes do not split a setting."""
    text = 'a=1, protectedTools=["read","bash"],b.c={"x":1,"y":2},d="x,y"'
    assert split_settings(text) == [
        "a=1",
        'protectedTools=["read","bash"]',
        'b.c={"x":1,"y":2}',
        'd="x,y"',
    ]
    assert config_of(['protectedTools=["read","bash"],minBatchChars=5']).protectedTools == (
        "read",
        "bash",
    )
    with pytest.raises(ConfigError):
        config_of(["noSuchKey=1"])


def test_summary_nearest_rank() -> None:
    """mean, nearest-rank p50, max, and the final value as given."""
    assert summary([5, 1, 3, 4], 9) == {"mean": 3.2, "p50": 3, "max": 5, "final": 9}
    assert summary([], 0) == {"mean": 0, "p50": 0, "max": 0, "final": 0}


def test_compare_json_and_chart(session_file: Path, tmp_path: Path) -> None:
    """Per-turn tokens under A and B, the same flushes, B's extra summaries as model calls, and
    a PNG chart written where asked."""
    chart = tmp_path / "out" / "tokens.png"
    result = CliRunner().invoke(
        app,
        ["compare", str(session_file), "--b", B_SETTINGS, "--chart", str(chart), "--json"],
    )
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.stdout)
    (session_id,) = data["a"]["sessions"]
    a, b = data["a"]["sessions"][session_id], data["b"]["sessions"][session_id]
    unpruned = data["unpruned"]["sessions"][session_id]
    assert data["a"]["settings"] == [] and data["b"]["settings"] == [B_SETTINGS]
    assert len(a["tokens_per_turn"]) == len(b["tokens_per_turn"]) == TURNS
    assert all(
        x <= y for x, y in zip(a["tokens_per_turn"], unpruned["tokens_per_turn"], strict=True)
    )
    assert a["summary"]["final"] < unpruned["summary"]["final"]
    assert b["summary"]["final"] <= a["summary"]["final"]
    assert a["flushes"] == b["flushes"] > 0
    assert b["model_calls"] >= a["model_calls"] > 0
    assert data["a"]["totals"]["model_calls"] == a["model_calls"]
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_table(session_file: Path) -> None:
    """The human output names both configurations and every measure."""
    result = CliRunner().invoke(app, ["compare", str(session_file), "--b", B_SETTINGS])
    assert result.exit_code == 0, result.output
    for text in ("A: defaults", f"B: {B_SETTINGS}", "tokens/turn p50", "model calls", "cost"):
        assert text in result.stdout


def test_compare_refuses_bad_settings_and_chart_paths(session_file: Path) -> None:
    """An unknown key or a chart that is not a .png is a usage error (exit 2)."""
    bad = CliRunner().invoke(app, ["compare", str(session_file), "--a", "nope=1"])
    assert bad.exit_code == 2 and "nope" in bad.output
    chart = CliRunner().invoke(app, ["compare", str(session_file), "--chart", "x.jpg"])
    assert chart.exit_code == 2


def test_context_file_json_and_text(session_file: Path) -> None:
    """`context FILE --format json` gives the messages and both token counts; the text format
    ends with the same two numbers; a turn past the end exits 1."""
    result = CliRunner().invoke(app, ["context", str(session_file), "--format", "json"])
    assert result.exit_code == 0, result.output
    view = orjson.loads(result.stdout)
    assert set(view) == {"messages", "tokens", "repairs"}
    tokens = sum((js_json_length(m) + 2) // 4 for m in view["messages"])
    assert view["tokens"]["pruned"] == tokens
    assert view["tokens"]["pruned"] < view["tokens"]["unpruned"]
    text = CliRunner().invoke(app, ["context", str(session_file), "--turn", "30"])
    assert text.exit_code == 0, text.output
    assert "tokens the model sees:" in text.stdout
    past = CliRunner().invoke(app, ["context", str(session_file), "--turn", str(TURNS)])
    assert past.exit_code == 1 and "past the end" in past.output
