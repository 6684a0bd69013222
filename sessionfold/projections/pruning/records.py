"""The record kinds the pruning folds keep in the Store, one TypedDict each.

The stored keys are short on purpose and stay exactly as they are: they are changelog bytes (every
`put` is one record on Kafka), and short keys keep every changelog record small. Each key carries
a comment with its long name and meaning. Layouts: `digest.py` (branch digest), `session.py`
(pruning head), `windows.py` (capture), `index.py` (index), `flushing.py` (flushes).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from sessionfold.events.flush import Trigger

# --- branch digest (`h`, `m/<n>`, `t/<id>`, `c/<call id>`) -----------------------------------


class ContextMetricsState(TypedDict):
    """The running sums of the three context metrics: the digest head's `mx`."""

    tot: int  # total_chars: JSON length of every message on the branch
    open: int  # open_cycle_chars: chars after the last text-only assistant
    think: int  # open_cycle_thinking_chars: thinking chars after the last text-only assistant
    chain: int  # open_chain_chars: the open chain's chars (-1: no open chain)
    cpre: int  # chain_prefix_chars: the open chain's chars before its first user (-1: none)
    big: int  # largest_chain_chars: the largest closed or interrupted chain
    gap: int  # frontier_gap_tokens: tokens of results past the frontier, not summarized
    fr: list[Any] | None  # frontier_pair: [turn, call id] of the frontier, None before one
    gb: int  # gap_boundary_row: the boundary row position (-1: the whole branch)
    gt: int  # gap_boundary_turn: the boundary turn (-1: the whole branch)
    gx: list[Any]  # gap_excluded_call_ids: the boundary turn's call ids at or before the frontier
    gw: int | None  # gap_window_start: the first assistant after the boundary (None: still open)
    prot: dict[str, list[str]] | None  # protection: {"tools", "paths"}; None for the default
    ep: int  # epoch: on_summarized calls so far (a summarized mark counts only below it)


class DigestHead(TypedDict):
    """The branch digest's head record `h` of one session."""

    leaf: str | None  # leaf_entry_id: the current branch's leaf
    last: str | None  # last_appended_entry_id: the entry folded last
    k: int  # entries_folded: how many entries (with an id) were folded
    n: int  # branch_messages: messages on the current branch
    turns: int  # branch_assistants: assistants on the current branch
    gen: int  # generation: bumped on every branch switch
    mx: ContextMetricsState  # metrics: the context metrics' running sums
    gap: NotRequired[str | None]  # gap_parent: the entry folded before an unreadable line


class CallFacts(TypedDict):
    """One toolCall block of an assistant message row."""

    id: Any  # tool_call_id as the block has it
    name: Any  # tool_name as the block has it
    path: NotRequired[str]  # path_argument: the call's `path` argument, when a str


# The functional form: `pass` is a stored key and a Python keyword.
MessageRow = TypedDict(
    "MessageRow",
    {
        "n": int,  # position: 0-based position among the branch's messages
        "id": str,  # entry_id
        "role": Any,  # role as the message has it: user, assistant, toolResult, custom, ...
        "chars": int,  # json_chars: JSON.stringify(message).length
        "ts": int | float | None,  # message_timestamp: the message's numeric timestamp
        "ets": str | None,  # entry_timestamp: the entry's ISO timestamp
        "seq": NotRequired[int],  # sequence: the session-event seq, when the caller passed one
        "turn": NotRequired[int],  # turn_index: assistant ordinal on the branch (assistant)
        "textOnly": NotRequired[bool],  # text_only: no toolCall block (assistant)
        "stop": NotRequired[Any],  # stop_reason (assistant)
        "think": NotRequired[
            int
        ],  # thinking_chars: summed JSON length of thinking blocks (assistant)
        "calls": NotRequired[list[CallFacts]],  # tool_calls, in content order (assistant)
        "callId": NotRequired[Any],  # tool_call_id this result answers (toolResult)
        "tool": NotRequired[Any],  # tool_name (toolResult)
        "occ": NotRequired[str],  # occurrence_key: `id@timestamp`, or the bare id (toolResult)
        "tokens": NotRequired[int],  # tokens: floor(chars / 4 + 0.5) (toolResult)
        "isError": NotRequired[Any],  # is_error (toolResult)
        "path": NotRequired[str | None],  # path_argument of the call it answers (toolResult)
        "pass": NotRequired[bool],  # passthrough: a `<compressed-chain` user message (user)
        "customType": NotRequired[Any],  # custom_type (custom)
    },
)
"""The message row `m/<n>`: what one message on the branch decides; by role, see digest."""


