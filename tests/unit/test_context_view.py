"""The context view's pieces on small hand-made fixtures: the four render phases (reference §7),
chain detection and entries (§8), and pi's context with its compaction and the summaries."""

from __future__ import annotations

from typing import Any

import orjson

from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.config import build_config
from sessionfold.projections.pruning.context_metrics import Protection
from sessionfold.projections.store import DictStore
from sessionfold.projections.views.base import (
    LogEntry,
    SummaryNote,
    _interleave,
    _messages,
    _visible,
    branch_of,
    split_occurrence,
)
from sessionfold.projections.views.chains import (
    ChainEntry,
    ChainRecord,
    CompressionPoint,
    derive_entries,
    detect_chains,
    deterministic_body,
    grace_keys,
    resolve_ref,
)
from sessionfold.projections.views.phases import (
    PruneInputs,
    orphan_positions,
    prune_messages,
    purge_errors,
    resolve_range,
)

SID = "s1"
NO_CHAINS = {"chainCompression": {"enabled": False}}


def user(ts: int, text: str = "do it") -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": ts}


def assistant(ts: int, *calls: tuple[str, str, dict[str, Any]], text: str = "") -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "thinking", "thinking": "hmm"}]
    if text:
        content.append({"type": "text", "text": text})
    content += [{"type": "toolCall", "id": i, "name": n, "arguments": a} for i, n, a in calls]
    return {"role": "assistant", "content": content, "timestamp": ts}


def result(
    ts: int, call_id: str, name: str = "bash", text: str = "out", error: bool = False
) -> dict:
    return {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": name,
        "content": [{"type": "text", "text": text}],
        "isError": error,
        "timestamp": ts,
    }


def index_row(store: DictStore, occ: str, seq: int, **extra: Any) -> None:
    """An index record as the fold writes it (index.py), without the metrics side effects."""
    row = {"id": split_occurrence(occ)[0], "tool": "bash", "seq": seq, "turn": 0, "ts": 0}
    row.update(extra)
    store.put(pruning.row_key(SID, "i", occ), row)
    if "ref" in row and "alias" not in row:
        store.put(pruning.row_key(SID, "ref", row["ref"]), occ)


def inputs(store: DictStore, settings: dict[str, Any] | None = None, **kw: Any) -> PruneInputs:
    return PruneInputs(store, SID, build_config(settings or {}), **kw)


# --- phase 1: stubs --------------------------------------------------------------------------


def test_no_op_render_returns_the_same_list() -> None:
    """Nothing indexed, nothing errored, no chains: the very input list comes back (§7.1)."""
    messages = [user(1), assistant(2, ("a", "bash", {})), result(3, "a"), assistant(4, text="ok")]
    out = prune_messages(messages, inputs(DictStore()))
    assert out.messages is messages
    assert (out.pruned, out.before_chars, out.after_chars) == (False, 0, 0)


def test_summarized_result_becomes_a_stub_citing_its_ref() -> None:
    """A stub keeps role, id, name and timestamp, says isError false, and cites the tN (§7.2)."""
    store = DictStore()
    index_row(store, "a@3", seq=7, ref="t4")
    original = result(3, "a", text="x" * 500, error=True)
    messages = [user(1), assistant(2, ("a", "bash", {})), original]
    out = prune_messages(messages, inputs(store, origin={id(original): 7}))
    stub = out.messages[2]
    assert stub == {
        "role": "toolResult",
        "toolCallId": "a",
        "toolName": "bash",
        "content": [
            {
                "type": "text",
                "text": "[Summarized in pruner summary, ref `t4`. "
                "Use context_tree_query to retrieve full output.]",
            }
        ],
        "isError": False,
        "timestamp": 3,
    }
    assert messages[2] is original  # the input is never mutated
    assert [(r.seq, r.key, r.ref, r.how) for r in out.removed] == [(7, "a@3", "t4", "stub")]
    assert out.before_chars > out.after_chars > 0


def test_stub_lookup_is_strict_by_occurrence() -> None:
    """The same bare id at another timestamp is a different output: left alone (§14.5)."""
    store = DictStore()
    index_row(store, "a@3", seq=7, ref="t1")
    messages = [user(1), assistant(2, ("a", "bash", {})), result(99, "a")]
    assert prune_messages(messages, inputs(store)).messages is messages


