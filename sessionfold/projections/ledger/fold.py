"""The ledger fold: session events into the Store, pass requests out, pass results back in.

`apply(envelope)` folds one envelope: every bash command with its exit code (C<n>), every
error (E<n>), every user message (u<n>), the World. A `compact-request`, or a pi `compaction`
entry that is not ours, ends the open span: the fold emits a pass request (the state snapshot
and the messages to label) and holds the session's later events (the flush barrier) until
`apply_pass` folds the answer. Pure: no I/O but the Store, no clock, no randomness.
"""

from __future__ import annotations

import hashlib
import logging
from functools import lru_cache
from typing import Any, Unpack

import orjson
from pydantic import ValidationError

from sessionfold.events.envelope import (
    LEDGER_PRODUCER,
    SESSION_EVENT_KINDS,
    CompactionEnvelope,
    EntryEnvelope,
    Envelope,
    Kind,
    PlaceholderEnvelope,
    WorldEnvelope,
    from_dict,
)
from sessionfold.events.ledger import (
    SPAN_RECORD_TYPE,
    SPAN_RECORD_VERSION,
    STATE_FORMAT,
    LedgerPassPayload,
    LiftEvent,
    NoteEvent,
    RuleEvent,
    StateFormatError,
    ValueEvent,
    check_state_format,
)
from sessionfold.projections.ledger import commands
from sessionfold.projections.ledger.config import LedgerConfig
from sessionfold.projections.ledger.pass_rows import note_row, rule_lift, rule_row, value_row
from sessionfold.projections.ledger.records import (
    AnomalyDetail,
    AnomalyRow,
    BashCall,
    CommandRow,
    ExecSession,
    FileCall,
    ForeignSummary,
    LedgerHead,
    LedgerRow,
    PollCall,
)
from sessionfold.projections.ledger.rules import lift_check
from sessionfold.projections.ledger.state import (
    ledger_key,
    new_head,
    open_rows,
    snapshot,
    span_has_content,
)
from sessionfold.projections.ledger.text import user_words
from sessionfold.projections.ledger.values import command_values, without_cut
from sessionfold.projections.pruning.entry_facts import DROPPED_STOPS, EntryFacts, facts_of
from sessionfold.projections.store import Store

log = logging.getLogger(__name__)

PassRequest = dict[str, Any]


def request_id(session_id: str, seq: int) -> str:
    """The id of the pass a session event at `seq` asks for: deterministic, one per event."""
    return f"{session_id}/ledger/{seq}"


@lru_cache(maxsize=4096)
def path_digest(path: str) -> str:
    """The key part of a file's index row: its path's sha256, 20 hex digits. Kept per path
    (a session reads and edits the same files again and again; a digest costs more than the
    rest of the row)."""
    return hashlib.sha256(path.encode()).hexdigest()[:20]


def is_ours(entry: dict[str, Any]) -> bool:
    """True for a pi compaction entry whose summary a sessionfold ledger pass wrote."""
    details = entry.get("details")
    return isinstance(details, dict) and details.get("producer") == LEDGER_PRODUCER


