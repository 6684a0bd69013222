"""Keeping a long-running process's long-lived objects out of the garbage collector's way.

`sessionfold serve` holds every live session's entries and state in memory: hundreds of
thousands of objects per few dozen sessions, nearly all of them kept for the process's life.
CPython's full collection walks every one of them, and it runs each time the heap has grown by a
quarter: pauses that grow with the heap (0.1 to 0.6 s over 30 sessions of 1,000 messages on the
development machine, seconds at 200), during which no call is answered. Frozen objects
(`gc.freeze`) are never walked again, and what survives a full collection is what the process
keeps; so freezing right after each full collection bounds the next one by what was allocated
since. The cost: a cycle among frozen objects that later becomes garbage is never collected (the
folds' rows and entries are JSON-like and acyclic, freed by reference counting).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any


def freeze_after_full_collections() -> Callable[[], None]:
    """From now on, freeze what survives each full collection; returns the undo (which leaves
    frozen objects frozen)."""

    def frozen_after(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info.get("generation") == 2:
            gc.freeze()

    gc.callbacks.append(frozen_after)

    def undo() -> None:
        if frozen_after in gc.callbacks:
            gc.callbacks.remove(frozen_after)

    return undo