def test_spilled_record_stub_has_preview_and_ref() -> None:
    """A spilled record's stub shows its size and head and cites its occurrence key."""
    store = DictStore()
    index_row(store, "a@3", seq=7, spill={"bytes": 70000, "preview": "line 1\nline 2"})
    messages = [user(1), assistant(2, ("a", "read", {"path": "x"})), result(3, "a", "read")]
    text = prune_messages(messages, inputs(store)).messages[2]["content"][0]["text"]
    assert text.splitlines() == [
        "[Oversized output spilled — 70000 bytes.]",
        "Tool: read",
        "Preview (head):",
        "line 1",
        "line 2",
        "Full output: use context_tree_query with ref `a@3`.",
    ]


def test_dedup_alias_stub_cites_the_original_ref() -> None:
    """A deduplicated output inherits its original's tN (§5.3)."""
    store = DictStore()
    index_row(store, "a@3", seq=7, ref="t2")
    index_row(store, "b@9", seq=11, alias="a@3", ref="t2")
    messages = [user(1), assistant(8, ("b", "bash", {})), result(9, "b")]
    out = prune_messages(messages, inputs(store))
    assert "`t2`" in out.messages[2]["content"][0]["text"]
    assert resolve_ref(store, SID, "t2") == 7


def test_protected_output_is_repaired_at_render_time() -> None:
    """An indexed output whose call is protected under the current config stays verbatim."""
    store = DictStore()
    index_row(store, "a@3", seq=7, ref="t1", tool="read")
    call = ("a", "read", {"path": "/repo/skills/x/SKILL.md"})
    messages = [user(1), assistant(2, call), result(3, "a", "read")]
    assert prune_messages(messages, inputs(store)).messages is messages
    settings = {"protectedPaths": []}
    assert prune_messages(messages, inputs(store, settings)).pruned


def test_recovery_output_stays_verbatim_for_the_grace_window() -> None:
    """A context_tree_query result is stubbed only once it is older than K user turns."""
    store = DictStore()
    index_row(store, "q@3", seq=7, ref="t9", tool="context_tree_query")
    base = [
        user(1),
        assistant(2, ("q", "context_tree_query", {})),
        result(3, "q", "context_tree_query"),
    ]
    young = [*base, user(10), user(20)]
    old = [*young, user(30), user(40)]
    settings = {"recoveryGraceTurns": 3}
    assert prune_messages(young, inputs(store, settings)).messages is young
    assert prune_messages(old, inputs(store, settings)).pruned
    assert grace_keys(young, 3) == {"q@3"}
    assert grace_keys(old, 3) == frozenset()
    assert grace_keys(young, 0) == frozenset()


# --- phase 2: error purge --------------------------------------------------------------------


def test_error_purge_after_cooldown_only_for_big_arguments() -> None:
    """Failed calls' arguments are replaced once `cooldown` assistants followed (§7.4)."""
    big = {"content": "x" * 600}
    messages = [
        user(1),
        assistant(2, ("a", "write", big), ("b", "write", {"content": "y"})),
        result(3, "a", "write", "boom", error=True),
        result(4, "b", "write", "boom", error=True),
        assistant(5, text="retrying"),
    ]
    assert purge_errors(messages, 2, 500) is messages  # age 1 < cooldown 2
    later = [*messages, assistant(6, text="again")]
    out = purge_errors(later, 2, 500)
    size = len(orjson.dumps(big))
    assert out[1]["content"][1]["arguments"] == {"_purged": f'<purged-errored-args size="{size}"/>'}
    assert out[1]["content"][2]["arguments"] == {"content": "y"}  # too small
    assert later[1]["content"][1]["arguments"] is big  # input untouched
    assert out[2] is later[2]  # the error result stays


# --- phase 4: orphan sweep -------------------------------------------------------------------


def test_orphan_sweep_treats_every_other_role_as_a_barrier() -> None:
    """A result after a non-assistant message, or a second result for one call, is swept."""
    messages = [
        user(1),
        assistant(2, ("a", "bash", {}), ("b", "bash", {})),
        result(3, "a"),
        {"role": "bashExecution", "command": "ls", "output": "", "timestamp": 4},
        result(5, "b"),
        assistant(6, ("c", "bash", {})),
        result(7, "c"),
        result(8, "c"),
    ]
    assert orphan_positions(messages) == [4, 7]
    out = prune_messages(messages, inputs(DictStore(), NO_CHAINS, origin={id(messages[4]): 40}))
    assert [m.get("timestamp") for m in out.messages] == [1, 2, 3, 4, 6, 7]
    assert [d.kind for d in out.diagnostics] == ["orphan-sweep"]
    assert {(r.seq, r.ref, r.how) for r in out.removed} >= {(40, "e40", "orphan")}


