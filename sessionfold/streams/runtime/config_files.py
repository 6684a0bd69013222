"""Pruning settings from files: the TOML reading the pure config module leaves to a runtime."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sessionfold.projections.pruning.config import (
    DEFAULT_CONFIG,
    ConfigError,
    PruneConfig,
    build_config,
    parse_override,
    pruning_table,
)


def load_toml(path: Path | str) -> dict[str, Any]:
    """The settings a TOML file holds: its `[pruning]` table if it has one, else its top level."""
    try:
        document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), f"not valid TOML ({type(exc).__name__})") from None
    return pruning_table(document)


def load_config(
    path: Path | str | None = None,
    overrides: Iterable[str] = (),
    base: PruneConfig = DEFAULT_CONFIG,
) -> PruneConfig:
    """Defaults, then the TOML file if given, then each `key=value` override, validated."""
    layers: list[Mapping[str, Any]] = []
    if path is not None:
        layers.append(load_toml(path))
    layers.extend(parse_override(text) for text in overrides)
    return build_config(*layers, base=base)