class TreeNode(TypedDict):
    """The tree node `t/<entry id>` of one entry."""

    p: str | None  # parent_id
    k: int  # entries_before: entries folded before it
    n: NotRequired[int]  # row_position: its message row's position, if a message
    r: NotRequired[MessageRow]  # parked_row: its row while the entry is off the branch


class CallIndex(TypedDict):
    """`c/<tool call id>`: the latest assistant on the branch with that call id."""

    n: int  # row_position of the assistant
    id: str  # entry_id of the assistant
    path: str | None  # path_argument of the call
    g: int  # generation the row was written in


# --- pruning head (`pr/h`) and capture (`pr/a/<seq>`, `pr/r/<seq>`, `pr/w/<turn>`) -----------


class PruneStats(TypedDict):
    """Model calls, tokens, cost, and what pruning indexed and reclaimed: the head's `stats`."""

    calls: int  # model_calls
    input_tokens: int  # model input tokens
    output_tokens: int  # model output tokens
    cost: float  # model cost
    summaries: int  # summaries written
    summarized_calls: int  # calls a summary covers
    deduped_calls: int  # calls aliased to an identical earlier result
    spilled_calls: int  # calls spilled with a capped preview
    summarized_raw_chars: int  # raw result chars the summaries cover
    summary_chars: int  # chars of the summaries
    reclaimed_chars: int  # raw chars minus summary chars


class ToolWindow(TypedDict):
    """The latest assistant's tool window: the head's `win`."""

    turn: int  # turn_index of the assistant
    a: int  # assistant_seq: its session-event seq (its `a/<seq>` row)
    ids: list[str]  # tool_call_ids in content order
    names: list[str]  # tool_names, one per id


class TurnGate(TypedDict):
    """The turn end not evaluated yet: the head's `gate`."""

    turn: int  # turn_index
    has: bool  # has_results: a result of the turn was paired
    wait: list[str]  # awaited_call_ids: calls still without a result


class PruneHead(TypedDict):
    """The pruning head record `pr/h` of one session."""

    seq: int  # last_seq: highest session-event seq accepted (applied or held)
    held: list[int]  # held_seqs: seqs held by the flush barrier, ascending
    out: str | None  # outstanding_request_id: the flush request not answered yet
    frontier: dict[str, Any] | None  # frontier: the last attempted turn and call, and outcome
    fn: int  # frontier_history_rows: how many `f/<n>` rows there are
    next_ref: int  # next_ref_number: the N of the next `tN` ref
    queued: int  # queued_batches: pi-condense's pendingBatches length (a trigger signal)
    rearmed: bool  # rearmed: a reload re-armed the flush
    prev: float | None  # previous_usage_fraction: at the previous gated turn
    tokens: int | None  # context_tokens: the latest usage reading
    window: int | None  # context_window: the latest window reading
    group: int  # user_turn_group: user messages so far
    win: ToolWindow | None  # tool_window: the latest assistant's tool window
    gate: TurnGate | None  # turn_gate: the turn end not evaluated yet
    pending: list[int]  # pending_turns: turns with paired results not dead behind the frontier
    attempts: int  # flush_attempts: flush-metrics records so far
    aseq: int  # attempt_seq: seq of the last attempt
    an: int  # attempts_at_seq: how many attempts that seq had
    me: int  # message_end_seq: seq whose message-end flush was attempted
    summaries: int  # summary_count: summaries written
    stats: PruneStats  # stats
    config: dict[str, Any]  # config_overrides: the session's config-command settings
    prot: list[list[str]] | None  # protection: [tools, paths] the metrics were last given


