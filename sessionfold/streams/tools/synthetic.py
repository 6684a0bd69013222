"""Synthetic pi sessions (format v3) shaped like real ones, for load tests and fold tests.

A session is planned first (how many assistant messages each chain gets, how each chain ends,
which user prompts state or withdraw standing rules) and then played out message by message, so
the number of assistant messages is exactly what was asked for. Everything is drawn from one
`random.Random` per session, seeded from the fleet seed: no wall clock, no `uuid4`, no hash
order, so the same seed gives byte-identical files. Session `i` of a fleet does not depend on how
many sessions the fleet has.

The numbers below were fitted to the two real sessions described in
reference/pi-session-format.md §5 (tool mix, tool output sizes, chain lengths, abort rate,
timing). All text comes from the word lists here; nothing is copied from a real session.
"""

from __future__ import annotations

import base64
import bisect
import itertools
import json
import math
import random
import string
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

Entry = dict[str, Any]
_T = TypeVar("_T")

SESSION_VERSION = 3
MAX_TOOL_OUTPUT = 50_000  # pi cuts read and bash output at 50 KB; the real maximum is ~51k
SYSTEM_PROMPT_TOKENS = 8_000
TOKENS_PER_CHAR = 1.3 / 4  # real usage runs ~1.3x the chars/4 estimate
TOOL_WEIGHTS: dict[str, float] = {"bash": 0.45, "edit": 0.28, "read": 0.24, "write": 0.03}

_EPOCH_MS = 1_756_684_800_000  # 2025-09-01T00:00:00Z; sessions start within 120 days of it
_DAY_MS = 86_400_000
_BLOCK_POOL = 80  # distinct code blocks per file kind and session
_STATEMENT_POOL = 300  # distinct code lines per session for grep hits, diffs and tracebacks
_ROW_POOL = 300  # distinct output blocks per bash command kind and session
_CACHE_TTL_MS = 300_000  # prompt caches expire after five minutes of silence

# --- word lists ------------------------------------------------------------------------------

_NOUNS = (
    "cache", "ledger", "session", "frontier", "batch", "rule", "config", "parser", "token",
    "window", "budget", "event", "stream", "topic", "offset", "summary", "message", "entry",
    "snapshot", "report", "metric", "worker", "queue", "schema", "index", "record", "buffer",
    "layout", "theme", "editor", "selector", "command", "option", "handler", "client", "store",
    "payload", "chunk", "cursor", "limit", "retry", "timeout", "digest", "span", "marker",
    "label", "tree", "branch", "node", "prompt", "model", "provider", "usage", "result",
    "header", "footer", "column", "source", "target", "profile",
)  # fmt: skip
_VERBS = (
    "load", "parse", "build", "fold", "flush", "merge", "render", "resolve", "apply", "emit",
    "collect", "validate", "normalize", "split", "compact", "prune", "replay", "publish",
    "encode", "decode", "read", "write", "fetch", "update", "reset", "track", "count", "select",
    "format", "migrate", "drain", "sort", "filter", "wrap", "trim",
)  # fmt: skip
_ADJS = (
    "pending", "stale", "empty", "recent", "raw", "partial", "nested", "cached", "current",
    "default", "legacy", "missing", "invalid", "large", "small", "final", "first", "last",
    "next", "shared", "unknown", "duplicate", "orphan", "sorted", "active",
)  # fmt: skip
_PACKAGES = (
    "ledger", "harbor", "quill", "lantern", "orchard", "beacon", "tandem", "pebble", "relay",
    "meridian", "compass", "atlas", "cinder", "fathom", "kestrel", "tiller", "juniper",
)  # fmt: skip
_MODULES = (
    "core", "cli", "io", "models", "store", "render", "config", "util", "events", "api",
    "workers", "parsing", "views", "sync",
)  # fmt: skip
_USERS = ("alex", "sam", "dana", "riley", "jordan", "kim", "mika", "noor", "tomas", "ines")
_PY_TYPES = ("str", "int", "bool", "Path", "list[str]", "dict[str, Any]", "float", "bytes")
_TS_TYPES = ("string", "number", "boolean", "string[]", "Record<string, unknown>", "void")
_PY_LITERALS = ("None", "0", "1", "True", "False", '""', "[]", "{}", "-1")
_TS_LITERALS = ("null", "0", "1", "true", "false", '""', "[]", "undefined")
_PY_ERRORS = (
    "ValueError", "KeyError", "TypeError", "AttributeError", "AssertionError", "RuntimeError",
    "FileNotFoundError", "IndexError",
)  # fmt: skip
_TS_ERRORS = ("TypeError", "RangeError", "Error", "SyntaxError")
_STDLIB = ("json", "os", "re", "sys", "time", "shutil", "itertools", "functools", "hashlib")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

_SENTENCES = (
    "{V} the {a} {n} before {ving} the {n2}",
    "the {n} is {a} when the {n2} {vs} twice",
    "we {v} each {n} once and keep the {a} ones",
    "if the {n} is {a}, {v} it from the {n2} instead",
    "this keeps the {n} {a} across {n2} boundaries",
    "{v} the {n} so the {n2} stays {a}",
    "{f} already handles the {a} case",
    "the {n2} test covers the {a} {n}",
    "nothing {vs} the {n} after the {n2} closes",
    "the {a} {n} has to survive a {n2} restart",
    "{ving} the {n} twice would double the {n2}",
    "the {n2} only needs the {a} {n}, not the whole {n3}",
    "{f} {vs} the {n} but never the {n2}",
    "a {a} {n} can reach the {n2} before the {n3}",
)  # fmt: skip


def _verb_s(verb: str) -> str:
    return verb + "es" if verb.endswith(("sh", "ch", "s", "x")) else verb + "s"


def _verb_ing(verb: str) -> str:
    return verb[:-1] + "ing" if verb.endswith("e") and not verb.endswith("ee") else verb + "ing"


_VERB_S = {v: _verb_s(v) for v in _VERBS}
_VERB_ING = {v: _verb_ing(v) for v in _VERBS}


# --- standing rules --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StandingRule:
    """A rule a user can state ("from now on ...") and later withdraw ("forget the rule ...")."""

    topic: str
    statements: tuple[str, ...]
    withdrawals: tuple[str, ...]


RULES: tuple[StandingRule, ...] = (
    StandingRule(
        "-x",
        ("from now on run the tests with -x", "always run pytest with -x so it stops early"),
        ("you can drop the -x when running tests", "forget what I said about -x, run it all"),
    ),
    StandingRule(
        "main",
        ("never push to main", "never push directly to main, open a branch instead"),
        ("you can push to main again", "the rule about pushing to main no longer applies"),
    ),
    StandingRule(
        "tabs",
        ("always use tabs in Makefiles", "from now on indent Makefiles with tabs, never spaces"),
        ("forget the rule about tabs", "you can ignore the rule about tabs in Makefiles"),
    ),
    StandingRule(
        "dependencies",
        ("never add a new dependency without asking me first",),
        ("forget what I said about dependencies, add what you need",),
    ),
    StandingRule(
        "ruff",
        ("from now on run ruff check before you say you're done", "always run ruff format"),
        ("you can ignore the rule about ruff, it's too slow here", "forget the ruff rule"),
    ),
    StandingRule(
        "commit messages",
        ("always write commit messages in the imperative mood",),
        ("forget the rule about commit messages, any style is fine",),
    ),
    StandingRule(
        "print",
        ("never leave print statements in the code, use the logger",),
        ("you can ignore the rule about print statements for the scripts/ folder",),
    ),
    StandingRule(
        "type hints",
        ("from now on every new function gets type hints",),
        ("forget what I said about type hints for the tests",),
    ),
    StandingRule(
        "force",
        ("never use git push --force",),
        ("the rule about force pushes no longer applies, this branch is mine",),
    ),
    StandingRule(
        "changelog",
        ("from now on add a CHANGELOG.md line for every user-visible change",),
        ("forget the changelog rule, we generate it from commits now",),
    ),
    StandingRule(
        "sudo",
        ("never run anything with sudo",),
        ("you can ignore the rule about sudo for the docker commands",),
    ),
    StandingRule(
        "tests/unit",
        ("always put new tests under tests/unit",),
        ("forget what I said about tests/unit, put tests next to the code",),
    ),
    StandingRule(
        "line length",
        ("always keep lines under 100 characters",),
        ("forget the rule about line length, the formatter handles it",),
    ),
)


