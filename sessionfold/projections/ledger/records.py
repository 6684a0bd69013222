"""The record kinds the ledger fold keeps in the Store (layout: `state.py`), one TypedDict each.

The stored keys stay exactly as they are: they are changelog bytes (every `put` is one record on
Kafka), and short keys keep every changelog record small. Each key carries a comment with its
long name and meaning.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class OurCompaction(TypedDict):
    """The head's `ours`: the newest compaction entry a ledger pass of ours wrote."""

    request: Any  # request_id the entry's details name
    entry: str | None  # entry_id of the compaction entry


class ForeignMark(TypedDict):
    """The head's `foreign`: the newest compaction when it is not ours."""

    entry: str | None  # entry_id of the compaction entry
    seq: int  # seq of the compaction entry


class LedgerHead(TypedDict):
    """The ledger head record `ledger/head` of one session."""

    stateFormat: int  # state_format: the layout version that wrote it
    session: str  # session_id
    seq: int  # last_seq: highest session-event seq folded
    span: int  # closed_spans: the last closed span's number
    n: dict[str, int]  # counters: rows so far per kind (C, E, u, R, ...) and `ev`
    first: dict[str, int]  # open_span_first: the first row of each span kind in the open span
    world: dict[str, Any] | None  # world: the bounded World snapshot
    now: str | None  # now: the latest pass's Now line
    pending: str | None  # pending_request_id: the pass the barrier waits for
    buffer: list[Any]  # held: seqs (and `w<seq>` World markers) held by the barrier, in order
    carried: list[str]  # carried_user_ids: u ids offered again to the next pass
    ours: OurCompaction | None  # ours: the newest compaction of ours
    foreign: ForeignMark | None  # foreign: the newest compaction not ours
    worldSeq: NotRequired[int]  # world_seq: seq of the last World snapshot folded
    open: NotRequired[list[str]]  # open_calls: the last assistant's calls with no result yet


class ForeignSummary(TypedDict):
    """`ledger/foreign`: the newest foreign compaction and its summary's head and tail."""

    entry: str | None  # entry_id of the compaction entry
    seq: int  # seq of the compaction entry
    chars: int  # summary_chars: the whole summary's length
    head: str  # summary_head: its first chars (the whole summary when short)
    tail: str  # summary_tail: its last chars ("" when short)


class BashCall(TypedDict):
    """`ledger/call/<id>`: a bash call waiting for its result."""

    command: str  # command, capped
    seq: int  # seq of the assistant entry
    entry: str | None  # entry_id of the assistant entry


class PollCall(TypedDict):
    """`ledger/call/<id>`: a unified exec poll (`write_stdin`) waiting for its result."""

    poll: str  # exec_session_id: the session it reads, open when the call was folded
    seq: int  # seq of the assistant entry
    entry: str | None  # entry_id of the assistant entry


class ExecSession(TypedDict):
    """`ledger/exec/<session id>`: a unified exec process still running, and the command row
    its polls update (deleted when a poll ends it)."""

    C: int  # command_number: the C<n> exec_command started
    seq: int  # joined_seq: the last result joined (the start's, then each poll's)
    excerpt: str  # output_excerpt of every result joined so far
    values: list[list[str]]  # values read from them so far


class FileCall(TypedDict):
    """`ledger/call/<id>`: a file tool call waiting for its result."""

    file: str  # file_path, capped
    op: str  # operation: read or modified
    seq: int  # seq of the assistant entry
    entry: str | None  # entry_id of the assistant entry


class UserRow(TypedDict):
    """`ledger/u/<n>`: a user message, its text capped (rules quote it)."""

    id: str  # user_id: u<n>
    entry: str | None  # entry_id
    seq: int  # seq
    span: int  # span the message belongs to
    text: str  # text, capped
    chars: int  # text_chars: the whole text's length


class ErrorRow(TypedDict):
    """`ledger/E/<n>`: an error with its id."""

    id: str  # error_id: E<n>
    tool: str | None  # tool_name
    command: str | None  # command_id: the C<n> that failed, for a bash error
    head: str  # error_head: the error's first (or last) lines, capped
    entry: str | None  # entry_id
    seq: int  # seq
    span: int  # span


class CommandRow(TypedDict):
    """`ledger/C/<n>`: a command with its id and outcome."""

    id: str  # command_id: C<n>
    command: str  # command, capped
    exit: int | None  # exit_code
    status: str  # status: the outcome's name
    source: str  # source: "bash" (the agent's tool) or "user" (a bashExecution)
    error: str | None  # error_id: the E<n> it raised
    call: str | None  # tool_call_id
    excerpt: str  # output_excerpt, capped
    values: list[list[str]]  # values: [value, what] the whole output shows, verbatim
    entry: str | None  # entry_id
    seq: int  # seq
    span: int  # span


class FileRow(TypedDict):
    """`ledger/F/<n>`: a file read or modified, once per path and kind."""

    id: str  # file_id: F<n>
    path: str  # file_path
    op: str  # operation: read or modified
    entry: str | None  # entry_id
    seq: int  # seq
    span: int  # span


class RuleLift(TypedDict):
    """A rule's `lifted`: the user message that withdrew it."""

    by: str  # lifted_by: the u id
    entry: str | None  # entry_id of that message
    span: int  # span of the lift
    replacedBy: NotRequired[str]  # replaced_by: the rule that takes its place


class RuleRow(TypedDict):
    """`ledger/R/<n>`: a standing rule, the user's words verbatim."""

    id: str  # rule_id: R<n>
    u: str  # user_id the words stand in
    entry: str | None  # entry_id of that message
    words: str  # words, verbatim
    start: int  # start offset in the message text
    end: int  # end offset in the message text
    span: int  # span
    lifted: RuleLift | None  # lifted: its withdrawal, if any
    replaces: NotRequired[list[str]]  # replaces: rule ids it took the place of


class NoteRow(TypedDict):
    """`ledger/D/<n>` and `ledger/X/<n>`: a decision or a dead end."""

    id: str  # note_id: D<n> or X<n>
    text: str  # text
    evidence: list[str]  # evidence: the ids it rests on
    span: int  # span


class ValueRow(TypedDict):
    """`ledger/V/<n>`: a value the summaries keep."""

    id: str  # value_id: V<n>
    value: str  # value, verbatim
    turn: str  # turn it stands in: u<n>, C<n> or E<n>
    what: str  # what: the kind of value
    span: int  # span


class AnomalyDetail(TypedDict, total=False):
    """What an anomaly names beyond its code: numbers and ids, never text."""

    found: int  # found_state_format: a newer one
    errors: int  # error_count of an invalid payload
    span: int  # span_number out of order
    rule: str  # rule_id refused or not lifted
    u: str  # user_id named
    calls: int  # call_count: calls closed with no result


class AnomalyRow(AnomalyDetail):
    """`ledger/A/<n>`: an anomaly, codes and ids only (never text)."""

    id: str  # anomaly_id: A<n>
    code: str  # code
    seq: int | None  # seq of the event
    entry: str | None  # entry_id


#: Any numbered row (`ledger/<kind>/<n>`).
LedgerRow = UserRow | ErrorRow | CommandRow | FileRow | RuleRow | NoteRow | ValueRow | AnomalyRow
