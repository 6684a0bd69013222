"""The pruning configuration (reference §11): defaults, validation, deep merge and overrides.

Keys are pi-condense's camelCase names (`minBatchChars`, `chainCompression.rollingWindow`);
snake_case spellings are accepted as aliases. Unlike pi-condense, an invalid value is an error
naming its key rather than a silent fall-back, nested objects merge deeply, and `enabled` is on by
default (sessionfold is only run to prune). Values are never echoed in errors: only the key and
what was expected.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

#: Largest context window the budget triggers consider (reference §4.1).
MAX_BUDGET_WINDOW = 300_000
#: Per-call result head the summarizer prompt shows (reference §6.1).
RESULT_HEAD_CHARS = 2_000

# Keys pi-condense once wrote and still tolerates in a settings file; ignored here too.
_LEGACY_KEYS = frozenset({"thinkingStrip"})


class ConfigError(ValueError):
    """An invalid pruning configuration; `key` is the dotted key at fault."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(f"invalid config {key}: {problem}")


def _non_negative_int(value: Any) -> Any:
    """Finite numbers >= 0, floored (pi-condense parses these with an integer parse)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("expected a non-negative integer")
    if not math.isfinite(value) or value < 0:
        raise ValueError("expected a non-negative integer")
    return math.floor(value)


def _positive_int(value: Any) -> Any:
    floored = _non_negative_int(value)
    if floored < 1:
        raise ValueError("expected a positive integer")
    return floored


def _optional_positive_int(value: Any) -> Any:
    return None if value is None else _positive_int(value)


def _fraction(value: Any) -> Any:
    """None, or a finite number in (0, 1]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("expected a number in (0, 1] or null")
    if not math.isfinite(value) or not 0 < value <= 1:
        raise ValueError("expected a number in (0, 1] or null")
    return float(value)


def _strict_bool(value: Any) -> Any:
    if not isinstance(value, bool):
        raise ValueError("expected true or false")
    return value


def _model_name(value: Any) -> Any:
    if not isinstance(value, str) or not (value == "offline" or _MODEL_RE.match(value)):
        raise ValueError('expected "offline" or "provider/model-id"')
    return value


def _name_list(value: Any) -> Any:
    """A list of strings; a string is split on commas and whitespace, `none`/`clear` empty it."""
    if isinstance(value, str):
        if value.strip().lower() in {"", "none", "clear"}:
            return []
        return [part for part in re.split(r"[,\s]+", value) if part]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ValueError("expected a list of strings")
    return value


_MODEL_RE = re.compile(r"^[^/\s]+/\S+$")

NonNegInt = Annotated[int, BeforeValidator(_non_negative_int)]
PosInt = Annotated[int, BeforeValidator(_positive_int)]
OptPosInt = Annotated[int | None, BeforeValidator(_optional_positive_int)]
Fraction = Annotated[float | None, BeforeValidator(_fraction)]
Bool = Annotated[bool, BeforeValidator(_strict_bool)]
NameList = Annotated[tuple[str, ...], BeforeValidator(_name_list)]


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class ChainCompressionConfig(_Section):
    """Chain compression (reference §8): kept for the render/compact folds."""

    enabled: Bool = True
    rollingWindow: PosInt = 3
    stripFinalAssistantThinking: Bool = True
    fuseRangeSummary: Bool = True


class PurgeErrorsConfig(_Section):
    """Error purge at render time (reference §7.4)."""

    enabled: Bool = True
    cooldownTurns: PosInt = 2
    minArgChars: NonNegInt = 500


