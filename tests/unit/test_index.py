"""The index projection (projections/pruning/index.py): records, refs, canonical hashes, aliases."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sessionfold.projections.pruning import index
from sessionfold.projections.pruning.capture import Call
from sessionfold.projections.store import DictStore

SID = "s-index"


def _call(call_id: str, content_hash: str = "h", raw: int = 100) -> Call:
    return Call(
        key=f"{call_id}@5",
        tool_call_id=call_id,
        tool_name="bash",
        raw_chars=raw,
        content_hash=content_hash,
        head="",
        seq=11,
        is_error=True,
        assistant_seq=10,
    )


def test_a_summarized_batch_is_indexed_with_refs_and_its_summary_number() -> None:
    """Each call's record points at its original and names its ref; each ref names the call."""
    store = DictStore()
    calls = [_call("a", "ha"), _call("b", "hb")]
    index.add_batch(store, SID, calls, turn=3, timestamp=99, refs=["t1", "t2"], summary_number=1)
    assert index.record(store, SID, "a@5") == {
        "id": "a",
        "tool": "bash",
        "seq": 11,
        "aseq": 10,
        "turn": 3,
        "ts": 99,
        "err": True,
        "raw": 100,
        "hash": "ha",
        "ref": "t1",
        "sum": 1,
    }
    assert [index.resolve_ref(store, SID, r) for r in ("t1", "t2", "t3")] == ["a@5", "b@5", None]
    assert index.is_summarized(store, SID, "b@5")
    assert not index.is_summarized(store, SID, "b")  # strict: never a bare-id lookup


def test_a_spilled_call_keeps_its_spill_and_has_no_ref() -> None:
    """A spill (no summary) records the spill facts and neither ref nor summary number."""
    store = DictStore()
    spill = {"bytes": 9000, "preview": "head"}
    index.add_batch(store, SID, [_call("a")], turn=0, timestamp=0, spills=[spill])
    record = index.record(store, SID, "a@5") or {}
    assert record["spill"] == spill
    assert "ref" not in record and "sum" not in record


def test_the_first_call_with_a_content_hash_stays_canonical() -> None:
    """A later batch with the same content hash does not replace the canonical key."""
    store = DictStore()
    index.add_batch(store, SID, [_call("a", "H")], turn=0, timestamp=0)
    index.add_batch(store, SID, [_call("b", "H")], turn=1, timestamp=0)
    assert index.canonical_of(store, SID, "H") == "a@5"
    assert index.canonical_of(store, SID, "other") is None


def test_an_alias_inherits_the_originals_ref() -> None:
    """A dedup alias names its original and resolves to the original's ref."""
    store = DictStore()
    index.add_batch(store, SID, [_call("a", "H")], turn=0, timestamp=0, refs=["t4"])
    index.add_alias(store, SID, _call("b", "H"), "a@5", turn=2, timestamp=7)
    alias = index.record(store, SID, "b@5") or {}
    assert (alias["alias"], alias["ref"], alias["turn"]) == ("a@5", "t4", 2)
    assert index.is_summarized(store, SID, "b@5")


def test_an_alias_of_an_unreffed_original_has_no_ref() -> None:
    """An original without a ref (a spill) leaves its alias without one."""
    store = DictStore()
    index.add_alias(store, SID, _call("b"), "missing@1", turn=0, timestamp=0)
    assert "ref" not in (index.record(store, SID, "b@5") or {})


def test_summaries_are_stored_by_number() -> None:
    """A summary keeps its text, refs, occurrence keys, turn and request id."""
    store = DictStore()
    index.add_summary(
        store, SID, 2, text="did x", refs=["t1"], keys=["a@5"], turn=4, request_id="r:1"
    )
    assert index.summary(store, SID, 2) == {
        "text": "did x",
        "refs": ["t1"],
        "keys": ["a@5"],
        "turn": 4,
        "req": "r:1",
    }
    assert index.summary(store, SID, 1) is None


@given(hashes=st.lists(st.sampled_from("ABC"), min_size=1, max_size=8))
def test_each_hash_is_canonical_for_its_first_call(hashes: list[str]) -> None:
    """Whatever the order of batches, a hash's canonical key is the first call indexed with it."""
    store = DictStore()
    for n, content_hash in enumerate(hashes):
        index.add_batch(store, SID, [_call(f"c{n}", content_hash)], turn=n, timestamp=0)
    for content_hash in set(hashes):
        assert index.canonical_of(store, SID, content_hash) == f"c{hashes.index(content_hash)}@5"