# --- models ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Model:
    provider: str
    model: str
    api: str
    id_style: str  # "toolu": random Anthropic ids; "call": OpenAI ids; "counter": name_n
    prices: tuple[float, float, float, float]  # USD per million: input, output, read, write


_MODELS = (
    _Model("anthropic", "claude-sonnet-4-5", "anthropic-messages", "toolu", (3, 15, 0.3, 3.75)),
    _Model("anthropic", "claude-opus-4-5", "anthropic-messages", "toolu", (5, 25, 0.5, 6.25)),
    _Model("openai", "gpt-5.1-codex", "openai-responses", "call", (1.25, 10, 0.125, 0)),
    _Model("google", "gemini-2.5-pro", "google-generative-ai", "counter", (1.25, 10, 0.31, 0)),
    _Model("ollama", "qwen3-coder:30b", "openai-completions", "counter", (0, 0, 0, 0)),
)
_MODEL_WEIGHTS = (0.35, 0.25, 0.12, 0.18, 0.10)
_THINKING_LEVELS = ("off", "minimal", "low", "medium", "high")
_THINKING_WEIGHTS = (0.35, 0.1, 0.15, 0.25, 0.15)
_THINKING_RATE = {"off": 0.0, "minimal": 0.05, "low": 0.12, "medium": 0.2, "high": 0.3}


# --- small random helpers --------------------------------------------------------------------


def _pick(rng: random.Random, options: Sequence[_T]) -> _T:
    # random.choice costs ~1 us a call through _randbelow; this draw is several times cheaper
    # and generation makes hundreds of thousands of them
    return options[int(rng.random() * len(options))]


def _between(rng: random.Random, low: int, high: int) -> int:
    # randint, without the cost of _randbelow (same reason as _pick)
    return low + int(rng.random() * (high - low + 1))


