"""The embedded fold of both real sessions under cProfile: where its time goes, as shares.

    .venv/bin/python bench/fold_profile.py [--top 25] [--repeat 1]

Folds ../shared/data/sessions/*.jsonl (read, migrate, validate, fold, flushes and ledger passes
included) as `sessionfold fold` does, `--repeat` times each, and prints the top `--top`
functions by own time and by cumulative time, as shares of the total own time, then own time
per package and the largest single function's share. A compiled core pays off only where a few
functions hold most of the own time; a flat profile says the cost is spread over the fold.
cProfile's overhead inflates calls of small functions, so read shares, not seconds (and a
cumulative share may top 100% a little: the profiler's own time is charged to the callers).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from collections.abc import Iterable
from pathlib import Path

from fold_throughput import REAL, SESSIONS, fold_file

#: pstats' key of one function: (file, first line, name).
Function = tuple[str, int, str]
#: pstats' figures of one function: (primitive calls, calls, own s, cumulative s, callers).
Figures = tuple[int, int, float, float, dict[Function, tuple[int, int, float, float]]]


def profile(paths: Iterable[Path], repeat: int) -> dict[Function, Figures]:
    """cProfile's per-function figures over `repeat` embedded folds of each of `paths`."""
    profiler = cProfile.Profile()
    for path in paths:
        for _ in range(repeat):
            profiler.runcall(fold_file, path)
    stats: dict[Function, Figures] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    return stats


def where(function: Function) -> str:
    """A function as `package/module.py:line name`, short enough for one row."""
    file, line, name = function
    if file == "~":
        return name  # a builtin, e.g. <built-in method orjson.loads>
    parts = Path(file).parts
    anchor = max(
        (i for i, p in enumerate(parts) if p in {"sessionfold", "site-packages"}), default=-1
    )
    short = "/".join(parts[anchor + 1 :] if anchor >= 0 else parts[-2:])
    return f"{short}:{line} {name}"


def package(function: Function) -> str:
    """The top-level package a function's file belongs to (`sessionfold.projections`, `pydantic`,
    ...), or `builtins` for functions written in C with no file."""
    file = function[0]
    if file == "~":
        return "builtins"
    parts = Path(file).parts
    if "sessionfold" in parts:
        i = len(parts) - 1 - parts[::-1].index("sessionfold")
        return ".".join(parts[i : i + 2]).removesuffix(".py")
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1].removesuffix(".py")
    return "stdlib"


def top(stats: dict[Function, Figures], column: int, count: int, total: float) -> None:
    """The `count` functions with the largest figure in `column` (2 own, 3 cumulative)."""
    ranked = sorted(stats.items(), key=lambda item: item[1][column], reverse=True)[:count]
    print(f"{'own %':>6} {'cum %':>6} {'calls':>9}  function")
    for function, (_primitive, calls, own, cumulative, _callers) in ranked:
        print(f"{own / total:6.1%} {cumulative / total:6.1%} {calls:9,d}  {where(function)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=25, help="functions per table")
    parser.add_argument("--repeat", type=int, default=1, help="folds of each session")
    args = parser.parse_args()
    if not SESSIONS.is_dir():
        raise SystemExit(f"real sessions not found at {SESSIONS}")
    stats = profile((SESSIONS / name for name in REAL), args.repeat)
    total = sum(figures[2] for figures in stats.values())
    print(f"embedded fold of {', '.join(REAL)} x{args.repeat}, under cProfile: {total:.2f} s own")
    print(f"\ntop {args.top} by own time")
    top(stats, 2, args.top, total)
    print(f"\ntop {args.top} by cumulative time")
    top(stats, 3, args.top, total)
    packages: dict[str, float] = {}
    for function, figures in stats.items():
        packages[package(function)] = packages.get(package(function), 0.0) + figures[2]
    print("\nown time by package")
    for name, own in sorted(packages.items(), key=lambda item: item[1], reverse=True):
        print(f"{own / total:6.1%}  {name}")
    largest, figures = max(stats.items(), key=lambda item: item[1][2])
    print(f"\nlargest single function: {figures[2] / total:.1%} of own time ({where(largest)})")


if __name__ == "__main__":
    main()
