"""`sessionfold demo`: the main job runs on the embedded default and reports."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from sessionfold.streams.cli import app


def test_demo_on_a_generated_session_reports_flushes_and_metrics() -> None:
    """With no file the demo folds a generated session and prints all three report parts."""
    result = CliRunner().invoke(app, ["demo", "--turns", "80", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert "flush attempts:" in result.stdout
    assert "after pruning" in result.stdout
    assert "frontier gap" in result.stdout


def test_demo_with_pruning_off_makes_no_attempt() -> None:
    """--set enabled=false folds with no flush attempt."""
    result = CliRunner().invoke(app, ["demo", "--turns", "40", "--set", "enabled=false"])
    assert result.exit_code == 0, result.output
    assert "flush attempts: 0" in result.stdout


def test_demo_on_a_real_session(shared_sessions: Path) -> None:
    """A real pi file works as the demo's input."""
    result = CliRunner().invoke(app, ["demo", str(shared_sessions / "large-session.jsonl")])
    assert result.exit_code == 0, result.output
    assert "toolResult 373" in result.stdout


def test_demo_refuses_a_missing_file_and_a_bad_setting(tmp_path: Path) -> None:
    """A missing file and an invalid setting are usage errors (exit 2)."""
    runner = CliRunner()
    assert runner.invoke(app, ["demo", str(tmp_path / "nope.jsonl")]).exit_code == 2
    assert runner.invoke(app, ["demo", "--set", "minBatchChars=-1"]).exit_code == 2
