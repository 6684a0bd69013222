"""serve's garbage-collector policy (streams/runtime/heap.py): what survives a full collection is
frozen, so the next full collection walks only what came since; garbage is still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from sessionfold.streams.runtime.heap import freeze_after_full_collections


class _Node:
    """A cycle-capable object (lists and dicts of scalars are freed without the collector)."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def policy() -> Iterator[None]:
    undo = freeze_after_full_collections()
    try:
        yield
    finally:
        undo()
        gc.unfreeze()


def test_what_survives_a_full_collection_is_not_walked_again(policy: None) -> None:
    """After a full collection a big long-lived heap is frozen: no generation the collector
    walks holds it any more."""
    kept = [{"n": [i, {"k": i}]} for i in range(100_000)]  # the sessions' rows, say
    gc.collect()
    assert gc.get_freeze_count() >= len(kept)
    walked = sum(len(gc.get_objects(generation)) for generation in range(3))
    assert walked < len(kept)
    assert kept[-1]["n"][0] == 99_999


def test_garbage_made_after_a_freeze_is_still_collected(policy: None) -> None:
    """A cycle made after the freeze and dropped is collected by the next collection."""
    gc.collect()
    node = _Node()
    alive = weakref.ref(node)
    del node
    gc.collect()
    assert alive() is None


def test_undo_stops_freezing() -> None:
    """Without the policy (after its undo) a full collection freezes nothing."""
    undo = freeze_after_full_collections()
    undo()
    gc.unfreeze()
    gc.collect()
    assert gc.get_freeze_count() == 0