class PruneConfig(_Section):
    """Every pruning option of reference §11 that applies to sessionfold, with its default."""

    enabled: Bool = True
    showPruneStatusLine: Bool = True
    summarizerModel: Annotated[str, BeforeValidator(_model_name)] = "offline"
    summarizerThinking: Literal["default", "off", "minimal", "low", "medium", "high", "xhigh"] = (
        "default"
    )
    summarizerIdleTimeoutMs: NonNegInt = 20_000
    summarizerMaxTimeoutMs: NonNegInt = 180_000
    pruneOn: Literal["agent-message", "on-demand"] = "agent-message"
    batchingMode: Literal["turn", "agent-message"] = "turn"
    quietOversizedSkips: Bool = False
    minBatchChars: NonNegInt = 1_000
    recoveryGraceTurns: NonNegInt = 3
    protectedTools: NameList = ()
    protectedPaths: NameList = ("**/skills/**/*.md",)
    dedupByContentHash: Bool = True
    autoBudgetThreshold: Fraction = None
    budgetTurnDelta: Fraction = None
    #: Window the budget triggers use when no usage event has reported one (sessionfold's own).
    contextWindow: OptPosInt = None
    spillThreshold: PosInt = 65_536
    spillPreviewBytes: NonNegInt = 2_048
    chainCompression: ChainCompressionConfig = Field(default_factory=ChainCompressionConfig)
    purgeErrors: PurgeErrorsConfig = Field(default_factory=PurgeErrorsConfig)


DEFAULT_CONFIG = PruneConfig()

_SECTIONS: dict[str, type[BaseModel]] = {
    "chainCompression": ChainCompressionConfig,
    "purgeErrors": PurgeErrorsConfig,
}


def _camel(name: str) -> str:
    """`min_batch_chars` -> `minBatchChars`; camelCase passes through."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _canonical(raw: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """Keys renamed to camelCase, legacy keys dropped, unknown keys refused by name."""
    model: type[BaseModel] = _SECTIONS.get(where.rstrip("."), PruneConfig) if where else PruneConfig
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if not isinstance(name, str):
            raise ConfigError(f"{where}{name}", "keys must be strings")
        if not where and name in _LEGACY_KEYS:
            continue
        camel = _camel(name)
        if camel not in model.model_fields:
            raise ConfigError(f"{where}{name}", "unknown key")
        if camel in _SECTIONS and not where:
            if not isinstance(value, Mapping):
                raise ConfigError(camel, "expected a table of settings")
            value = _canonical(value, f"{camel}.")
        out[camel] = value
    return out


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` over `base`, merging nested mappings key by key instead of replacing them."""
    merged = dict(base)
    for name, value in override.items():
        current = merged.get(name)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            merged[name] = deep_merge(current, value)
        else:
            merged[name] = value
    return merged


def build_config(*layers: Mapping[str, Any], base: PruneConfig = DEFAULT_CONFIG) -> PruneConfig:
    """The config of `base` with each layer deep-merged over it in turn, validated."""
    merged: dict[str, Any] = base.model_dump()
    for layer in layers:
        merged = deep_merge(merged, _canonical(layer))
    try:
        return PruneConfig.model_validate(merged)
    except ValidationError as exc:
        first = exc.errors()[0]
        dotted = ".".join(str(p) for p in first["loc"] if not isinstance(p, int))
        raise ConfigError(dotted, _problem(first)) from None


def _problem(error: Any) -> str:
    message = str(error.get("msg", "invalid value"))
    return message.removeprefix("Value error, ")


def parse_override(text: str) -> dict[str, Any]:
    """`chainCompression.rollingWindow=5` -> {"chainCompression": {"rollingWindow": 5}}.

    The value is read as JSON (numbers, true/false, null, quoted strings, lists); anything else
    is taken as a plain string.
    """
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ConfigError(name or text.strip() or "?", "expected key=value")
    parts = name.split(".")
    if any(not p for p in parts):
        raise ConfigError(name, "empty key segment")
    parsed = _literal(value.strip())
    for part in reversed(parts[1:]):
        parsed = {part: parsed}
    return {parts[0]: parsed}


def _literal(value: str) -> Any:
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return value


def pruning_table(document: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a parsed TOML document holds: its `[pruning]` table if it has one, else its
    top level (reading the file is `streams.runtime.config_files`')."""
    pruning = document.get("pruning")
    return dict(pruning) if isinstance(pruning, Mapping) else dict(document)