# --- chains ----------------------------------------------------------------------------------


def _session() -> list[dict[str, Any]]:
    """Two closed chains and an open one."""
    return [
        user(100, "first"),
        assistant(101, ("a", "bash", {"command": "ls"})),
        result(102, "a", text="files"),
        assistant(103, ("p", "read", {"path": "/r/skills/s/SKILL.md"})),
        result(104, "p", "read", "PROTECTED TEXT"),
        assistant(105, text="done one"),
        user(200, "second"),
        assistant(201, ("b", "bash", {"command": "make"})),
        result(202, "b", text="built"),
        assistant(203, text="done two"),
        user(300, "third"),
        assistant(301, ("c", "bash", {})),
    ]


def test_detect_chains_closed_protected_and_open() -> None:
    """Closed chains carry their middles, keys and protected ids; an open chain is left out."""
    chains = detect_chains(_session(), Protection())
    assert [(c.start, c.end, c.start_ts, c.final_ts) for c in chains] == [
        (0, 5, 100, 105),
        (6, 9, 200, 203),
    ]
    assert chains[0].middle_ids == ("a", "p")
    assert chains[0].middle_keys == ("a@102", "p@104")
    assert chains[0].protected_ids == ("p",)


def test_deterministic_body_grammar() -> None:
    """Seven lines: head, calls, tool histogram, span, first and last call, refs (§8.3)."""
    records = [
        ChainRecord("b@5000", 9, "read", {"path": "x" * 300}, 5_000, "e9"),
        ChainRecord("a@1000", 7, "bash", {"command": "ls"}, 1_000, "t3"),
        ChainRecord("c@9600", 11, "read", {}, 9_600, "e11"),
    ]
    lines = deterministic_body(records).split("\n")
    assert lines[0].startswith("Deterministic chain compression (no per-batch summary")
    assert lines[1:4] == [
        "Calls: 3",
        "Tools: read x2, bash x1",
        "Span: 1970-01-01T00:00:01.000Z -> 1970-01-01T00:00:09.600Z (9s)",
    ]
    assert lines[4] == 'First: bash {"command":"ls"}'
    assert lines[5] == "Last: read {}"
    assert lines[6] == "Refs: e9, t3, e11"
    assert len(deterministic_body(records[:1]).split("\n")[4]) == len("First: read ") + 203


def _points(*seqs: int, window: int = 1) -> list[CompressionPoint]:
    return [CompressionPoint(s, True, 1_000_000 + s, window, n) for n, s in enumerate(seqs, 1)]


def test_derive_entries_window_and_bodies() -> None:
    """Closed chains beyond the window compress; uncovered ones get a deterministic body citing
    each output's log position, covered ones keep their summaries; protected ids are kept."""
    messages = _session()
    seqs = list(range(1, len(messages) + 1))
    store = DictStore()
    index_row(store, "b@202", seq=9, ref="t1")

    def covered(keys: Any, attempt: int) -> bool:
        return "b@202" in keys

    def ref_of(key: str, seq: int | None) -> str:
        from sessionfold.projections.views.chains import ref_for

        return ref_for(store, SID, key, seq)  # type: ignore[return-value]

    entries, problems = derive_entries(
        messages, seqs, _points(6, 10), covered, ref_of, Protection(), 3
    )
    assert problems == []
    assert [e.block_id for e in entries] == ["b1"]  # window 1: only the oldest at seq 10
    first = entries[0]
    assert first.tool_refs == ("e3",)  # the protected read gets no ref: it is relocated
    assert first.protected_tool_call_ids == ("p",)
    assert first.body_source == "deterministic"
    assert first.compressed_at == 1_000_010
    entries, _ = derive_entries(
        messages, seqs, _points(6, 10, 13, window=0), covered, ref_of, Protection(), 3
    )
    assert [(e.block_id, e.tool_refs, e.range_summary_text) for e in entries][1] == (
        "b2",
        ("t1",),
        None,
    )


