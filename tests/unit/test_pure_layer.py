"""The pure layers (events/, projections/) do no I/O: no clock, files, randomness or sockets."""

from __future__ import annotations

import ast
from pathlib import Path

import sessionfold

PACKAGE = Path(sessionfold.__file__).parent
PURE = ("events", "projections")
#: Modules whose import means I/O, a clock or randomness (tomllib: parsing belongs with reading).
BANNED = frozenset({"os", "pathlib", "time", "random", "socket", "io", "tomllib"})


def impurities(source: str) -> list[str]:
    """What in `source` is I/O: banned imports (`import x`, `from x import y`) and `open()`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            names = ["open()"] if node.func.id == "open" else []
        else:
            continue
        found += [
            f"{name} (line {node.lineno})"
            for name in names
            if name == "open()" or name.split(".")[0] in BANNED
        ]
    return found


def test_the_scan_sees_imports_and_open() -> None:
    """The scan flags each banned import form and a call of open(), and nothing else."""
    source = "import os.path\nfrom time import monotonic\nimport json\nopen('f')\nx.open()\n"
    assert impurities(source) == ["os.path (line 1)", "time (line 2)", "open() (line 4)"]


def test_events_and_projections_do_no_io() -> None:
    """No module of events/ or projections/ imports an I/O module or calls open()."""
    offenders = {
        str(path.relative_to(PACKAGE)): found
        for layer in PURE
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        if (found := impurities(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}, f"I/O in the pure layer: {offenders}"