def _lognormal_int(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return max(low, min(high, int(rng.lognormvariate(math.log(median), sigma))))


def _alnum(rng: random.Random, size: int) -> str:
    return "".join(rng.choices(_ALNUM, k=size))


def _hex(rng: random.Random, size: int) -> str:
    return f"{rng.getrandbits(4 * size):0{size}x}"


def _snake(rng: random.Random) -> str:
    return f"{_pick(rng, _VERBS)}_{_pick(rng, _NOUNS)}"


def _camel(rng: random.Random) -> str:
    return f"{_pick(rng, _VERBS)}{_pick(rng, _NOUNS).capitalize()}"


def _pascal(rng: random.Random) -> str:
    return f"{_pick(rng, _ADJS).capitalize()}{_pick(rng, _NOUNS).capitalize()}"


def _slot(rng: random.Random, key: str) -> str:
    if key[0] == "n":
        return _pick(rng, _NOUNS)
    if key == "a":
        return _pick(rng, _ADJS)
    if key == "v":
        return _pick(rng, _VERBS)
    if key == "V":
        return _pick(rng, _VERBS).capitalize()
    if key == "vs":
        return _VERB_S[_pick(rng, _VERBS)]
    if key == "ving":
        return _VERB_ING[_pick(rng, _VERBS)]
    return f"`{_snake(rng)}`"


# templates split once into (literal, slot) pairs: str.format per sentence was a hot spot
_SENTENCE_PARTS = tuple(
    tuple((literal, key or "") for literal, key, _, _ in string.Formatter().parse(template))
    for template in _SENTENCES
)


def _sentence(rng: random.Random) -> str:
    text = "".join(
        literal + _slot(rng, key) if key else literal
        for literal, key in _pick(rng, _SENTENCE_PARTS)
    )
    return text[0].upper() + text[1:] + "."


def _paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(_sentence(rng) for _ in range(sentences))


def _text_of_size(rng: random.Random, target: int, make: Callable[[], str], sep: str) -> str:
    parts: list[str] = []
    size = 0
    while size < target:
        part = make()
        parts.append(part)
        size += len(part) + len(sep)
    return sep.join(parts)


# --- source files ----------------------------------------------------------------------------


def _python_statement(rng: random.Random, depth: int) -> list[str]:
    ind = "    " * depth
    name = _pick(rng, _NOUNS)
    roll = rng.random()
    if roll < 0.3:
        return [f"{ind}{name} = {_snake(rng)}({_pick(rng, _NOUNS)})"]
    if roll < 0.42:
        return [f"{ind}if {name} is None:", f"{ind}    return {_pick(rng, _PY_LITERALS)}"]
    if roll < 0.52:
        return [
            f"{ind}for {name} in {name}s:",
            f"{ind}    {name}.{_pick(rng, _VERBS)}({_pick(rng, _NOUNS)})",
        ]
    if roll < 0.6:
        return [f"{ind}# {_sentence(rng)}"]
    if roll < 0.7:
        keyword = _pick(rng, _ADJS)
        return [f"{ind}{name}.{_pick(rng, _VERBS)}({_pick(rng, _NOUNS)}, {keyword}={keyword})"]
    if roll < 0.78:
        error = _pick(rng, _PY_ERRORS)
        return [
            f"{ind}if not {name}:",
            f'{ind}    raise {error}(f"{_pick(rng, _ADJS)} {name}: {{{name}!r}}")',
        ]
    if roll < 0.86:
        return [f'{ind}log.debug("{_VERB_ING[_pick(rng, _VERBS)]} {name} %s", {name})']
    if roll < 0.95:
        item = _pick(rng, _NOUNS)
        return [f"{ind}{name}s = [{_snake(rng)}(x) for x in {item}s if x.{_pick(rng, _ADJS)}]"]
    return [
        f'{ind}with open({name}_path, encoding="utf-8") as handle:',
        f"{ind}    {name} = handle.read()",
    ]


def _statements(
    rng: random.Random,
    statement: Callable[[random.Random, int], list[str]],
    depth: int,
    count: tuple[int, int],
) -> list[str]:
    """A body of between `count[0]` and `count[1]` statements at indent `depth`."""
    lines: list[str] = []
    for _ in range(_between(rng, *count)):
        lines.extend(statement(rng, depth))
    return lines


def _python_block(rng: random.Random) -> list[str]:
    if rng.random() < 0.15:
        attr = _pick(rng, _NOUNS)
        lines = [
            f"class {_pascal(rng)}:",
            f'    """{_sentence(rng)}"""',
            "",
            f"    def __init__(self, {attr}: {_pick(rng, _PY_TYPES)}) -> None:",
            f"        self.{attr} = {attr}",
            "",
        ]
        for _ in range(_between(rng, 1, 3)):
            arg = _pick(rng, _NOUNS)
            lines.append(f"    def {_snake(rng)}(self, {arg}: {_pick(rng, _PY_TYPES)}) -> bool:")
            lines.extend(_statements(rng, _python_statement, 2, (1, 5)))
            lines.extend([f"        return self.{attr} is not None", ""])
        return [*lines, ""]
    first, second = _pick(rng, _NOUNS), _pick(rng, _NOUNS)
    lines = [
        f"def {_snake(rng)}({first}: {_pick(rng, _PY_TYPES)}, "
        f"{second}: {_pick(rng, _PY_TYPES)} = {_pick(rng, _PY_LITERALS)}) -> "
        f"{_pick(rng, _PY_TYPES)}:",
        f'    """{_sentence(rng)}"""',
    ]
    lines.extend(_statements(rng, _python_statement, 1, (2, 8)))
    return [*lines, f"    return {first}", "", ""]


def _python_header(rng: random.Random, package: str) -> list[str]:
    return [
        f'"""{_sentence(rng)}"""',
        "",
        "from __future__ import annotations",
        "",
        "import logging",
        f"import {_pick(rng, _STDLIB)}",
        "from pathlib import Path",
        "from typing import Any",
        "",
        f"from {package}.{_pick(rng, _MODULES)} import {_pascal(rng)}, {_snake(rng)}",
        "",
        "log = logging.getLogger(__name__)",
        "",
        "",
    ]


def _ts_statement(rng: random.Random, depth: int) -> list[str]:
    ind = "\t" * depth
    name = _pick(rng, _NOUNS)
    roll = rng.random()
    if roll < 0.3:
        return [f"{ind}const {name} = {_camel(rng)}({_pick(rng, _NOUNS)});"]
    if roll < 0.45:
        return [f"{ind}if (!{name}) {{", f"{ind}\treturn {_pick(rng, _TS_LITERALS)};", f"{ind}}}"]
    if roll < 0.57:
        return [
            f"{ind}for (const {name} of {name}s) {{",
            f"{ind}\t{name}.{_camel(rng)}({_pick(rng, _NOUNS)});",
            f"{ind}}}",
        ]
    if roll < 0.67:
        return [f"{ind}// {_sentence(rng)}"]
    if roll < 0.8:
        return [f"{ind}this.{name} = {_camel(rng)}(this.{_pick(rng, _NOUNS)}, {name});"]
    if roll < 0.9:
        return [
            f"{ind}throw new {_pick(rng, _TS_ERRORS)}(`{_pick(rng, _ADJS)} {name}: ${{{name}}}`);"
        ]
    return [f"{ind}await this.{_camel(rng)}({{ {name}, {_pick(rng, _NOUNS)} }});"]


def _ts_block(rng: random.Random) -> list[str]:
    name = _pick(rng, _NOUNS)
    if rng.random() < 0.3:
        lines = [
            f"export class {_pascal(rng)} {{",
            f"\tprivate {name}: {_pick(rng, _TS_TYPES)};",
            "",
        ]
        for _ in range(_between(rng, 1, 3)):
            lines.append(f"\t{_camel(rng)}({name}: {_pick(rng, _TS_TYPES)}): void {{")
            lines.extend(_statements(rng, _ts_statement, 2, (1, 5)))
            lines.extend(["\t}", ""])
        return [*lines, "}", ""]
    lines = [
        f"/** {_sentence(rng)} */",
        f"export function {_camel(rng)}({name}: {_pick(rng, _TS_TYPES)}): "
        f"{_pick(rng, _TS_TYPES)} {{",
    ]
    lines.extend(_statements(rng, _ts_statement, 1, (2, 8)))
    return [*lines, f"\treturn {name};", "}", ""]


def _ts_header(rng: random.Random, package: str) -> list[str]:
    return [
        f'import {{ {_pascal(rng)}, type {_pascal(rng)} }} from "./{_pick(rng, _MODULES)}.js";',
        'import * as fs from "node:fs";',
        'import { join } from "node:path";',
        f'import type {{ {_pascal(rng)} }} from "@{package}/core";',
        "",
    ]


def _markdown_block(rng: random.Random) -> list[str]:
    roll = rng.random()
    if roll < 0.4:
        return [_paragraph(rng, _between(rng, 2, 5)), ""]
    if roll < 0.7:
        return [f"- {_sentence(rng)}" for _ in range(_between(rng, 2, 6))] + [""]
    if roll < 0.85:
        return [f"## {_pick(rng, _ADJS).capitalize()} {_pick(rng, _NOUNS)}s", ""]
    return [
        "```bash",
        f"{_pick(rng, _PACKAGES)} {_pick(rng, _VERBS)} --{_pick(rng, _NOUNS)}",
        "```",
        "",
    ]


def _config_block(rng: random.Random) -> list[str]:
    section = f"[tool.{_pick(rng, _PACKAGES)}.{_pick(rng, _NOUNS)}]"
    keys = [
        f"{_pick(rng, _NOUNS)}_{_pick(rng, _NOUNS)} = {_between(rng, 1, 500)}" for _ in range(4)
    ]
    return [section, *keys, ""]


def _file_kind(path: str) -> str:
    return {"py": "python", "ts": "typescript", "md": "markdown"}.get(
        path.rsplit(".", 1)[-1], "config"
    )


@dataclass
class _Project:
    """The files one session works on; their lines are drawn on first use and then kept."""

    rng: random.Random
    root: str
    language: str
    package: str
    files: list[str]
    lines: dict[str, list[str]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # chars, to grow files cheaply
    declared: dict[str, int] = field(default_factory=dict)  # total lines a read reports
    pool: dict[str, list[tuple[list[str], int]]] = field(default_factory=dict)  # (block, chars)
    statements: list[str] = field(default_factory=list)

    def file_lines(self, path: str, at_least: int) -> list[str]:
        """The lines of a file, grown (and kept) until they hold `at_least` characters."""
        lines = self.lines.get(path)
        if lines is None:
            lines = self._header(path)
            self.lines[path] = lines
            self.sizes[path] = sum(len(line) + 1 for line in lines)
        kind = _file_kind(path)
        while self.sizes[path] < at_least:
            block, size = self._block(kind)
            lines.extend(block)
            self.sizes[path] += size
        return lines

    def _header(self, path: str) -> list[str]:
        kind = _file_kind(path)
        if kind == "python":
            return _python_header(self.rng, self.package)
        if kind == "typescript":
            return _ts_header(self.rng, self.package)
        if kind == "markdown":
            return [f"# {self.package.capitalize()} {Path(path).stem}", ""]
        return []

    def _block(self, kind: str) -> tuple[list[str], int]:
        # A session's files share a pool of blocks: drawing fresh code for every line read
        # would dominate generation time, and a project repeating its own idioms is realistic.
        pool = self.pool.setdefault(kind, [])
        if len(pool) < _BLOCK_POOL:
            block = self._fresh_block(kind)
            pool.append((block, sum(len(line) + 1 for line in block)))
            return pool[-1]
        return _pick(self.rng, pool)

    def _fresh_block(self, kind: str) -> list[str]:
        if kind == "python":
            return _python_block(self.rng)
        if kind == "typescript":
            return _ts_block(self.rng)
        if kind == "markdown":
            return _markdown_block(self.rng)
        return _config_block(self.rng)

    def source_path(self) -> str:
        """A file of the project: mostly code, a few docs and one config file."""
        return _pick(self.rng, self.files)

    def test_path(self) -> str:
        """A test file path of the project's language."""
        name = _pick(self.rng, _NOUNS)
        if self.language == "python":
            return f"tests/unit/test_{name}.py"
        return f"test/{name}.test.ts"

    def code_line(self) -> str:
        """One plausible line of code, stripped, for grep hits and tracebacks."""
        if len(self.statements) >= _STATEMENT_POOL:
            return _pick(self.rng, self.statements)
        if self.language == "python":
            line = _python_statement(self.rng, 1)[0].strip()
        else:
            line = _ts_statement(self.rng, 1)[0].strip()
        self.statements.append(line)
        return line


def _new_project(rng: random.Random) -> _Project:
    package = _pick(rng, _PACKAGES)
    language = "python" if rng.random() < 0.6 else "typescript"
    user = _pick(rng, _USERS)
    root = _pick(rng, (f"/home/{user}/src/{package}", f"/Users/{user}/work/{package}"))
    ext = "py" if language == "python" else "ts"
    base = f"src/{package}" if language == "python" else "src"
    files = sorted({f"{base}/{_pick(rng, _MODULES)}/{_pick(rng, _NOUNS)}.{ext}" for _ in range(40)})
    files += [f"docs/{_pick(rng, _NOUNS)}.md" for _ in range(3)] + ["README.md"]
    files.append("pyproject.toml" if language == "python" else "tsconfig.json")
    return _Project(rng=rng, root=root, language=language, package=package, files=files)


# --- tool actions ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Action:
    """One tool call and the text it returned (saved unless the call is left an orphan)."""

    name: str
    arguments: dict[str, Any]
    result: str
    is_error: bool = False
    details: dict[str, Any] | None = None
    duration_ms: int = 5


def _bash_size(rng: random.Random) -> int:
    return _lognormal_int(rng, 320, 1.8, 1, 2 * MAX_TOOL_OUTPUT)


def _read_size(rng: random.Random) -> int:
    return _lognormal_int(rng, 1700, 1.25, 40, 2 * MAX_TOOL_OUTPUT)


def _clamped(text: str, note: str, limit: int) -> str:
    """Text cut to `limit` characters, keeping the tail the way pi's bash tool does."""
    if len(text) <= limit:
        return text
    keep = limit - len(note) - 2
    tail = text[-keep:]
    newline = tail.find("\n")
    if 0 <= newline < 400:
        tail = tail[newline + 1 :]
    return f"{note}\n\n{tail}"


class _Bash:
    """Commands and their output, sized to a target drawn from the real distribution."""

    def __init__(self, rng: random.Random, project: _Project) -> None:
        self.rng = rng
        self.project = project
        self.pools: dict[str, list[tuple[list[str], int]]] = {}

    def action(self, fail: bool) -> _Action:
        """A bash call whose output is about as long as a real one of its kind."""
        rng = self.rng
        target = _bash_size(rng)
        if target < 90 and not fail:
            command, output, code = self._quiet()
        else:
            kinds = self._failing_kinds() if fail else self._passing_kinds()
            command, output, code = _pick(rng, kinds)(target, fail)
        if rng.random() < 0.12:
            command = f"cd {self.project.root} && {command}"
        return self._finished(command, output, code)

    def _fill(
        self,
        kind: str,
        head: list[str],
        body: Callable[[], list[str]],
        tail: list[str],
        target: int,
    ) -> str:
        """`head`, then body blocks until the text reaches `target` characters, then `tail`.

        Body blocks of one kind are pooled per session: the first few hundred are fresh, later
        ones repeat them, as a session's repeated commands print similar lines. Drawing every
        line fresh would dominate generation time for the large outputs.
        """
        pool = self.pools.setdefault(kind, [])
        lines = list(head)
        size = sum(len(line) + 1 for line in head) + sum(len(line) + 1 for line in tail)
        while size < target or len(lines) == len(head):  # at least one body block
            if len(pool) < _ROW_POOL:
                block = body()
                pool.append((block, sum(len(line) + 1 for line in block)))
                block, block_size = pool[-1]
            else:
                block, block_size = _pick(self.rng, pool)
            lines.extend(block)
            size += block_size
        lines.extend(tail)
        return "\n".join(lines)

    def _passing_kinds(self) -> tuple[Callable[[int, bool], tuple[str, str, int]], ...]:
        return (
            self._tests, self._grep, self._listing, self._find, self._git_log, self._git_diff,
            self._cat, self._git_status,
        )  # fmt: skip

    def _failing_kinds(self) -> tuple[Callable[[int, bool], tuple[str, str, int]], ...]:
        return (self._tests, self._tests, self._lint, self._traceback, self._cat, self._grep)

    def _finished(self, command: str, output: str, code: int) -> _Action:
        rng = self.rng
        details: dict[str, Any] | None = None
        exit_note = f"\n\nCommand exited with code {code}" if code else ""
        limit = MAX_TOOL_OUTPUT - len(exit_note)
        if len(output) > limit:
            path = f"/tmp/pi-bash-{_hex(rng, 16)}.log"
            total = output.count("\n") + 1
            output = _clamped(output, f"[Output truncated. Full output: {path}]", limit)
            details = {
                "truncation": {
                    "truncated": True,
                    "truncatedBy": "bytes",
                    "totalLines": total,
                    "outputLines": output.count("\n") + 1,
                },
                "fullOutputPath": path,
            }
        text = (output if output.strip() else "(no output)") + exit_note
        if code and details is None and rng.random() < 0.5:
            details = {}
        duration = _lognormal_int(rng, 120, 2.0, 3, 120_000)
        return _Action("bash", {"command": command}, text, code != 0, details, duration)

    def _quiet(self) -> tuple[str, str, int]:
        rng, project = self.rng, self.project
        roll = rng.random()
        if roll < 0.35:
            return f"mkdir -p {Path(project.source_path()).parent}/{_pick(rng, _NOUNS)}", "", 0
        if roll < 0.6:
            message = f"{_pick(rng, _VERBS).capitalize()} {_pick(rng, _ADJS)} {_pick(rng, _NOUNS)}"
            return (
                f'git add -A && git commit -m "{message}"',
                f"[{_pick(rng, _NOUNS)}-{_pick(rng, _VERBS)} {_hex(rng, 7)}] {message}\n"
                f" {_between(rng, 1, 6)} files changed, {_between(rng, 1, 90)} insertions(+), "
                f"{_between(rng, 0, 40)} deletions(-)",
                0,
            )
        if roll < 0.8:
            path = project.source_path()
            return f"wc -l {path}", f"     {_between(rng, 20, 2400)} {path}", 0
        branch = f"{_pick(rng, _VERBS)}-{_pick(rng, _NOUNS)}"
        return f"git checkout -b {branch}", f"Switched to a new branch '{branch}'", 0

    def _tests(self, target: int, fail: bool) -> tuple[str, str, int]:
        rng, project = self.rng, self.project
        test = project.test_path()
        passed = _between(rng, 5, 400)
        failed = _between(rng, 1, 4) if fail else 0
        seconds = rng.uniform(0.2, 40)
        if project.language == "python":
            command = _pick(
                rng, (f".venv/bin/python -m pytest -q {test}", "pytest -q", f"pytest -x {test}")
            )
            head = ["." * min(passed, 70) + ("F" if failed else "") + "    [100%]"]

            def failure() -> list[str]:
                name = _snake(rng)
                path = project.source_path()
                return [
                    f"____ test_{name} ____",
                    "",
                    f"    def test_{name}():",
                    f">       assert {name}({_pick(rng, _NOUNS)}) == {_pick(rng, _PY_LITERALS)}",
                    f"{path}:{_between(rng, 5, 900)}: in {name}",
                    f"    {project.code_line()}",
                    f"E       AssertionError: assert {_between(rng, 0, 9)} == {rng.random() < 0.5}",
                    "",
                ]

            summary = f"{passed} passed in {seconds:.2f}s"
            if failed:
                summary = f"{failed} failed, {summary}"
            tail = ["=" * 20 + " short test summary info " + "=" * 20, summary]
            return command, self._fill("tests", head, failure, tail, target), 1 if failed else 0
        command = _pick(rng, ("npm test", f"npx vitest run {test}", "npm run test -- --run"))

        def suite() -> list[str]:
            name = f"test/{_pick(rng, _NOUNS)}.test.ts"
            if rng.random() < 0.8:
                return [f" ✓ {name} ({_between(rng, 1, 40)} tests) {_between(rng, 2, 900)}ms"]
            return [
                f" ❯ {name} ({_between(rng, 2, 20)} tests | 1 failed)",
                f"   × {_VERB_ING[_pick(rng, _VERBS)]} a {_pick(rng, _ADJS)} {_pick(rng, _NOUNS)}",
                f"AssertionError: expected {_between(rng, 0, 9)} to be {_between(rng, 0, 9)}",
                f" ❯ {project.source_path()}:{_between(rng, 5, 900)}:{_between(rng, 1, 40)}",
            ]

        tail = [
            "",
            f" Test Files  {failed} failed | {_between(rng, 3, 40)} passed",
            f"      Tests  {failed} failed | {passed} passed",
            f"   Duration  {seconds:.2f}s",
        ]
        return command, self._fill("tests", [""], suite, tail, target), 1 if failed else 0

    def _grep(self, target: int, fail: bool) -> tuple[str, str, int]:
        rng, project = self.rng, self.project
        word = _pick(rng, (_snake(rng), _pick(rng, _NOUNS), _camel(rng)))
        where = _pick(rng, ("src", "tests", "."))
        command = _pick(rng, (f'rg -n "{word}" {where}', f"grep -rn {word} {where}"))
        if fail:
            return f"{command} | head -20", "", 1

        def hit() -> list[str]:
            return [f"{project.source_path()}:{_between(rng, 1, 1800)}:{project.code_line()}"]

        return command, self._fill("grep", [], hit, [], target), 0

    def _listing(self, target: int, fail: bool) -> tuple[str, str, int]:
        rng, project = self.rng, self.project
        folder = str(Path(project.source_path()).parent)
        if fail:
            return (
                f"ls {folder}/{_pick(rng, _NOUNS)}",
                f"ls: {folder}: No such file or directory",
                1,
            )

        def row() -> list[str]:
            name = f"{_pick(rng, _NOUNS)}.{_pick(rng, ('py', 'ts', 'md', 'json'))}"
            return [
                f"-rw-r--r--  1 {_pick(rng, _USERS)}  staff  {_between(rng, 40, 90000):>6} "
                f"{_pick(rng, _MONTHS)} {_between(rng, 1, 28):>2} "
                f"{_between(rng, 0, 23):02d}:{_between(rng, 0, 59):02d} {name}"
            ]

        return (
            f"ls -la {folder}",
            self._fill("listing", [f"total {_between(rng, 8, 900)}"], row, [], target),
            0,
        )

    def _find(self, target: int, fail: bool) -> tuple[str, str, int]:
        rng, project = self.rng, self.project
        ext = "py" if project.language == "python" else "ts"

        def row() -> list[str]:
            return [project.source_path() if rng.random() < 0.5 else project.test_path()]

        command = f'find . -name "*.{ext}" -not -path "./node_modules/*"'
        return command, self._fill("find", [], row, [], target), 1 if fail else 0

    def _git_log(self, target: int, fail: bool) -> tuple[str, str, int]:
        rng = self.rng

        def row() -> list[str]:
            return [
                f"{_hex(rng, 7)} {_pick(rng, _VERBS).capitalize()} {_pick(rng, _ADJS)} "
                f"{_pick(rng, _NOUNS)} in {_pick(rng, _MODULES)}"
            ]

        return "git log --oneline -n 40", self._fill("git_log", [], row, [], target), 0

    def _git_status(self, target: int, fail: bool) -> tuple[str, str, int]:
        rng, project = self.rng, self.project
        head = [
            f"On branch {_pick(rng, _VERBS)}-{_pick(rng, _NOUNS)}",
            "Changes not staged for commit:",
            '  (use "git add <file>..." to update what will be committed)',
            "",
        ]
        tail = ["", 'no changes added to commit (use "git add" and/or "git commit -a")']

        def row() -> list[str]:
            return [f"\tmodified:   {project.source_path()}"]

        return "git status", self._fill("git_status", head, row, tail, target), 0

    def _git_diff(self, target: int, fail: bool) -> tuple[str, str, int]:
        rng, project = self.rng, self.project

        def hunk() -> list[str]:
            path = project.source_path()
            start = _between(rng, 1, 900)
            lines = [
                f"diff --git a/{path} b/{path}",
                f"index {_hex(rng, 7)}..{_hex(rng, 7)} 100644",
                f"--- a/{path}",
                f"+++ b/{path}",
                f"@@ -{start},7 +{start},8 @@",
            ]
            for _ in range(_between(rng, 4, 12)):
                mark = _pick(rng, (" ", " ", " ", "-", "+"))
                lines.append(f"{mark}    {project.code_line()}")
            return lines

        return (
            _pick(rng, ("git diff", "git diff --stat HEAD~1 && git diff")),
            self._fill("git_diff", [], hunk, [], target),
            0,
        )

    def _cat(self, target: int, fail: bool) -> tuple[str, str, int]:
        rng, project = self.rng, self.project
        path = project.source_path()
        if fail:
            missing = f"{Path(path).parent}/{_pick(rng, _NOUNS)}{Path(path).suffix}"
            return f"cat {missing}", f"cat: {missing}: No such file or directory", 1
        lines = project.file_lines(path, target + 200)
        start = _between(rng, 1, max(1, min(60, len(lines) // 2)))
        shown: list[str] = []
        size = 0
        for line in lines[start - 1 :]:
            if size >= target:
                break
            shown.append(line)
            size += len(line) + 1
        command = f"sed -n '{start},{start + len(shown) - 1}p' {path}"
        return command, "\n".join(shown), 0

    def _lint(self, target: int, fail: bool) -> tuple[str, str, int]:
        rng, project = self.rng, self.project
        if project.language == "python":
            command = _pick(rng, ("ruff check src tests", ".venv/bin/ruff check ."))

            def row() -> list[str]:
                return [
                    f"{project.source_path()}:{_between(rng, 1, 900)}:{_between(rng, 1, 80)}: "
                    f"{_pick(rng, ('F401', 'E501', 'B008', 'UP006', 'SIM108', 'F841'))} "
                    f"`{_pick(rng, _NOUNS)}` {_pick(rng, _ADJS)} {_pick(rng, _NOUNS)}"
                ]

            tail = [f"Found {_between(rng, 1, 60)} errors."]
        else:
            command = "npm run check"

            def row() -> list[str]:
                return [
                    f"{project.source_path()}({_between(rng, 1, 900)},{_between(rng, 1, 80)}): "
                    f"error TS{_between(rng, 2300, 2800)}: Property '{_pick(rng, _NOUNS)}' "
                    f"does not exist on type '{_pascal(rng)}'."
                ]

            tail = [f"Found {_between(rng, 1, 60)} errors in {_between(rng, 1, 9)} files."]
        return command, self._fill("lint", [], row, tail, target), 1

    def _traceback(self, target: int, fail: bool) -> tuple[str, str, int]:
        rng, project = self.rng, self.project
        if project.language == "python":
            command = f"python -m {project.package}.{_pick(rng, _MODULES)} --{_pick(rng, _NOUNS)}"

            def frame() -> list[str]:
                return [
                    f'  File "{project.root}/{project.source_path()}", line '
                    f"{_between(rng, 1, 900)}, in {_snake(rng)}",
                    f"    {project.code_line()}",
                ]

            tail = [f"{_pick(rng, _PY_ERRORS)}: {_sentence(rng)}"]
            return (
                command,
                self._fill(
                    "traceback", ["Traceback (most recent call last):"], frame, tail, target
                ),
                1,
            )
        command = f"node dist/{_pick(rng, _MODULES)}.js"

        def ts_frame() -> list[str]:
            return [
                f"    at {_camel(rng)} ({project.root}/{project.source_path()}:"
                f"{_between(rng, 1, 900)}:{_between(rng, 1, 60)})"
            ]

        head = [f"{_pick(rng, _TS_ERRORS)}: {_sentence(rng)}"]
        return (
            command,
            self._fill(
                "traceback", head, ts_frame, [f"Node.js v22.{_between(rng, 1, 12)}.0"], target
            ),
            1,
        )


def _read_action(rng: random.Random, project: _Project, absolute: bool) -> _Action:
    path = project.source_path()
    shown_path = f"{project.root}/{path}" if absolute else path
    if rng.random() < 0.02:
        missing = f"{Path(path).parent}/{_pick(rng, _NOUNS)}{Path(path).suffix}"
        text = f"ENOENT: no such file or directory, access '{project.root}/{missing}'"
        return _Action("read", {"path": missing}, text, True)
    target = _read_size(rng)
    lines = project.file_lines(path, target)
    offset = 1
    if len(lines) > 40 and rng.random() < 0.25:
        # a read that continues further down; grow the file so the window is still full
        offset = _between(rng, 20, len(lines) - 10)
        lines = project.file_lines(path, project.sizes[path] + target)
    # about a third of the files are short enough to be read whole
    longer = 0 if rng.random() < 0.35 else _between(rng, 1, 2000)
    declared = project.declared.setdefault(path, len(lines) + longer)
    declared = project.declared[path] = max(declared, len(lines))
    note_room = 80
    budget = min(target, MAX_TOOL_OUTPUT - note_room)
    start = min(offset, len(lines)) - 1
    ends: list[int] = []  # running size of the lines from `start`, until past the budget
    for line in itertools.islice(lines, start, None):
        ends.append((ends[-1] if ends else 0) + len(line) + 1)
        if ends[-1] > budget:
            break
    count = max(1, bisect.bisect_right(ends, budget))  # whole lines, at least one
    shown = lines[start : start + count]
    size = ends[count - 1]
    end = start + count
    arguments: dict[str, Any] = {"path": shown_path}
    if offset > 1:
        arguments.update(offset=offset, limit=len(shown))
    text = "\n".join(shown)
    details: dict[str, Any] | None = None
    if end < declared:
        text += f"\n\n[{declared - end} more lines in file. Use offset={end + 1} to continue]"
        if size >= MAX_TOOL_OUTPUT - note_room - 200:
            # pi records why it cut; the visible text itself is left out here (it repeats it)
            details = {
                "truncation": {
                    "truncated": True,
                    "truncatedBy": "bytes",
                    "totalLines": declared,
                    "outputLines": len(shown),
                    "outputBytes": size,
                    "lastLinePartial": False,
                    "firstLineExceedsLimit": False,
                }
            }
    return _Action("read", arguments, text, False, details, _between(rng, 1, 25))


def _diff_text(lines: list[str], start: int, old: list[str], new: list[str]) -> str:
    """An edit diff in pi's layout: numbered context, `-` old lines, `+` new lines."""
    width = len(str(start + len(old) + len(new) + 4))
    out = [" " * (width + 1) + "..."]
    for number in range(max(0, start - 3), start):
        out.append(f" {number + 1:>{width}} {lines[number]}")
    for offset, line in enumerate(old):
        out.append(f"-{start + offset + 1:>{width}} {line}")
    for offset, line in enumerate(new):
        out.append(f"+{start + offset + 1:>{width}} {line}")
    after = start + len(old)
    for number in range(after, min(len(lines), after + 3)):
        out.append(f" {number + 1 + len(new) - len(old):>{width}} {lines[number]}")
    out.append(" " * (width + 1) + "...")
    return "\n".join(out)


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _edit_action(rng: random.Random, project: _Project, absolute: bool) -> _Action:
    path = project.source_path()
    shown_path = f"{project.root}/{path}" if absolute else path
    lines = project.file_lines(path, 1500)
    count = _lognormal_int(rng, 5, 0.8, 1, 40)
    start = _between(rng, 0, max(0, len(lines) - count - 1))
    while start > 0 and not lines[start].strip():
        start -= 1  # an edit anchors on real code, not on a blank line
    old = lines[start : start + count]
    new = list(old)
    changed = rng.randrange(len(new))
    indent = _indent_of(new[changed]) or ("    " if project.language == "python" else "\t")
    new[changed] = indent + project.code_line()
    for _ in range(_lognormal_int(rng, 2, 0.9, 0, 25)):
        new.insert(_between(rng, 0, len(new)), indent + project.code_line())
    old_text, new_text = "\n".join(old), "\n".join(new)
    arguments = {"path": shown_path, "oldText": old_text, "newText": new_text}
    if rng.random() < 0.04:
        text = (
            f"Could not find the exact text in {shown_path}. The old text must match exactly "
            "including all whitespace and newlines."
        )
        return _Action("edit", arguments, text, True, {}, _between(rng, 1, 10))
    text = (
        f"Successfully replaced text in {shown_path}. Changed {len(old_text)} characters to "
        f"{len(new_text)} characters."
    )
    project.lines[path] = lines[:start] + new + lines[start + count :]
    project.sizes[path] += len(new_text) - len(old_text)
    details = {"diff": _diff_text(lines, start, old, new)}
    return _Action("edit", arguments, text, False, details, _between(rng, 1, 10))


def _write_action(rng: random.Random, project: _Project, absolute: bool) -> _Action:
    ext = "py" if project.language == "python" else "ts"
    folder = Path(project.source_path()).parent
    path = f"{folder}/{_pick(rng, _ADJS)}_{_pick(rng, _NOUNS)}.{ext}"
    if path not in project.files:
        project.files.append(path)
    project.lines.pop(path, None)  # a rewrite replaces whatever the file held
    project.declared.pop(path, None)
    lines = project.file_lines(path, _lognormal_int(rng, 1500, 1.0, 60, 40_000))
    content = "\n".join(lines) + "\n"
    shown_path = f"{project.root}/{path}" if absolute else path
    text = f"Successfully wrote {len(content.encode())} bytes to {shown_path}"
    return _Action("write", {"path": shown_path, "content": content}, text, False, None, 2)


# --- prose: user prompts, assistant text, thinking -------------------------------------------


def _request(rng: random.Random, project: _Project) -> str:
    path, test = project.source_path(), project.test_path()
    func, noun, adj = _snake(rng), _pick(rng, _NOUNS), _pick(rng, _ADJS)
    options = (
        f"fix the failing test in {test}",
        f"add a --{noun} option to the {_pick(rng, _VERBS)} command",
        f"why does {func} return None when the {noun} is empty?",
        "ok, continue",
        "continue",
        "looks good. commit it",
        "run the tests again",
        f"read {path} and tell me what {func} does",
        f"refactor {path}: split {func} into smaller functions",
        f"the {noun} {_VERB_S[_pick(rng, _VERBS)]} twice when I restart, can you look?",
        f"what's left on the plan for the {adj} {noun} work?",
        f"don't commit yet, for now just show me the diff of {path}",
        f"rename {func} to {_snake(rng)} everywhere",
        f"can we make the {noun} {adj} by default? check {path}",
    )
    text = _pick(rng, options)
    if rng.random() < 0.15:
        # long prompts: the user explains, sometimes pasting a traceback
        text += "\n\n" + _paragraph(rng, _between(rng, 2, 8))
        if rng.random() < 0.4:
            text += "\n\n```\n" + "\n".join(
                f"  {path}:{_between(rng, 1, 900)}: in {_snake(rng)}" for _ in range(6)
            )
            text += f"\n{_pick(rng, _PY_ERRORS)}: {_sentence(rng)}\n```"
    return text


def _sentences_joined(first: str, second: str) -> str:
    return f"{first} {second}" if first.endswith(("?", ".", "!")) else f"{first}. {second}"


def _rule_prompt(rng: random.Random, project: _Project, rule: StandingRule) -> str:
    statement = _pick(rng, rule.statements)
    roll = rng.random()
    if roll < 0.4:
        return statement
    request = _request(rng, project)
    if roll < 0.7 or "\n" in request:
        return _sentences_joined(statement, request)
    return _sentences_joined(request, f"also, {statement}")


def _withdrawal_prompt(rng: random.Random, project: _Project, rule: StandingRule) -> str:
    withdrawal = _pick(rng, rule.withdrawals)
    if rng.random() < 0.5:
        return withdrawal
    return _sentences_joined(f"ok, {withdrawal}", _request(rng, project))


def _lead_text(rng: random.Random, action: _Action) -> str:
    target = action.arguments.get("path", "")
    leads = {
        "read": (f"Let me look at `{target}`:", "Let me read that file first."),
        "bash": ("Now run the tests:", "Let me check where that is used:", "Let me verify:"),
        "edit": (f"Now update `{target}`:", f"Fix the {_pick(rng, _ADJS)} {_pick(rng, _NOUNS)}:"),
        "write": (f"Create `{target}`:", "Now write the new module:"),
    }
    text = _pick(rng, leads[action.name])
    if rng.random() < 0.15:
        text = f"{_paragraph(rng, _between(rng, 1, 4))} {text}"
    return text


def _reply_text(rng: random.Random, project: _Project) -> str:
    target = _lognormal_int(rng, 450, 1.0, 20, 12_000)
    if target < 120:
        return _pick(rng, ("Done.", "Done. Tests pass.", "Committed.")) + " " + _sentence(rng)

    def bullet() -> str:
        return f"- **{project.source_path()}**: {_sentence(rng)}"

    body = _text_of_size(rng, target - 100, bullet, "\n")
    heading = _pick(rng, ("## Summary", "## Changes", "### What changed"))
    return f"Done. {_sentence(rng)}\n\n{heading}\n\n{body}\n\n{_sentence(rng)}"


def _thinking_text(rng: random.Random) -> str:
    target = _lognormal_int(rng, 400, 0.9, 40, 6_000)
    opening = _pick(rng, ("The user wants me to ", "I need to ", "Let me think about how to "))
    first = f"{opening}{_pick(rng, _VERBS)} the {_pick(rng, _ADJS)} {_pick(rng, _NOUNS)}."
    return first + " " + _text_of_size(rng, target - len(first), lambda: _sentence(rng), " ")


# --- the session -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Chain:
    """One user prompt and the assistant messages it sets off."""

    length: int  # assistant messages, the closing one included
    ending: str  # stop | aborted | error | open (session cut mid-chain)
    variant: str  # how an aborted or errored chain ends
    prompt: tuple[str, int]  # ("request" | "rule" | "withdraw", rule index)
    bash_first: bool  # the user runs a `!command` before typing the prompt


def _chain_lengths(rng: random.Random, turns: int) -> list[int]:
    lengths: list[int] = []
    left = turns
    while left > 0:
        # now and then a long run with no text-only reply, otherwise a short chain
        long_run = rng.random() < 0.07
        length = _between(rng, 25, 80) if long_run else _lognormal_int(rng, 3, 0.9, 1, 30)
        lengths.append(min(length, left))
        left -= lengths[-1]
    return lengths


def _chain_ending(rng: random.Random, length: int, last: bool) -> tuple[str, str]:
    if last and rng.random() < 0.25:
        return "open", ""
    roll = rng.random()
    if roll < 0.70:
        return "stop", ""
    if roll < 0.96:
        kinds = ["empty", "thinking", "toolcall"] + (["during_tool"] if length >= 2 else [])
        return "aborted", _pick(rng, kinds)
    kinds = ["terminated", "overloaded"] + (["missing_result"] if length >= 2 else [])
    return "error", _pick(rng, kinds)


def _prompt_plan(rng: random.Random, count: int) -> list[tuple[str, int]]:
    """Which prompts state a rule and which withdraw one; a withdrawal follows its statement."""
    plan: list[tuple[str, int]] = [("request", -1)] * count
    if count < 2:
        return plan
    wanted = 1 if count < 4 else _between(rng, 2, 5)
    early = list(range(max(1, int(count * 0.7))))
    stated = rng.sample(early, min(wanted, len(early)))
    rules = rng.sample(range(len(RULES)), len(stated))
    withdrawn = 0
    for slot, rule in sorted(zip(stated, rules, strict=True)):
        plan[slot] = ("rule", rule)
    for position, (slot, rule) in enumerate(sorted(zip(stated, rules, strict=True))):
        later = [i for i in range(slot + 1, count) if plan[i][0] == "request"]
        must = withdrawn == 0 and position == len(stated) - 1
        if later and (rng.random() < 0.45 or must):
            plan[_pick(rng, later)] = ("withdraw", rule)
            withdrawn += 1
    return plan


def _session_plan(rng: random.Random, turns: int) -> list[_Chain]:
    lengths = _chain_lengths(rng, turns)
    prompts = _prompt_plan(rng, len(lengths))
    chains = []
    for index, (length, prompt) in enumerate(zip(lengths, prompts, strict=True)):
        ending, variant = _chain_ending(rng, length, index == len(lengths) - 1)
        chains.append(_Chain(length, ending, variant, prompt, rng.random() < 0.03))
    return chains


def _arguments_size(arguments: dict[str, Any]) -> int:
    # about len(JSON): keys, values and quoting; exact JSON would cost a dumps per call
    return sum(len(key) + len(str(value)) + 6 for key, value in arguments.items()) + 2


def _iso(ms: int) -> str:
    seconds, millis = divmod(ms, 1000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{stamp}.{millis:03d}Z"


class _Session:
    """Plays a plan out into entries, keeping the clock, the id chain and the context size."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.project = _new_project(rng)
        self.bash = _Bash(rng, self.project)
        self.model = rng.choices(_MODELS, _MODEL_WEIGHTS)[0]
        self.thinking = rng.choices(_THINKING_LEVELS, _THINKING_WEIGHTS)[0]
        self.absolute_paths = rng.random() < 0.4
        self.session_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        self.clock = _EPOCH_MS + rng.randrange(120 * _DAY_MS)
        self.entries: list[Entry] = []
        self.ids: set[str] = set()
        self.leaf: str | None = None
        self.chars = 0  # everything the model has seen so far, for usage.totalTokens
        self.last_total = 0
        self.last_call_ms = 0

    # entries and the clock

    def _new_id(self) -> str:
        while True:
            entry_id = f"{self.rng.getrandbits(32):08x}"
            if entry_id not in self.ids:
                self.ids.add(entry_id)
                return entry_id

    def _append(self, kind: str, at_ms: int, **fields: Any) -> None:  # noqa: ANN401 - entry JSON
        self.clock = max(self.clock, at_ms)
        entry_id = self._new_id()
        entry = {"type": kind, "id": entry_id, "parentId": self.leaf, "timestamp": _iso(self.clock)}
        entry.update(fields)
        self.entries.append(entry)
        self.leaf = entry_id

    def _tick(self, low: int, high: int) -> int:
        self.clock += _between(self.rng, low, high)
        return self.clock

    # header and settings

    def header(self) -> Entry:
        """The session line; its timestamp is when the session started."""
        return {
            "type": "session",
            "version": SESSION_VERSION,
            "id": self.session_id,
            "timestamp": _iso(self.clock),
            "cwd": self.project.root,
        }

    def model_change(self) -> None:
        """A model_change entry for the current model."""
        self._append(
            "model_change",
            self._tick(1, 40),
            provider=self.model.provider,
            modelId=self.model.model,
        )

    def thinking_change(self) -> None:
        """A thinking_level_change entry for the current level."""
        self._append("thinking_level_change", self._tick(1, 400), thinkingLevel=self.thinking)

    def settings_noise(self) -> None:
        """Between prompts users sometimes switch model or cycle thinking levels."""
        rng = self.rng
        if rng.random() < 0.02:
            self.model = rng.choices(_MODELS, _MODEL_WEIGHTS)[0]
            self.model_change()
        if rng.random() < 0.02:
            for _ in range(_between(rng, 1, 5)):
                self.thinking = _pick(rng, _THINKING_LEVELS)
                self.thinking_change()

    # user side

    def user(self, text: str) -> None:
        """A user message after some think time."""
        rng = self.rng
        pause = _lognormal_int(rng, 35_000, 1.0, 1_500, 1_800_000)
        if rng.random() < 0.03:
            pause += _between(rng, 1_800_000, 10_800_000)  # a long break
        sent = self.clock + pause
        message = {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": sent}
        self._append("message", sent + _between(rng, 2, 12), message=message)
        self.chars += len(text)

    def bash_execution(self) -> None:
        """A `!command` the user ran themselves."""
        action = self.bash.action(fail=self.rng.random() < 0.1)
        # the exit code has its own field here, and a person reads at most a screenful or two
        output = action.result.split("\n\nCommand exited with code ")[0][:8_000]
        if output == "(no output)":
            output = ""
        ran = self.clock + _lognormal_int(self.rng, 20_000, 1.0, 1_000, 600_000)
        message = {
            "role": "bashExecution",
            "command": action.arguments["command"],
            "output": output,
            "exitCode": 1 if action.is_error else 0,
            "cancelled": False,
            "truncated": False,
            "timestamp": ran,
        }
        self._append("message", ran + action.duration_ms, message=message)
        self.chars += len(message["command"]) + len(output)

    def prompt_text(self, chain: _Chain) -> str:
        """The user's words for a chain: a request, a rule, or a rule withdrawn."""
        kind, rule = chain.prompt
        if kind == "rule":
            return _rule_prompt(self.rng, self.project, RULES[rule])
        if kind == "withdraw":
            return _withdrawal_prompt(self.rng, self.project, RULES[rule])
        return _request(self.rng, self.project)

    # assistant side

    def tool_call_id(self, name: str, index: int) -> str:
        """An id in the provider's style; counter-style ids repeat from turn to turn."""
        style = self.model.id_style
        if style == "toolu":
            return f"toolu_01{_alnum(self.rng, 22)}"
        if style == "call":
            return f"call_{_alnum(self.rng, 24)}|fc_{_hex(self.rng, 48)}"
        return f"{name}_{index + 1}"

    def thinking_block(self, partial: bool = False) -> dict[str, Any]:
        """A thinking block, signed the way the current provider signs it."""
        rng = self.rng
        text = _thinking_text(rng)
        block: dict[str, Any] = {"type": "thinking", "thinking": text}
        if partial:
            block["thinking"] = text[: _between(rng, 20, max(21, len(text) // 2))]
            block["thinkingSignature"] = ""
        elif self.model.provider == "anthropic":
            raw = rng.randbytes(_between(rng, 150, 700))
            block["thinkingSignature"] = base64.b64encode(raw).decode()
        elif self.model.provider == "openai":
            signature = {"type": "reasoning", "id": f"rs_{_hex(rng, 48)}", "summary": []}
            block["thinkingSignature"] = json.dumps(signature, separators=(",", ":"))
        return block

    def maybe_thinking(self) -> list[dict[str, Any]]:
        """A thinking block at the session's thinking rate, or nothing."""
        if self.rng.random() < _THINKING_RATE.get(self.thinking, 0.0):
            return [self.thinking_block()]
        return []

    def usage(self, output: int, empty: bool = False) -> dict[str, Any]:
        """Usage in the provider's split: the prompt is everything said so far plus a base."""
        rng = self.rng
        if empty:
            counts = {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}
        else:
            prompt = SYSTEM_PROMPT_TOKENS + int(self.chars * TOKENS_PER_CHAR)
            warm = self.clock - self.last_call_ms < _CACHE_TTL_MS
            cached = min(self.last_total, prompt) if warm else 0
            style = self.model.api
            if style == "anthropic-messages":
                fresh = min(prompt, _between(rng, 1, 12))
                read = min(cached, prompt - fresh)
                counts = {
                    "input": fresh,
                    "output": output,
                    "cacheRead": read,
                    "cacheWrite": prompt - fresh - read,
                }
            elif style == "openai-responses":
                read = cached // 256 * 256
                counts = {"input": prompt - read, "output": output, "cacheRead": read}
                counts["cacheWrite"] = 0
            else:
                counts = {"input": prompt, "output": output, "cacheRead": 0, "cacheWrite": 0}
            self.last_total = prompt + output
            self.last_call_ms = self.clock
        keys = ("input", "output", "cacheRead", "cacheWrite")
        prices = dict(zip(keys, self.model.prices, strict=True))
        cost = {key: counts[key] * prices[key] / 1_000_000 for key in prices}
        cost["total"] = sum(cost.values())
        return {**counts, "totalTokens": sum(counts.values()), "cost": cost}

    def assistant(
        self,
        content: list[dict[str, Any]],
        stop: str,
        error: str | None = None,
        empty_usage: bool = False,
    ) -> None:
        """An assistant message: `timestamp` is when the request went out, the entry when done."""
        rng = self.rng
        own = sum(len(b.get("text", "")) + len(b.get("thinking", "")) for b in content)
        own += sum(_arguments_size(b["arguments"]) for b in content if b["type"] == "toolCall")
        output = 0 if empty_usage else int(own * TOKENS_PER_CHAR) + _between(rng, 5, 40)
        started = self._tick(1, 6)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "api": self.model.api,
            "provider": self.model.provider,
            "model": self.model.model,
            "usage": self.usage(output, empty_usage),
            "stopReason": stop,
            "timestamp": started,
        }
        if error is not None:
            message["errorMessage"] = error
        latency = 1_500 + output * 20 + _lognormal_int(rng, 2_000, 0.8, 100, 120_000)
        if stop in ("aborted", "error"):
            latency = _between(rng, 300, 20_000)
        self._append("message", started + latency, message=message)
        self.chars += own

    def tool_result(self, call_id: str, action: _Action) -> None:
        """The saved result of one tool call."""
        text = action.result
        done = self.clock + action.duration_ms
        message: dict[str, Any] = {
            "role": "toolResult",
            "toolCallId": call_id,
            "toolName": action.name,
            "content": [{"type": "text", "text": text}],
        }
        if action.details is not None:
            message["details"] = action.details
        message.update(isError=action.is_error, timestamp=done)
        self._append("message", done + _between(self.rng, 1, 8), message=message)
        self.chars += len(text)

    def actions(self, count: int) -> list[_Action]:
        """Tool calls drawn from the real tool mix."""
        rng, project, absolute = self.rng, self.project, self.absolute_paths
        names = rng.choices(list(TOOL_WEIGHTS), list(TOOL_WEIGHTS.values()), k=count)
        made = []
        for name in names:
            if name == "bash":
                made.append(self.bash.action(fail=rng.random() < 0.05))
            elif name == "read":
                made.append(_read_action(rng, project, absolute))
            elif name == "edit":
                made.append(_edit_action(rng, project, absolute))
            else:
                made.append(_write_action(rng, project, absolute))
        return made

    def tool_step(self, forced: _Action | None = None, drop_last_result: bool = False) -> None:
        """An assistant message that calls tools, followed by the results that were saved."""
        rng = self.rng
        if forced is not None:
            actions = [forced]
        else:
            count = rng.choices((1, 2, 3, 4), (0.94, 0.03, 0.02, 0.01))[0]
            actions = self.actions(count)
        content = self.maybe_thinking()
        if rng.random() < 0.5:
            content.append({"type": "text", "text": _lead_text(rng, actions[0])})
        ids = [self.tool_call_id(action.name, i) for i, action in enumerate(actions)]
        for call_id, action in zip(ids, actions, strict=True):
            block = {"type": "toolCall", "id": call_id, "name": action.name}
            block["arguments"] = action.arguments
            content.append(block)
        self.assistant(content, "toolUse")
        for position, (call_id, action) in enumerate(zip(ids, actions, strict=True)):
            if drop_last_result and position == len(actions) - 1:
                continue  # the result never reached the file: an orphan call
            self.tool_result(call_id, action)

    def reply(self) -> None:
        """A text-only reply that closes a chain."""
        content = [
            *self.maybe_thinking(),
            {"type": "text", "text": _reply_text(self.rng, self.project)},
        ]
        self.assistant(content, "stop")

    def aborted(self, variant: str) -> None:
        """An assistant message the user interrupted."""
        rng = self.rng
        error = "Request was aborted."
        if variant in ("empty", "during_tool"):
            self.assistant([], "aborted", error, empty_usage=True)
        elif variant == "thinking":
            self.assistant([self.thinking_block(partial=True)], "aborted", error)
        else:
            action = self.actions(1)[0]
            content: list[dict[str, Any]] = [{"type": "text", "text": _lead_text(rng, action)}]
            call_id = self.tool_call_id(action.name, 0)
            content.append(
                {
                    "type": "toolCall",
                    "id": call_id,
                    "name": action.name,
                    "arguments": action.arguments,
                }
            )
            self.assistant(content, "aborted", error)  # the call never ran: no result

    def errored(self, variant: str, orphan_id: str | None) -> None:
        """An assistant message the provider failed."""
        if variant == "terminated":
            actions = self.actions(_between(self.rng, 1, 3))
            content: list[dict[str, Any]] = [
                {"type": "toolCall", "id": self.tool_call_id(a.name, i), "name": a.name,
                 "arguments": a.arguments}
                for i, a in enumerate(actions)
            ]  # fmt: skip
            self.assistant(content, "error", "terminated")
        elif variant == "missing_result" and orphan_id is not None:
            error = (
                '400 {"type":"error","error":{"type":"invalid_request_error","message":"messages.'
                f"{len(self.entries)}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {orphan_id}. Each `tool_use` block must have a "
                'corresponding `tool_result` block in the next message."}}'
            )
            self.assistant([], "error", error, empty_usage=True)
        else:
            error = (
                '529 {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
            )
            self.assistant([], "error", error, empty_usage=True)

    def chain(self, chain: _Chain) -> None:
        """One prompt and its assistant messages, closed the way the plan says."""
        if self.entries[-1]["type"] == "message":  # the session opens with the user's prompt
            self.settings_noise()
        if chain.bash_first:
            self.bash_execution()
        self.user(self.prompt_text(chain))
        for step in range(chain.length):
            last = step == chain.length - 1
            before_last = step == chain.length - 2
            if last and chain.ending == "stop":
                self.reply()
            elif last and chain.ending == "aborted":
                self.aborted(chain.variant)
            elif last and chain.ending == "error":
                self.errored(chain.variant, self._last_call_id())
            elif before_last and chain.variant == "during_tool":
                action = self.bash.action(fail=False)
                action.result, action.is_error, action.details = "Command aborted", True, None
                self.tool_step(forced=action)
            elif before_last and chain.variant == "missing_result":
                self.tool_step(drop_last_result=True)
            else:
                self.tool_step()

    def _last_call_id(self) -> str | None:
        for entry in reversed(self.entries):
            message = entry.get("message", {})
            if message.get("role") == "assistant":
                calls = [b["id"] for b in message["content"] if b["type"] == "toolCall"]
                return calls[-1] if calls else None
        return None


def generate_session(seed: int, turns: int) -> list[Entry]:
    """One session: the header, then entries holding exactly `turns` assistant messages.

    The same `seed` and `turns` always give the same list.
    """
    if turns < 1:
        raise ValueError("turns must be at least 1")
    rng = random.Random(seed)
    session = _Session(rng)
    plan = _session_plan(rng, turns)
    header = session.header()
    session.model_change()
    session.thinking_change()
    for chain in plan:
        session.chain(chain)
    return [header, *session.entries]


def session_seeds(seed: int, sessions: int) -> list[int]:
    """Per-session seeds of a fleet; the first k do not depend on how many follow."""
    master = random.Random(seed)
    return [master.getrandbits(64) for _ in range(sessions)]


def session_file_name(header: Entry) -> str:
    """pi's file name for a session: `<timestamp with : and . as ->_<uuid>.jsonl`."""
    stamp = str(header["timestamp"]).replace(":", "-").replace(".", "-")
    return f"{stamp}_{header['id']}.jsonl"


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def dumps_entry(entry: Entry) -> str:
    """One entry as JavaScript's JSON.stringify writes it: compact, non-ASCII kept as is."""
    return _ENCODER.encode(entry)


def session_bytes(entries: Sequence[Entry]) -> bytes:
    """A whole session file: one JSON object per line, with a trailing newline."""
    return ("\n".join(dumps_entry(entry) for entry in entries) + "\n").encode("utf-8")


@dataclass(frozen=True, slots=True)
class WrittenSession:
    """A session file on disk and what it holds."""

    path: Path
    entries: int  # lines after the header
    size: int  # bytes


def write_session(out_dir: Path, entries: Sequence[Entry]) -> WrittenSession:
    """Write one session under its pi file name in `out_dir` (which must exist)."""
    data = session_bytes(entries)
    path = out_dir / session_file_name(entries[0])
    path.write_bytes(data)
    return WrittenSession(path, len(entries) - 1, len(data))


def generate_fleet(seed: int, sessions: int, turns: int) -> Iterator[list[Entry]]:
    """The sessions of a fleet, one at a time (each is generated only when asked for)."""
    if sessions < 1:
        raise ValueError("sessions must be at least 1")
    for session_seed in session_seeds(seed, sessions):
        yield generate_session(session_seed, turns)


def write_fleet(
    out_dir: Path,
    sessions: int,
    turns: int,
    seed: int,
    on_written: Callable[[WrittenSession], None] | None = None,
) -> list[WrittenSession]:
    """Write a fleet of sessions into `out_dir`, creating it; call `on_written` after each."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for entries in generate_fleet(seed, sessions, turns):
        result = write_session(out_dir, entries)
        written.append(result)
        if on_written is not None:
            on_written(result)
    return written