def _render(messages: list[dict[str, Any]], entries: list[ChainEntry], **kw: Any) -> Any:
    store = DictStore()
    return prune_messages(messages, inputs(store, kw.pop("settings", None), chains=entries, **kw))


def _entry(**kw: Any) -> ChainEntry:
    data: dict[str, Any] = {
        "block_id": "b1",
        "start_user_timestamp": 100,
        "final_assistant_timestamp": 105,
        "dropped_tool_call_ids": ("a", "p"),
        "dropped_occurrence_keys": ("a@102", "p@104"),
        "protected_tool_call_ids": ("p",),
        "tool_refs": ("e3",),
        "compressed_at": 150,
        "range_summary_text": "BODY {b7} {b1}",
    }
    data.update(kw)
    return ChainEntry(**data)


def test_chain_range_prune_synthetic_relocation_and_thinking_strip() -> None:
    """The range's assistants and results go, the synthetic follows the start user message with
    the protected output relocated verbatim, the final reply loses its thinking (§7.5, §8.5)."""
    messages = _session()
    out = _render(messages, [_entry()], origin={id(messages[2]): 3})
    roles = [m["role"] for m in out.messages]
    assert roles[:3] == ["user", "user", "assistant"]
    assert out.messages[1] == {
        "role": "user",
        "content": [
            {
                "type": "text",
                "text": '<compressed-chain id="b1" tools="e3">\nBODY {b7} {b1}\n\n'
                '<protected-output tool="read">\nPROTECTED TEXT\n</protected-output>\n'
                "</compressed-chain>",
            }
        ],
        "timestamp": 150,
    }
    assert [b["type"] for b in out.messages[2]["content"]] == ["text"]
    assert [(r.seq, r.ref, r.how) for r in out.removed] == [(3, "e3", "chain")]


def test_chain_prune_is_idempotent_and_fail_closed() -> None:
    """Re-rendering the output does not insert a second synthetic; an entry whose boundaries do
    not resolve uniquely drops nothing and reports `unresolved-range`."""
    messages = _session()
    once = _render(messages, [_entry()]).messages
    twice = _render(once, [_entry()]).messages
    assert orjson.dumps(twice) == orjson.dumps(once)
    unresolved = _render(messages, [_entry(final_assistant_timestamp=999)], settings=NO_CHAINS)
    assert unresolved.messages is messages
    unresolved = _render(messages, [_entry(final_assistant_timestamp=999)])
    assert unresolved.messages is messages
    assert [d.kind for d in unresolved.diagnostics] == ["unresolved-range"]
    assert resolve_range(_entry(start_user_timestamp=200), messages) is None  # 200 < 105


def test_covered_chain_body_and_summary_suppression() -> None:
    """Without its own body an entry shows the overlapping summaries; summaries of dropped
    outputs go, wherever they sit; `{bN}` is replaced one level deep."""
    messages = _session()
    summary = {
        "role": "custom",
        "customType": "context-prune-summary",
        "content": "SUM",
        "display": False,
        "details": {"toolCallRefs": [{"shortId": "t1", "toolCallId": "a", "resultTimestamp": 102}]},
        "timestamp": 106,
    }
    with_summary = [*messages[:6], summary, *messages[6:]]
    second = _entry(
        block_id="b2",
        start_user_timestamp=200,
        final_assistant_timestamp=203,
        dropped_tool_call_ids=("b",),
        dropped_occurrence_keys=("b@202",),
        protected_tool_call_ids=(),
        tool_refs=("e9",),
        range_summary_text="see {b1}",
    )
    out = _render(
        with_summary,
        [_entry(range_summary_text=None), second],
        summaries=[(("a@102",), "SUM")],
    )
    texts = [
        m["content"][0]["text"] for m in out.messages if m["role"] == "user" and "<comp" in str(m)
    ]
    assert texts[0].startswith('<compressed-chain id="b1" tools="e3">\nSUM\n\n<protected-output')
    assert texts[1] == '<compressed-chain id="b2" tools="e9">\nsee SUM\n</compressed-chain>'
    assert all(m.get("customType") != "context-prune-summary" for m in out.messages)


# --- pi's context ----------------------------------------------------------------------------