class LedgerFold:
    """Folds one or many sessions' envelopes into ledger rows of a Store."""

    def __init__(self, store: Store, config: LedgerConfig | None = None) -> None:
        self.store = store
        self.config = config or LedgerConfig()

    # --- entry points -------------------------------------------------------------------

    def apply(self, envelope: Envelope) -> list[PassRequest]:
        """Fold one envelope; return the pass requests it raises (zero or one)."""
        if isinstance(envelope, EntryEnvelope):
            pass  # a session event (the common one, told apart first)
        elif isinstance(envelope, CompactionEnvelope):
            return self.apply_pass(envelope.payload.model_dump())
        elif envelope.kind not in SESSION_EVENT_KINDS:
            return []
        elif isinstance(envelope, WorldEnvelope):
            return self._world(envelope)
        head = self._head(envelope.session_id)
        if envelope.seq <= head["seq"]:
            return []  # redelivery, replay or duplicate publish
        head["seq"] = envelope.seq
        if head["pending"] is not None:
            # Flush barrier: hold the event until the pass result is folded.
            self.store.put(
                ledger_key(head["session"], "buf", envelope.seq), envelope.model_dump(mode="json")
            )
            head["buffer"].append(envelope.seq)
            self._put_head(head)
            return []
        requests = self._drain(head) if head["buffer"] else []
        if head["pending"] is not None:
            head["buffer"].append(envelope.seq)
            self.store.put(
                ledger_key(head["session"], "buf", envelope.seq), envelope.model_dump(mode="json")
            )
            self._put_head(head)
            return requests
        requests += self._event(head, envelope)
        return requests

    def apply_pass(self, payload: dict[str, Any]) -> list[PassRequest]:
        """Fold a pass result (a compaction payload); return requests raised by held events."""
        session = payload.get("session") if isinstance(payload, dict) else None
        if not isinstance(session, str) or not session:
            log.warning("ledger payload without a session", extra={"ledger": {"code": "invalid"}})
            return []
        head = self._head(session)
        if head["pending"] is None or head["pending"] != payload.get("request"):
            # An answer to nothing this state waits for: a second answer, or one that overtook
            # the state that asked (on Kafka a request can land before the writes of the event
            # that raised it, and a crash lose those). Ignored, so when the event is folded
            # again and asks again, that answer is applied.
            return []
        return self._apply_payload(head, payload, seq=None, entry=None) + self._drain(head)

    def request_pass(self, session_id: str, seq: int, trigger: str = "end") -> list[PassRequest]:
        """Ask for a pass over the open span now (e.g. at the end of a file), as of `seq`."""
        head = self._head(session_id)
        if head["pending"] is not None or seq <= head["seq"]:
            return []
        head["seq"] = seq
        requests = self._request(head, seq, trigger, None)
        self._put_head(head)
        return requests

    # --- head, rows, anomalies ----------------------------------------------------------

    def _head(self, session_id: str) -> LedgerHead:
        # `load_head`, without a call per key: the head is read at every event.
        head: LedgerHead | None = self.store.get(f"{session_id}/ledger/head")
        if not isinstance(head, dict):
            return new_head(session_id)
        if head.get("stateFormat") == STATE_FORMAT:
            return head  # this build's format: nothing to check
        try:
            check_state_format(head.get("stateFormat"), "stored ledger state")
        except StateFormatError as exc:
            # A downgrade starts a clean state rather than misreading one.
            head = new_head(session_id)
            self._anomaly(head, "state-format-newer", None, None, found=exc.found)
        return head

    def _put_head(self, head: LedgerHead) -> None:
        session = head["session"]
        self.store.put(f"{session}/ledger/head", head)  # ledger_key(session, "head")

    def _put_row(self, head: LedgerHead, kind: str, row: LedgerRow) -> int:
        number: int = head["n"].get(kind, 0) + 1  # .get: a head from before a kind existed
        head["n"][kind] = number
        self.store.put(f"{head['session']}/ledger/{kind}/{number}", row)  # ledger_key
        return number

    def _anomaly(
        self,
        head: LedgerHead,
        code: str,
        seq: int | None,
        entry: str | None,
        **detail: Unpack[AnomalyDetail],
    ) -> None:
        number = head["n"]["A"] + 1
        row: AnomalyRow = {"id": f"A{number}", "code": code, "seq": seq, "entry": entry, **detail}
        self._put_row(head, "A", row)
        log.warning("ledger anomaly", extra={"ledger": {"code": code, "seq": seq}})

    # --- one session event --------------------------------------------------------------

    def _world(self, envelope: WorldEnvelope) -> list[PassRequest]:
        """Fold a World snapshot: unsequenced, it carries the seq of the event it follows.

        A publisher takes snapshots between a file's lines, so a snapshot takes no sequence
        number of its own (entries keep the seq a plain read of the file gives). A snapshot
        older than the last one folded is a redelivery and ignored; one of the same seq is a
        newer look at the same point and replaces it. While the barrier is up it is held in
        log order like any event, so a pass a held event raises sees the World it followed.
        """
        head = self._head(envelope.session_id)
        if envelope.seq < head.get("worldSeq", -1):
            return []
        head["worldSeq"] = envelope.seq
        if head["pending"] is None and not head["buffer"]:
            return self._event(head, envelope)
        marker = f"w{envelope.seq}"
        self.store.put(ledger_key(head["session"], "buf", marker), envelope.model_dump(mode="json"))
        if marker in head["buffer"]:
            head["buffer"].remove(marker)  # the newer look at that point goes where it arrived
        head["buffer"].append(marker)
        self._put_head(head)
        return []

    def _event(self, head: LedgerHead, envelope: Envelope) -> list[PassRequest]:
        requests: list[PassRequest] = []
        cleanup: list[str] = []
        if isinstance(envelope, EntryEnvelope):
            facts = facts_of(envelope)
            entry_id = facts.id if facts.kind != "session" else None
            if self._second_id(head, entry_id, envelope.seq):
                self._anomaly(head, "duplicate-id", envelope.seq, entry_id)
            else:
                requests = self._entry(head, envelope.payload.entry, facts, envelope.seq, cleanup)
        elif isinstance(envelope, PlaceholderEnvelope):
            # A dead-lettered entry: nothing to fold, but its id is taken.
            self._second_id(head, envelope.payload.id, envelope.seq)
        elif isinstance(envelope, WorldEnvelope):
            head["world"] = self._bounded_world(envelope.payload.facts)
        elif envelope.kind == Kind.COMPACT_REQUEST:
            requests = self._request(head, envelope.seq, "compact-request", None)
        self._put_head(head)
        for stale in cleanup:  # after the head, so a crash before it loses nothing
            self.store.delete(stale)
        return requests

    def _second_id(self, head: LedgerHead, entry_id: str | None, seq: int) -> bool:
        """True when an earlier event folded an entry with this id (None: the header or no
        id); else note the id.

        pi never reuses an id; the reader dead-letters a second one, and the pruning fold
        refuses it, so the ledger does too (one rule wherever it arrives from).
        """
        if entry_id is None:
            return False
        id_key = f"{head['session']}/ledger/id/{entry_id}"  # ledger_key(session, "id", id)
        first: int | None = self.store.get(id_key)  # the seq that first folded this id
        if first is None:
            self.store.put(id_key, seq)
            return False
        return first != seq  # the same seq: this event again, after a crash before its head

    def _entry(
        self,
        head: LedgerHead,
        entry: dict[str, Any],
        facts: EntryFacts,
        seq: int,
        cleanup: list[str],
    ) -> list[PassRequest]:
        kind = facts.kind
        entry_id = facts.id
        if kind == "message" and facts.message is not None:
            self._message(head, facts, entry_id, seq, cleanup)
        elif kind == "compaction":
            return self._compaction(head, entry, entry_id, seq)
        elif kind == "custom" and entry.get("customType") == SPAN_RECORD_TYPE:
            data = entry.get("data")
            if not isinstance(data, dict) or data.get("v") != SPAN_RECORD_VERSION:
                return []  # another span record version: its detail is simply not available
            try:
                check_state_format(data.get("stateFormat"), "span record")
            except StateFormatError as exc:
                self._anomaly(head, "state-format-newer", seq, entry_id, found=exc.found)
                return []
            payload = data.get("payload")
            if isinstance(payload, dict):
                return self._apply_payload(head, payload, seq=seq, entry=entry_id)
        return []

    def _message(
        self,
        head: LedgerHead,
        facts: EntryFacts,
        entry_id: str | None,
        seq: int,
        cleanup: list[str],
    ) -> None:
        message: dict[str, Any] = facts.message  # type: ignore[assignment]  # a message's facts
        role = facts.role
        span = head["span"] + 1
        config = self.config
        self._pairing(head, facts, entry_id, seq)
        if role == "user":
            text = user_words(message)
            if text.strip():
                number = head["n"]["u"] + 1
                self._put_row(
                    head,
                    "u",
                    {
                        "id": f"u{number}",
                        "entry": entry_id,
                        "seq": seq,
                        "span": span,
                        "text": text[: config.user_text_chars],
                        "chars": len(text),
                    },
                )
        elif role == "assistant" and facts.calls:  # a reply without calls writes nothing
            for call_id, command in commands.bash_calls(facts.calls):
                bash: BashCall = {
                    "command": command[: config.command_chars],
                    "seq": seq,
                    "entry": entry_id,
                }
                self.store.put(ledger_key(head["session"], "call", call_id), bash)
            for call_id, path, op in commands.file_calls(facts.calls):
                file: FileCall = {
                    "file": path[: config.path_chars],
                    "op": op,
                    "seq": seq,
                    "entry": entry_id,
                }
                self.store.put(ledger_key(head["session"], "call", call_id), file)
            for call_id, session in commands.poll_calls(facts.calls):
                # A poll joins its command only while the fold knows the process runs.
                if self.store.get(ledger_key(head["session"], "exec", session)) is not None:
                    poll: PollCall = {"poll": session, "seq": seq, "entry": entry_id}
                    self.store.put(ledger_key(head["session"], "call", call_id), poll)
        elif role == "toolResult":
            self._tool_result(head, facts, entry_id, seq, span, cleanup)
        elif role == "bashExecution" and isinstance(message.get("command"), str):
            outcome = commands.execution_outcome(message)
            output = message.get("output")
            self._command(
                head,
                message["command"],
                outcome,
                output if isinstance(output, str) else "",
                "user",
                entry_id,
                seq,
                span,
                None,
            )

    def _pairing(self, head: LedgerHead, facts: EntryFacts, entry_id: str | None, seq: int) -> None:
        """Note what a provider would refuse unpaired, as anomalies: a result whose call is not
        open (the render's sweep leaves it out), and calls a later message closed unanswered
        (the render answers them with a placeholder). State: the open call ids, in the head."""
        open_calls = head.get("open", [])
        if facts.role == "toolResult":
            if facts.call_id in open_calls:
                open_calls.remove(facts.call_id)
            else:
                self._anomaly(head, "result-without-call", seq, entry_id)
            return
        if open_calls:
            self._anomaly(head, "call-without-result", seq, entry_id, calls=len(open_calls))
        calls = [] if facts.stop in DROPPED_STOPS else [c.id for c in facts.calls]
        if calls:
            head["open"] = [c for c in calls if isinstance(c, str)]
        else:
            head.pop("open", None)

    def _tool_result(
        self,
        head: LedgerHead,
        facts: EntryFacts,
        entry_id: str | None,
        seq: int,
        span: int,
        cleanup: list[str],
    ) -> None:
        message: dict[str, Any] = facts.message  # type: ignore[assignment]  # a result's facts
        call_id = facts.call_id
        call_key = f"{head['session']}/ledger/call/{call_id}" if call_id is not None else ""
        call = self.store.get(call_key) if call_key else None
        tool = facts.tool
        if isinstance(call, dict) and "poll" in call:
            cleanup.append(call_key)
            if self._poll(head, call["poll"], facts, entry_id, seq, span, cleanup):
                return
            call = None  # its process is no longer known: read as any tool's result
        if isinstance(call, dict) and "file" in call:
            # A file tool's result: the file counts as read or modified when the call worked.
            if not facts.is_error:
                self._file(head, call["file"], call["op"], entry_id, seq, span)
            cleanup.append(call_key)
            call = None
            if not facts.is_error:
                return
        if isinstance(call, dict) or tool in commands.SHELL_TOOLS:
            command = call.get("command", "") if isinstance(call, dict) else ""
            shell = commands.shell_output(facts.text, tool)
            outcome = commands.result_outcome(message, facts.text, shell)
            row = self._command(
                head,
                command,
                outcome,
                shell.text,
                "bash",
                entry_id,
                seq,
                span,
                call_id,
            )
            if shell.session is not None and outcome.status == "unknown":
                # Unified exec: the process runs on; the polls of its session end the command.
                running: ExecSession = {
                    "C": head["n"]["C"],
                    "seq": seq,
                    "excerpt": row["excerpt"],
                    "values": row["values"],
                }
                self.store.put(ledger_key(head["session"], "exec", shell.session), running)
            if call_key:
                cleanup.append(call_key)
        elif facts.is_error:
            text = facts.text
            self._put_row(
                head,
                "E",
                {
                    "id": f"E{head['n']['E'] + 1}",
                    "tool": tool if isinstance(tool, str) else None,
                    "command": None,
                    "head": commands.failure_line(text, self.config.error_head_chars, shell=False),
                    "entry": entry_id,
                    "seq": seq,
                    "span": span,
                },
            )

    def _file(
        self, head: LedgerHead, path: str, op: str, entry: str | None, seq: int, span: int
    ) -> None:
        """A file read or modified, once per (path, op): the first time it happened."""
        index = f"{head['session']}/ledger/file/{op}/{path_digest(path)}"  # ledger_key(...)
        if self.store.get(index) is not None:
            return
        number = head["n"].get("F", 0) + 1
        self._put_row(
            head,
            "F",
            {"id": f"F{number}", "path": path, "op": op, "entry": entry, "seq": seq, "span": span},
        )
        self.store.put(index, number)

    def _command(
        self,
        head: LedgerHead,
        command: str,
        outcome: commands.Outcome,
        output: str,
        source: str,
        entry_id: str | None,
        seq: int,
        span: int,
        call_id: str | None,
    ) -> CommandRow:
        config = self.config
        command_id = f"C{head['n']['C'] + 1}"
        error_id = None
        if outcome.failed:
            error_id = f"E{head['n']['E'] + 1}"
            self._put_row(
                head,
                "E",
                {
                    "id": error_id,
                    "tool": "bash",
                    "command": command_id,
                    "head": commands.failure_line(output, config.error_head_chars, shell=True)
                    or (f"exit {outcome.exit}" if outcome.exit is not None else outcome.status),
                    "entry": entry_id,
                    "seq": seq,
                    "span": span,
                },
            )
        row: CommandRow = {
            "id": command_id,
            "command": command[: config.command_chars],
            "exit": outcome.exit,
            "status": outcome.status,
            "source": source,
            "error": error_id,
            "call": call_id,
            "excerpt": commands.excerpt(output, config.excerpt_chars),
            # Values the whole output shows (a count, an error location, a commit),
            # verbatim, so one in the middle of a long output is not lost to the excerpt.
            "values": [
                [value[: config.world_value_chars], what]
                for value, what in command_values(command, output)[: config.command_values]
            ],
            "entry": entry_id,
            "seq": seq,
            "span": span,
        }
        self._put_row(head, "C", row)
        return row

    def _poll(
        self,
        head: LedgerHead,
        session: str,
        facts: EntryFacts,
        entry_id: str | None,
        seq: int,
        span: int,
        cleanup: list[str],
    ) -> bool:
        """Join a unified exec poll's result to the command its session runs: its output to
        the command's, and the outcome it states (an exit ends the command). False when the
        fold knows no such process (the poll is then read as any tool's result)."""
        exec_key = ledger_key(head["session"], "exec", session)
        running: ExecSession | None = self.store.get(exec_key)
        if not isinstance(running, dict):
            return False
        row_key = ledger_key(head["session"], "C", running["C"])
        row: CommandRow | None = self.store.get(row_key)
        if not isinstance(row, dict):
            return False
        config = self.config
        message: dict[str, Any] = facts.message  # type: ignore[assignment]  # a result's facts
        shell = commands.shell_output(facts.text, commands.POLL_TOOL)
        outcome = commands.result_outcome(message, facts.text, shell)
        excerpt, values = running["excerpt"], running["values"]
        if running["seq"] < seq:  # not joined yet: a poll folded again is joined once
            # The excerpt of the outputs so far and this one's is the excerpt of their join
            # (a cut excerpt keeps its head, and the new tail never reaches back to its cut).
            excerpt = commands.excerpt(excerpt + shell.text, config.excerpt_chars)
            values = [list(pair) for pair in values]
            seen = {pair[0] for pair in values}
            for value, what in command_values(row["command"], shell.text):
                if len(values) >= config.command_values:
                    break
                value = value[: config.world_value_chars]
                if value not in seen:
                    seen.add(value)
                    values.append([value, what])
        if outcome.status == "unknown":
            self.store.put(row_key, {**row, "excerpt": excerpt, "values": values})
            self.store.put(exec_key, {**running, "seq": seq, "excerpt": excerpt, "values": values})
            return True
        error_id = None
        if outcome.failed:
            error_id = f"E{head['n']['E'] + 1}"
            # What is left of the earlier outputs, and all of this one.
            output = without_cut(running["excerpt"]) + shell.text
            self._put_row(
                head,
                "E",
                {
                    "id": error_id,
                    "tool": "bash",
                    "command": row["id"],
                    "head": commands.failure_line(output, config.error_head_chars, shell=True)
                    or (f"exit {outcome.exit}" if outcome.exit is not None else outcome.status),
                    "entry": entry_id,
                    "seq": seq,
                    "span": span,
                },
            )
        ended: CommandRow = {
            **row,
            "exit": outcome.exit,
            "status": outcome.status,
            "error": error_id,
            "excerpt": excerpt,
            "values": values,
        }
        self.store.put(row_key, ended)
        cleanup.append(exec_key)  # after the head: a crash before it folds the poll again
        return True

    def _compaction(
        self, head: LedgerHead, entry: dict[str, Any], entry_id: str | None, seq: int
    ) -> list[PassRequest]:
        if is_ours(entry):
            details = entry["details"]
            try:
                check_state_format(details.get("stateFormat"), "compaction entry")
            except StateFormatError as exc:
                self._anomaly(head, "state-format-newer", seq, entry_id, found=exc.found)
                return []
            head["ours"] = {"request": details.get("request"), "entry": entry_id}
            head["foreign"] = None
            return []
        # pi's own (or another extension's) compaction: the span ends here; judge it ourselves,
        # taking over from that compactor: its summary (head and tail) goes into the prompt.
        found = entry.get("summary")
        summary = found if isinstance(found, str) else ""
        config = self.config
        cut = len(summary) > config.takeover_head_chars + config.takeover_tail_chars
        foreign: ForeignSummary = {
            "entry": entry_id,
            "seq": seq,
            "chars": len(summary),
            "head": summary[: config.takeover_head_chars] if cut else summary,
            "tail": summary[-config.takeover_tail_chars :] if cut else "",
        }
        self.store.put(ledger_key(head["session"], "foreign"), foreign)
        head["foreign"] = {"entry": entry_id, "seq": seq}
        return self._request(head, seq, "compaction", entry_id)

    def _bounded_world(self, facts: dict[str, Any]) -> dict[str, Any]:
        config = self.config
        world: dict[str, Any] = {}
        for name, value in list(facts.items())[: config.world_keys]:
            if isinstance(value, bool | int | float) or value is None:
                world[str(name)[:64]] = value
            elif isinstance(value, str):
                world[str(name)[:64]] = value[: config.world_value_chars]
            elif isinstance(value, list):
                world[str(name)[:64]] = [
                    str(item)[: config.world_value_chars] for item in value[:20]
                ]
            else:
                text = orjson.dumps(value, default=str).decode()
                world[str(name)[:64]] = text[: config.world_value_chars]
        return world

    # --- passes -------------------------------------------------------------------------

    def _request(
        self, head: LedgerHead, seq: int, trigger: str, entry_id: str | None
    ) -> list[PassRequest]:
        if not span_has_content(head):
            return []  # nothing new since the last pass (e.g. pi's entry after our own pass)
        rid = request_id(head["session"], seq)
        head["pending"] = rid
        self._put_head(head)  # the snapshot reads the head from the store
        carried = [
            row
            for u in head["carried"]
            if isinstance(row := self.store.get(ledger_key(head["session"], "u", u[1:])), dict)
        ]
        offered = carried + open_rows(self.store, head, "u")
        # The newest compaction on the branch is not ours: its summary and the messages it
        # replaced are what the pass takes over.
        earlier = (
            self.store.get(ledger_key(head["session"], "foreign")) if head.get("foreign") else None
        )
        log.info(
            "ledger pass requested",
            extra={"ledger": {"span": head["span"] + 1, "seq": seq, "offered": len(offered)}},
        )
        return [
            {
                "request": rid,
                "session": head["session"],
                "span": head["span"] + 1,
                "seq": seq,
                "trigger": trigger,
                "entry": entry_id,
                "offered": offered,
                "counters": dict(head["n"]),
                "bounds": {k: [head["first"][k], head["n"][k]] for k in ("C", "E", "u")},
                "state": snapshot(self.store, head["session"]),
                "earlier": earlier if isinstance(earlier, dict) else None,
            }
        ]

    def _apply_payload(
        self, head: LedgerHead, raw: dict[str, Any], seq: int | None, entry: str | None
    ) -> list[PassRequest]:
        try:
            check_state_format(raw.get("stateFormat"), "ledger pass result")
            payload = LedgerPassPayload.model_validate(raw)
        except StateFormatError as exc:
            self._anomaly(head, "state-format-newer", seq, entry, found=exc.found)
            self._release(head, raw.get("request"))
            return []
        except ValidationError as exc:
            self._anomaly(head, "payload-invalid", seq, entry, errors=len(exc.errors()))
            self._release(head, raw.get("request"))
            return []
        answered = ledger_key(head["session"], "answered", payload.request)
        if self.store.get(answered) is not None:
            return []  # a second answer to one request
        if head["pending"] is not None and head["pending"] != payload.request:
            return []  # an answer to a request this state is not waiting for
        if payload.fallback is not None or payload.record is None:
            log.warning(
                "ledger fallback", extra={"ledger": {"span": payload.span, "code": "fallback"}}
            )
        elif payload.span != head["span"] + 1:
            self._anomaly(head, "span-out-of-order", seq, entry, span=payload.span)
        else:
            self._close(head, payload, seq, entry)
        head["pending"] = None
        self._put_head(head)
        self.store.put(answered, True)
        return []

    def _release(self, head: LedgerHead, rid: Any) -> None:
        if rid is not None and head["pending"] == rid:
            head["pending"] = None
        self._put_head(head)

    def _close(
        self, head: LedgerHead, payload: LedgerPassPayload, seq: int | None, entry: str | None
    ) -> None:
        record = payload.record
        assert record is not None
        session = head["session"]
        for event in payload.events:
            if isinstance(event, RuleEvent):
                self._rule(head, event, payload.span, seq, entry)
            elif isinstance(event, LiftEvent):
                self._lift(head, event, payload.span, seq, entry)
            elif isinstance(event, NoteEvent):
                kind = "D" if event.kind == "decision" else "X"
                self._put_row(head, kind, note_row(event, payload.span))
            elif isinstance(event, ValueEvent):
                self._put_row(head, "V", value_row(event, payload.span))
            head["n"]["ev"] = max(head["n"]["ev"], event.n)
        self.store.put(ledger_key(session, "S", payload.span), record.model_dump(mode="json"))
        head["n"]["S"] = payload.span
        head["span"] = payload.span
        head["first"] = {
            "C": max(head["first"]["C"], record.commands.last + 1),
            "E": max(head["first"]["E"], record.errors.last + 1),
            "u": max(head["first"]["u"], record.users.last + 1),
        }
        head["now"] = record.now
        head["world"] = record.world if record.world is not None else head["world"]
        head["carried"] = list(record.carried)
        log.info(
            "ledger span closed",
            extra={
                "ledger": {
                    "span": payload.span,
                    "events": len(payload.events),
                    "rules": head["n"]["R"],
                    "summaryChars": len(payload.summary),
                    "kind": record.narrativeKind,
                }
            },
        )

    def _rule(
        self, head: LedgerHead, event: RuleEvent, span: int, seq: int | None, entry: str | None
    ) -> None:
        # The store's own checks: the next id, and words that stand in the message there.
        user = self.store.get(ledger_key(head["session"], "u", event.u[1:]))
        if (
            event.id != f"R{head['n']['R'] + 1}"
            or not isinstance(user, dict)
            or user["text"][event.start : event.end] != event.words
        ):
            self._anomaly(head, "rule-refused", seq, entry, rule=event.id, u=event.u)
            return
        self._put_row(head, "R", rule_row(event, span))

    def _lift(
        self, head: LedgerHead, event: LiftEvent, span: int, seq: int | None, entry: str | None
    ) -> None:
        session = head["session"]
        number = event.rule[1:]
        rule = self.store.get(ledger_key(session, "R", number))
        user = self.store.get(ledger_key(session, "u", event.by[1:]))
        replaced = []
        if isinstance(rule, dict):
            for rid in rule.get("replaces", []):
                row = self.store.get(ledger_key(session, "R", str(rid)[1:]))
                if isinstance(row, dict):
                    replaced.append(row["words"])
        if (
            not isinstance(rule, dict)
            or rule.get("lifted")
            or not isinstance(user, dict)
            or not lift_check(user["text"], rule["words"], (), replaced)
        ):
            self._anomaly(head, "lift-refused", seq, entry, rule=event.rule, u=event.by)
            return
        lifted = rule_lift(event, span)
        if event.replacedBy:
            # The replacement remembers what it replaced: lifting it later must name more.
            successor_key = ledger_key(session, "R", event.replacedBy[1:])
            successor = self.store.get(successor_key)
            if isinstance(successor, dict):
                replaces = [*successor.get("replaces", []), event.rule]
                self.store.put(successor_key, {**successor, "replaces": replaces})
        self.store.put(ledger_key(session, "R", number), {**rule, "lifted": lifted})

    def _drain(self, head: LedgerHead) -> list[PassRequest]:
        """Fold the events the barrier held, in order, until one raises a pass again."""
        requests: list[PassRequest] = []
        while head["buffer"] and head["pending"] is None:
            seq = head["buffer"].pop(0)
            held_key = ledger_key(head["session"], "buf", seq)
            raw = self.store.get(held_key)
            if isinstance(raw, dict):
                requests += self._event(head, from_dict(raw))
            else:
                self._put_head(head)
            self.store.delete(held_key)
        return requests


__all__ = ["STATE_FORMAT", "LedgerFold", "PassRequest", "is_ours", "request_id"]
