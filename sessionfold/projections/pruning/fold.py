"""The per-session fold: one envelope in, the derived envelopes out.

`apply(store, envelope, config)` is the only entry point every runtime calls. It guards the
sequence (an envelope whose seq is not above the last accepted one for its session is ignored),
keeps the flush barrier (while a request is outstanding the session's later events are held in
the store and folded once the compaction is applied), and dispatches to the branch digest, the
metrics and the pruning folds. Outputs are flush-request and flush-metrics envelopes.

Order within one entry mirrors pi: the turn end of the previous assistant (if a non-result
message closes it), then the message-end flush of a final reply, taken before the reply is
folded (pi runs its `message_end` handler before it saves the message), then the entry itself,
then the turn end it completes. Whenever a step leaves a request outstanding, the entry is held
and resumes at the step after it.
"""

from __future__ import annotations

import logging

from pydantic import ValidationError

from sessionfold.events.envelope import (
    SESSION_EVENT_KINDS,
    CommandEnvelope,
    CompactionEnvelope,
    EntryEnvelope,
    Envelope,
    Kind,
    PlaceholderEnvelope,
    PruningCompactionEnvelope,
    ReloadEnvelope,
    UsageEnvelope,
)
from sessionfold.events.flush import read_compaction
from sessionfold.projections.pruning import digest, flushing, windows
from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.pruning.config import DEFAULT_CONFIG, PruneConfig
from sessionfold.projections.pruning.message_facts import is_text_only_assistant
from sessionfold.projections.store import Store

log = logging.getLogger(__name__)


def apply(store: Store, envelope: Envelope, config: PruneConfig = DEFAULT_CONFIG) -> list[Envelope]:
    """Fold one envelope into the session's state; return the envelopes it produces."""
    if isinstance(envelope, CompactionEnvelope):
        return _apply_compaction(store, envelope, config)
    if envelope.kind not in SESSION_EVENT_KINDS or envelope.kind == Kind.WORLD:
        # The fold's own outputs are not its inputs; a World snapshot (unsequenced) is the
        # ledger's alone.
        return []
    session = pruning.open_session(store, envelope.session_id, config)
    if envelope.seq <= session.head["seq"]:
        return []  # redelivery, replay or duplicate publish
    session.head["seq"] = envelope.seq
    if session.busy:
        pruning.hold(session, envelope)
        session.save()
        return []
    outputs = _process(session, envelope)
    session.save()
    return outputs


def _apply_compaction(
    store: Store, envelope: CompactionEnvelope, config: PruneConfig
) -> list[Envelope]:
    if not isinstance(envelope, PruningCompactionEnvelope):
        return []  # a ledger pass result: the ledger fold's
    try:
        payload = read_compaction(envelope)
    except ValidationError as exc:
        log.warning(
            "unreadable compaction",
            extra={"session": envelope.session_id, "errors": exc.error_count()},
        )
        return []
    session = pruning.open_session(store, envelope.session_id, config)
    outputs = flushing.apply_compaction(session, payload)
    if outputs is None:
        return []  # answers nothing outstanding: a second answer is ignored
    outputs.extend(_release_held(session))
    session.save()
    return outputs


def _release_held(session: pruning.Session) -> list[Envelope]:
    """Fold the held events in order until one raises the barrier again."""
    outputs: list[Envelope] = []
    while not session.busy:
        envelope = pruning.take_held(session)
        if envelope is None:
            break
        outputs.extend(_process(session, envelope))
    return outputs


def _process(session: pruning.Session, envelope: Envelope) -> list[Envelope]:
    if isinstance(envelope, EntryEnvelope):
        return _process_entry(session, envelope)
    if isinstance(envelope, PlaceholderEnvelope):
        return _process_placeholder(session, envelope)
    if isinstance(envelope, UsageEnvelope):
        windows.note_usage_event(session, envelope.payload.tokens, envelope.payload.context_window)
        return []
    if not isinstance(envelope, ReloadEnvelope | CommandEnvelope):
        return []  # world and compact-request feed the ledger, not pruning
    # Reloads and commands come between runs: the last turn has ended by then.
    outputs = _close_turn(session, envelope)
    if session.busy:
        return outputs
    if isinstance(envelope, ReloadEnvelope):
        switched = digest.apply_reload(session.store, session.session_id, envelope.payload.leaf_id)
        if switched:
            windows.on_switch(session)
        windows.on_reload(session)
        return outputs
    return outputs + _process_command(session, envelope)


def _close_turn(session: pruning.Session, envelope: Envelope) -> list[Envelope]:
    """Evaluate a still open turn end before `envelope`; hold it if that raised the barrier."""
    if not windows.gate_open(session):
        return []
    outputs = flushing.turn_end(session, envelope.seq, envelope.time)
    if session.busy:
        pruning.hold(session, envelope)
    return outputs


def _process_command(session: pruning.Session, envelope: CommandEnvelope) -> list[Envelope]:
    name = envelope.payload.name
    if name == "config":
        pruning.set_overrides(session, envelope.payload.settings)
        return []
    if name == "flush" and session.config.enabled:
        return flushing.start_flush(session, "manual", envelope.seq, envelope.time)
    return []  # compact: chain compression is not folded here


def _process_placeholder(session: pruning.Session, envelope: PlaceholderEnvelope) -> list[Envelope]:
    """A dead-lettered entry's place: folded as a non-message entry would be (no turn, no flush)."""
    payload = envelope.payload
    appended = digest.apply_placeholder(
        session.store, session.session_id, payload.id, payload.parentId, payload.previous
    )
    if appended is not None and appended.switched:
        windows.on_switch(session)
    return []


def _process_entry(session: pruning.Session, envelope: EntryEnvelope) -> list[Envelope]:
    entry = envelope.payload.entry
    if digest.is_folded(session.store, session.session_id, entry.get("id")):
        # A second entry with an id (the reader dead-letters it; another producer may not):
        # refused before it can end a turn or start a flush.
        log.warning(
            "duplicate entry id refused",
            extra={"session": session.session_id, "seq": envelope.seq, "code": "duplicate-id"},
        )
        return []
    message = digest.message_of(entry)
    role = message.get("role") if message is not None else None
    outputs: list[Envelope] = []
    # Step 1: a non-result message ends the previous assistant's turn.
    if role not in (None, "toolResult"):
        outputs.extend(_close_turn(session, envelope))
        if session.busy:
            return outputs
    # Step 2: a final reply flushes before it is folded (agent-message trigger, §2.4).
    if (
        message is not None
        and is_text_only_assistant(message)
        and session.config.enabled
        and session.config.pruneOn == "agent-message"
        and session.head["me"] != envelope.seq
    ):
        outputs.extend(flushing.start_flush(session, "message-end", envelope.seq, envelope.time))
        if session.busy:
            pruning.hold(session, envelope)
            return outputs
    # Step 3: the entry itself.
    appended = digest.apply_entry(session.store, session.session_id, entry, envelope.seq)
    if appended is None:
        return outputs
    if appended.switched:
        windows.on_switch(session)
    # Step 4: the turn end the entry completes.
    if (
        appended.row is not None
        and message is not None
        and windows.on_row(session, appended.row, message)
    ):
        outputs.extend(flushing.turn_end(session, envelope.seq, envelope.time))
    return outputs