class AssistantCall(TypedDict):
    """One call of a captured assistant."""

    id: str  # tool_call_id
    name: str  # tool_name
    args: Any  # arguments: the call's `input ?? arguments`
    path: str | None  # path_argument


class AssistantFacts(TypedDict):
    """`pr/a/<seq>`: a captured assistant, kept while a pending turn needs it."""

    turn: int  # turn_index
    ts: int  # batch_timestamp in ms (0 without one)
    text: str  # assistant_text: the assistant's text blocks
    group: int  # user_turn_group
    calls: list[AssistantCall]  # calls in content order


class Spill(TypedDict):
    """A spilled result: its size and capped head preview."""

    bytes: int  # utf8_bytes of the result text
    preview: str  # head_preview, capped


class ResultFacts(TypedDict):
    """`pr/r/<seq>`: a paired result's facts, kept until the call is indexed."""

    key: str  # occurrence_key
    raw: int  # raw_chars of the result text
    hash: str  # content_hash of tool name and text
    head: str  # result_head: the text's capped head
    err: bool  # is_error
    rts: int | float | None  # result_timestamp
    spill: NotRequired[Spill]  # spill: present when the result is over the spill threshold


class PendingTurn(TypedDict):
    """`pr/w/<turn>`: a pending turn: its assistant and the paired results."""

    a: int  # assistant_seq
    r: dict[str, int]  # result_seqs: call id -> seq of its first result


# --- index (`pr/i/`, `pr/s/`) and flushes (`pr/f/<n>`) ---------------------------------------


class IndexRecord(TypedDict):
    """`pr/i/<occurrence key>`: one indexed call."""

    id: str  # tool_call_id (bare)
    tool: str  # tool_name
    seq: int | None  # result_seq: the toolResult entry's seq, the pointer to the original
    aseq: int | None  # assistant_seq: the assistant entry holding the call
    turn: int  # turn_index
    ts: int  # batch_timestamp
    err: bool  # is_error
    raw: int  # raw_chars
    hash: str  # content_hash
    ref: NotRequired[str]  # ref: its `tN`
    sum: NotRequired[int]  # summary_number
    spill: NotRequired[Spill]  # spill: size and preview of a spilled result
    alias: NotRequired[str]  # alias_of: the occurrence key of the original it duplicates


class SummaryRow(TypedDict):
    """`pr/s/<n>`: summary n, the text that replaces its calls in context."""

    text: str  # summary_text
    refs: list[str]  # refs: the `tN` refs it covers
    keys: list[str]  # occurrence_keys it covers
    turn: int  # turn_index of its batch
    req: str  # request_id of the flush that wrote it


class FrontierRow(TypedDict):
    """`pr/f/<n>`: the frontier after the n-th move, and the leaf it was taken at."""

    frontier: dict[str, Any] | None  # frontier
    leaf: str | None  # leaf_entry_id


class AttemptInfo(TypedDict):
    """One flush attempt as the fold starts it; stored with its plan as `pr/q/<request id>`."""

    id: str  # attempt_id: the flush request id
    n: int  # attempt_number: its flush-metrics record `m/<n>`
    seq: int  # seq: the session event the attempt was taken at
    trigger: Trigger  # trigger: message-end, budget, delta, manual, rearmed
    metrics: dict[str, int]  # metrics: the context metrics snapshot at the attempt
    time: str | None  # time: the event's time
    captured: NotRequired[int]  # captured_batches: how many batches capture found


class OutstandingRequest(AttemptInfo):
    """`pr/q/<request id>`: the outstanding request's attempt and its flush plan."""

    plan: dict[str, Any]  # plan: the flush plan as stored (`flush_request.plan_row`)
