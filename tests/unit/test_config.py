"""The pruning configuration: defaults, validation naming the key, deep merge, TOML, overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionfold.projections.pruning.config import (
    DEFAULT_CONFIG,
    ConfigError,
    build_config,
    deep_merge,
    parse_override,
)
from sessionfold.streams.runtime.config_files import load_config


def test_defaults_match_the_reference_except_enabled() -> None:
    """Defaults are pi-condense's, with pruning enabled and the offline summarizer."""
    config = DEFAULT_CONFIG
    assert config.enabled is True
    assert config.summarizerModel == "offline"
    assert config.pruneOn == "agent-message"
    assert config.batchingMode == "turn"
    assert config.minBatchChars == 1000
    assert config.recoveryGraceTurns == 3
    assert config.protectedTools == ()
    assert config.protectedPaths == ("**/skills/**/*.md",)
    assert config.dedupByContentHash is True
    assert config.autoBudgetThreshold is None and config.budgetTurnDelta is None
    assert config.spillThreshold == 65536 and config.spillPreviewBytes == 2048
    assert config.summarizerIdleTimeoutMs == 20000 and config.summarizerMaxTimeoutMs == 180000
    assert config.chainCompression.rollingWindow == 3
    assert config.purgeErrors.cooldownTurns == 2 and config.purgeErrors.minArgChars == 500


def test_nested_objects_merge_deeply() -> None:
    """A partial nested object keeps the nested defaults it does not name."""
    config = build_config({"chainCompression": {"rollingWindow": 5}})
    assert config.chainCompression.rollingWindow == 5
    assert config.chainCompression.enabled is True
    assert config.chainCompression.fuseRangeSummary is True


def test_deep_merge_replaces_leaves_and_merges_tables() -> None:
    """deep_merge merges mappings key by key and replaces everything else."""
    merged = deep_merge({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"c": 3}, "l": [2]})
    assert merged == {"a": {"b": 1, "c": 3}, "l": [2]}


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("enabled=yes", "enabled"),
        ("minBatchChars=-1", "minBatchChars"),
        ("autoBudgetThreshold=1.5", "autoBudgetThreshold"),
        ("budgetTurnDelta=0", "budgetTurnDelta"),
        ("pruneOn=every-turn", "pruneOn"),
        ("batchingMode=message", "batchingMode"),
        ("summarizerModel=gpt", "summarizerModel"),
        ("chainCompression.rollingWindow=0", "chainCompression.rollingWindow"),
        ("purgeErrors.cooldownTurns=0", "purgeErrors.cooldownTurns"),
        ("spillThreshold=0", "spillThreshold"),
        ("noSuchKey=1", "noSuchKey"),
        ("purgeErrors.nope=1", "purgeErrors.nope"),
        ("chainCompression=3", "chainCompression"),
    ],
)
def test_invalid_values_raise_an_error_naming_the_key(override: str, key: str) -> None:
    """Every invalid value is refused with its dotted key in the error."""
    with pytest.raises(ConfigError) as caught:
        load_config(overrides=[override])
    assert caught.value.key == key
    assert key in str(caught.value)


def test_numbers_are_floored_and_zero_kept() -> None:
    """Non-negative numbers are floored; 0 disables a feature rather than meaning the default."""
    config = load_config(overrides=["recoveryGraceTurns=2.7", "minBatchChars=0"])
    assert config.recoveryGraceTurns == 2
    assert config.minBatchChars == 0


def test_overrides_parse_json_literals_dotted_keys_and_lists() -> None:
    """key=value reads JSON literals, dotted keys nest, comma lists split, snake_case works."""
    assert parse_override("a.b.c=5") == {"a": {"b": {"c": 5}}}
    config = load_config(
        overrides=[
            "enabled=false",
            "auto_budget_threshold=0.8",
            "protectedTools=read, bash",
            "protectedPaths=none",
            'summarizerModel="openai/gpt-4o-mini"',
        ]
    )
    assert config.enabled is False
    assert config.autoBudgetThreshold == 0.8
    assert config.protectedTools == ("read", "bash")
    assert config.protectedPaths == ()
    assert config.summarizerModel == "openai/gpt-4o-mini"


def test_override_without_equals_is_refused() -> None:
    """An override that is not key=value names itself in the error."""
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_override("enabled")


def test_toml_file_then_overrides(tmp_path: Path) -> None:
    """A TOML file's [pruning] table applies, then overrides win over it."""
    path = tmp_path / "sessionfold.toml"
    path.write_text(
        "[pruning]\nminBatchChars = 500\n[pruning.purgeErrors]\nminArgChars = 100\n",
        encoding="utf-8",
    )
    config = load_config(path, ["minBatchChars=700"])
    assert config.minBatchChars == 700
    assert config.purgeErrors.minArgChars == 100
    assert config.purgeErrors.enabled is True


def test_toml_top_level_and_legacy_key(tmp_path: Path) -> None:
    """Top-level keys apply without a [pruning] table; a stale thinkingStrip is ignored."""
    path = tmp_path / "c.toml"
    path.write_text('pruneOn = "on-demand"\n[thinkingStrip]\nenabled = true\n', encoding="utf-8")
    assert load_config(path).pruneOn == "on-demand"


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    """A file that is not TOML is a ConfigError naming the file."""
    path = tmp_path / "bad.toml"
    path.write_text("enabled = = true", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.key == str(path)
