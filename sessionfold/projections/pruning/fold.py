"""The per-session pruning fold: one envelope in, the derived envelopes out.

`apply(store, envelope, config)` is the only entry point every runtime calls. A session event
goes through the steps of `pruning/steps/`, in order:

1. guard and barrier (`guard`): the sequence guard, the flush barrier (while a request is
   outstanding the session's later events are held in the store and folded once the compaction
   is applied), and, for an entry, the duplicate id;
2. turn close (`close_turn`): a non-result message ends the previous assistant's turn;
3. message-end flush (`message_end`): a final reply flushes before it is folded (pi runs its
   `message_end` handler before it saves the message);
4. digest append (`append`): the entry joins the tree, its message the branch and the metrics;
5. windows and metrics (`tool_windows`): the tool windows, turn gates and pending turns;
6. turn end (`turn_end`): the turn the entry completed is evaluated.

Each entry step is handed the entry's facts (`entry_facts.facts_of`, read once) and the session.
Whenever a step leaves a request outstanding, the entry is held and resumes at the step after
it. Outputs are flush-request and flush-metrics envelopes.
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
from sessionfold.projections.pruning.entry_facts import facts_of
from sessionfold.projections.pruning.steps import (
    EntryStep,
    append,
    close_turn,
    guard,
    message_end,
    take_held,
    tool_windows,
    turn_end,
)
from sessionfold.projections.store import Store

log = logging.getLogger(__name__)


def apply(store: Store, envelope: Envelope, config: PruneConfig = DEFAULT_CONFIG) -> list[Envelope]:
    """Fold one envelope into the session's state; return the envelopes it produces."""
    # An entry (nearly every event) is a session event: the kind check, which hashes the
    # enum member in Python, is for the other envelopes.
    if type(envelope) is not EntryEnvelope:
        if isinstance(envelope, CompactionEnvelope):
            return _apply_compaction(store, envelope, config)
        if envelope.kind not in SESSION_EVENT_KINDS or envelope.kind == Kind.WORLD:
            # The fold's own outputs are not its inputs; a World snapshot (unsequenced) is the
            # ledger's alone.
            return []
    session = pruning.open_session(store, envelope.session_id, config)
    admitted = guard.admit(session, envelope)
    if admitted is None:
        return []  # an old seq: nothing to write
    outputs = _process(session, envelope) if admitted else []
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
        envelope = take_held(session)
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
    outputs = close_turn.close(session, envelope)
    if session.busy:
        return outputs
    if isinstance(envelope, ReloadEnvelope):
        switched = digest.apply_reload(session.store, session.session_id, envelope.payload.leaf_id)
        if switched:
            windows.on_switch(session)
        windows.on_reload(session)
        return outputs
    return outputs + _process_command(session, envelope)


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


#: The steps of an entry after the guard, in order (see the module docstring).
ENTRY_STEPS = (
    guard.run,
    close_turn.run,
    message_end.run,
    append.run,
    tool_windows.run,
    turn_end.run,
)


def _process_entry(session: pruning.Session, envelope: EntryEnvelope) -> list[Envelope]:
    step = EntryStep(session, facts_of(envelope), envelope, [])
    for run in ENTRY_STEPS:
        if run(step):
            break
    return step.outputs
