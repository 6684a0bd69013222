"""How often one entry's fold enters each module afresh: `sys.setprofile` over every entry's
`fold_step` on a real session, before (another commit, extracted with `git archive`) and after
(this tree), side by side.

    .venv/bin/python bench/call_trace.py [--session before-compaction.jsonl]
        [--before-rev f6bbb93] [--top 30]

A module is entered afresh when a Python function of it is called from a function of another
module (a call within the module is not counted). Each entry envelope's `fold_step` is traced on
its own; the flush answers it leads to are folded untraced, so the figure is the fold of one
entry. Printed per module of sessionfold: entries into it per traced entry (mean, and the
largest one entry needed), then the totals: distinct modules per entry and fresh entries per
entry. Target (issue #25): each pruning module entered at most twice per entry, on the mean.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from trees import extracted, run_in

SESSIONS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sessions"
REPO = Path(__file__).resolve().parents[1]
#: main when issue #25 was taken: the fold core before the redesign.
BEFORE_REV = "f6bbb93"
#: Each pruning module is entered afresh at most this many times per entry, on the mean.
TARGET = 2.0
PRUNING = "projections/pruning/"


def module_of(filename: str) -> str | None:
    """A code object's file as `events/envelope.py` (inside sessionfold), else None."""
    parts = Path(filename).parts
    if "sessionfold" not in parts:
        return None
    i = len(parts) - 1 - parts[::-1].index("sessionfold")
    return "/".join(parts[i + 1 :])


def trace(path: Path) -> dict[str, Any]:
    """Fold `path` in an embedded runtime, tracing each entry's fold step; the counts."""
    from sessionfold.events.envelope import EntryEnvelope
    from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
    from sessionfold.streams.runtime.embedded import EmbeddedRuntime
    from sessionfold.streams.runtime.step import fold_step

    runtime = EmbeddedRuntime()
    per_module: dict[str, list[int]] = {}
    totals: list[int] = []
    distinct: list[int] = []
    modules_cache: dict[str, str | None] = {}

    def module(frame: FrameType | None) -> str | None:
        if frame is None:
            return None
        name = frame.f_code.co_filename
        if name not in modules_cache:
            modules_cache[name] = module_of(name)
        return modules_cache[name]

    traced = 0
    for record in read_session_file(path):
        if isinstance(record, DeadLetter):
            continue
        if not isinstance(record, EntryEnvelope):
            runtime.route(runtime.fold(record))
            continue
        counts: Counter[str] = Counter()

        def profiler(
            frame: FrameType, event: str, _arg: Any, counts: Counter[str] = counts
        ) -> None:
            if event != "call":
                return
            here = module(frame)
            if here is not None and here != module(frame.f_back):
                counts[here] += 1

        runtime.folded.append(record)
        sys.setprofile(profiler)
        try:
            outputs = fold_step(runtime.store, record, runtime.config, runtime.ledger)
        finally:
            sys.setprofile(None)
        runtime.route(outputs)
        for name in counts:
            per_module.setdefault(name, [0] * traced)
        for name, seen in per_module.items():
            seen.append(counts.get(name, 0))
        totals.append(sum(counts.values()))
        distinct.append(len(counts))
        traced += 1
    return {"entries": traced, "modules": per_module, "totals": totals, "distinct": distinct}


def traced_in(root: str, path: Path) -> dict[str, Any] | str:
    """`trace` run with the sessionfold of `root` in a subprocess; an error line if it fails."""
    out, error = run_in(root, [__file__, "--child", str(path)])
    if error is not None:
        return error
    result: dict[str, Any] = json.loads(out)
    return result


def mean(values: list[int]) -> float:
    """The mean of `values` (0 for none)."""
    return sum(values) / len(values) if values else 0.0


def report(before: dict[str, Any] | str, after: dict[str, Any], rev: str, top: int) -> None:
    """Per-module fresh entries per entry, before and after, and the totals."""
    names = set(after["modules"])
    if isinstance(before, dict):
        names |= set(before["modules"])

    def figures(result: dict[str, Any] | str, name: str) -> tuple[float, int] | None:
        if isinstance(result, str):
            return None
        seen = result["modules"].get(name)
        return (mean(seen), max(seen)) if seen else (0.0, 0)

    def cell(found: tuple[float, int] | None) -> str:
        return f"{'':>6} {'':>4}" if found is None else f"{found[0]:6.2f} {found[1]:4d}"

    def weight(name: str) -> float:
        return max((f or (0.0, 0))[0] for f in (figures(before, name), figures(after, name)))

    print(f"fresh entries into each module per entry's fold_step (mean, max); before = {rev}")
    if isinstance(before, str):
        print(f"  ({rev} not traced: {before})")
    print(f"{'module':42} {'before':>11}  {'after':>11}")
    for name in sorted(names, key=weight, reverse=True)[:top]:
        print(f"{name:42} {cell(figures(before, name))}  {cell(figures(after, name))}")
    for label, field in (("modules per entry", "distinct"), ("fresh entries per entry", "totals")):
        was = f"{mean(before[field]):6.2f}" if isinstance(before, dict) else ""
        print(f"{label:42} {was:>11}  {mean(after[field]):11.2f}")
    worst = max(
        (n for n in after["modules"] if n.startswith(PRUNING)),
        key=lambda n: mean(after["modules"][n]),
        default=None,
    )
    if worst is not None:
        figure = mean(after["modules"][worst])
        verdict = "met" if figure <= TARGET else "NOT met"
        print(
            f"most-entered pruning module: {worst} {figure:.2f} per entry "
            f"(target <= {TARGET:g}): {verdict}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--session", default="before-compaction.jsonl", help="a real session")
    parser.add_argument("--before-rev", default=BEFORE_REV, help="the commit traced as before")
    parser.add_argument("--top", type=int, default=30, help="modules printed")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(trace(Path(args.child))))
        return
    path = SESSIONS / args.session
    if not path.is_file():
        raise SystemExit(f"real session not found at {path}")
    with tempfile.TemporaryDirectory(prefix="call-trace-") as tmp:
        root = extracted(args.before_rev, tmp)
        before = traced_in(root, path) if root else f"git archive {args.before_rev} failed"
        after = traced_in(str(REPO), path)
    if isinstance(after, str):
        raise SystemExit(f"this tree not traced: {after}")
    print(f"{path.name}: {after['entries']} entries traced")
    report(before, after, args.before_rev, args.top)


if __name__ == "__main__":
    main()