def _entry_of(n: int, kind: str, parent: int | None, **fields: Any) -> LogEntry:
    entry = {"type": kind, "id": f"e{n}", "parentId": f"e{parent}" if parent else None}
    entry["timestamp"] = "2025-01-01T00:00:00.000Z"
    entry.update(fields)
    return LogEntry(n, entry)


def test_branch_and_compaction_keep_what_pi_keeps() -> None:
    """The branch ends at the leaf; after a compaction pi sends its summary, the kept entries
    from firstKeptEntryId, and what follows (pi-session-format §1.8)."""
    entries = [
        _entry_of(1, "message", None, message=user(1, "a")),
        _entry_of(2, "message", 1, message=assistant(2, text="b")),
        _entry_of(3, "message", 2, message=user(3, "c")),
        _entry_of(4, "message", 3, message=assistant(4, text="d")),
        _entry_of(5, "compaction", 4, summary="S", tokensBefore=9, firstKeptEntryId="e3"),
        _entry_of(6, "message", 5, message=user(6, "e")),
        _entry_of(7, "message", 2, message=user(7, "other branch")),
    ]
    branch = branch_of(entries, "e6")
    assert [e.seq for e in branch] == [1, 2, 3, 4, 5, 6]
    note = SummaryNote(1, 4, False, {"role": "custom", "content": "N"}, (), 1)
    dropped = SummaryNote(2, 2, True, {"role": "custom", "content": "old"}, (), 1)
    origin: dict[int, int] = {}
    messages = _messages(_visible(_interleave(branch, [note, dropped])), origin)
    assert [m["role"] for m in messages] == [
        "compactionSummary",
        "user",
        "custom",
        "assistant",
        "user",
    ]
    assert messages[0]["summary"] == "S" and messages[2]["content"] == "N"
    assert sorted(origin.values()) == [3, 4, 6]
    assert [e.seq for e in branch_of(entries, "e7")] == [1, 2, 7]


def test_an_older_compaction_inside_the_kept_range_is_its_summary() -> None:
    """A second compaction that keeps entries from before the first: pi 0.83 sends the first
    one's summary where it stands in the kept range (its buildContextEntries), not nothing."""
    entries = [
        _entry_of(1, "message", None, message=user(1, "a")),
        _entry_of(2, "message", 1, message=assistant(2, text="b")),
        _entry_of(3, "compaction", 2, summary="S1", tokensBefore=9, firstKeptEntryId="e2"),
        _entry_of(4, "message", 3, message=user(4, "c")),
        _entry_of(5, "compaction", 4, summary="S2", tokensBefore=7, firstKeptEntryId="e2"),
        _entry_of(6, "message", 5, message=user(6, "d")),
    ]
    messages = _messages(_visible(branch_of(entries, "e6")), {})
    assert [(m["role"], m.get("summary")) for m in messages] == [
        ("compactionSummary", "S2"),
        ("assistant", None),
        ("compactionSummary", "S1"),
        ("user", None),
        ("user", None),
    ]


def test_branch_of_follows_placeholders_and_gaps() -> None:
    """The context view's branch uses the digest's rule for dead lines: a placeholder is a
    node (under the entry before it when `previous`), an orphan after a gap hangs under the
    entry the gap followed, a second entry with an id is no node, and a cycle ends the walk."""
    from sessionfold.events.envelope import PlaceholderEnvelope, PlaceholderPayload
    from sessionfold.projections.views.base import branch_of, log_entry

    def entry(seq: int, entry_id: str, parent: str | None) -> LogEntry:
        return LogEntry(seq, {"type": "label", "id": entry_id, "parentId": parent})

    def place(seq: int, **fields: object) -> LogEntry:
        payload = PlaceholderPayload(reason="r", **fields)  # type: ignore[arg-type]
        item = log_entry(PlaceholderEnvelope(session_id="s", seq=seq, payload=payload))
        assert item is not None
        return item

    entries = [
        entry(1, "a", None),
        place(2, id="b", parentId="a"),
        entry(3, "c", "b"),
        place(4, id="d", previous=True),
        place(5),
        entry(6, "f", "lost"),
        entry(7, "a", "f"),
        entry(8, "g", "f"),
    ]
    assert [i.seq for i in branch_of(entries, "g")] == [1, 2, 3, 4, 6, 8]
    cycle = [entry(1, "x", "y"), entry(2, "y", "x")]
    assert [i.seq for i in branch_of(cycle, "y")] == [1, 2]
