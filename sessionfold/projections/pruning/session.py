"""Pruning state of one session in the Store: the head record, config, and the flush barrier.

Everything pruning keeps lives under `key(session_id, "pr", ...)`:
- `h`: the head record: last accepted sequence number, held envelopes, the outstanding request,
  the frontier, the ref counter, the queue count and rearm flag, usage readings, the open tool
  window and turn gate, the pending turns, counters, stats and per-session config overrides.
- `a/<seq>`, `r/<seq>`, `w/<turn>`: captured assistants, paired results and pending turns
  (`windows.py`); `i/`, `ref/`, `hash/`, `s/`: the index (`index.py`); `f/<n>`, `q/<request>`,
  `m/<n>`: frontier history, the outstanding request's plan, flush-metrics records
  (`flushing.py`); `held/<seq>`: events held by the flush barrier (`steps/`).
Every event writes the head and at most a few rows; a flush touches the pending turns only.
The paths every event or flush takes spell their keys out as `row_key` builds them
(`f"{sid}/pr/w/{turn}"`): a call per key cost as much as formatting it.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

import msgspec
import orjson

from sessionfold.projections.pruning import context_metrics as metrics
from sessionfold.projections.pruning.config import (
    ConfigError,
    PruneConfig,
    build_config,
    deep_merge,
)
from sessionfold.projections.pruning.records import PruneHead, PruneStats
from sessionfold.projections.store import Store, key_in

log = logging.getLogger(__name__)


#: The store key of one of a session's pruning rows: key(session_id, "pr", *parts).
row_key = key_in("pr")


def new_stats() -> PruneStats:
    """Zeroed stats: model calls, tokens, cost, and what pruning indexed and reclaimed."""
    return {
        "calls": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "cost": 0.0,
        "summaries": 0,
        "summarized_calls": 0,
        "deduped_calls": 0,
        "spilled_calls": 0,
        "summarized_raw_chars": 0,
        "summary_chars": 0,
        "reclaimed_chars": 0,
    }


def new_head() -> PruneHead:
    """The pruning head record of a session nothing has been folded into."""
    return {
        "seq": 0,  # highest session-event seq accepted (applied or held)
        "held": [],  # seqs held by the flush barrier, ascending
        "out": None,  # id of the outstanding flush request
        "frontier": None,
        "fn": 0,  # frontier history rows
        "next_ref": 1,
        "queued": 0,  # pi-condense's pendingBatches length (a trigger signal)
        "rearmed": False,
        "prev": None,  # usage fraction at the previous gated turn
        "tokens": None,
        "window": None,
        "group": 0,  # user messages so far: the user-turn group
        "win": None,  # the latest assistant's tool window: turn, seq, call ids and names
        "gate": None,  # the turn end not evaluated yet: turn, results seen, ids still awaited
        "pending": [],  # turns with paired results not dead behind the frontier
        "attempts": 0,
        "aseq": -1,  # seq of the last attempt, and how many attempts it had
        "an": 0,
        "me": -1,  # seq whose message-end flush was attempted
        "summaries": 0,
        "stats": new_stats(),
        "config": {},
        "prot": None,
    }


class Session(msgspec.Struct, gc=False):
    """One session's pruning state during one fold step; `save` writes the head back."""

    # A msgspec struct, not a slotted dataclass: one is built per event, and the dataclass's
    # __init__ is Python. No cycle runs through it (nothing it holds refers back to it).

    store: Store
    session_id: str
    base: PruneConfig
    head: PruneHead
    config: PruneConfig
    protection: metrics.Protection
    #: The head record's key (built once per fold step: read at the start, written at the end).
    head_key: str = ""

    def save(self) -> None:
        """Write the head record."""
        self.store.put(self.head_key or row_key(self.session_id, "h"), self.head)

    @property
    def busy(self) -> bool:
        """Whether a flush request is outstanding (the barrier is up)."""
        return self.head["out"] is not None


def load_head(store: Store, session_id: str) -> PruneHead:
    """The session's pruning head record (a fresh one for an unknown session)."""
    return store.get(row_key(session_id, "h")) or new_head()


def open_session(store: Store, session_id: str, base: PruneConfig) -> Session:
    """The session's state under the runtime config `base` and its own overrides."""
    head_key = f"{session_id}/pr/h"
    head: PruneHead = store.get(head_key) or new_head()
    overrides = head["config"]
    config = effective_config(base, overrides) if overrides else base
    _, protection, wanted = _protection_of(config)
    session = Session(store, session_id, base, head, config, protection, head_key)
    if head["prot"] != wanted:
        _sync_protection(session)
    return session


@lru_cache(maxsize=256)
def _effective(base: PruneConfig, overrides: str) -> PruneConfig:
    return build_config(orjson.loads(overrides), base=base)


def effective_config(base: PruneConfig, overrides: dict[str, Any]) -> PruneConfig:
    """`base` with a session's config-command overrides merged over it."""
    if not overrides:
        return base
    return _effective(base, orjson.dumps(overrides, option=orjson.OPT_SORT_KEYS).decode())


#: One Protection per config object, kept across events so its memo of answers outlives a fold
#: step: by identity (hashing a config hashes every field, on every event), with the config
#: kept alive beside it so its id cannot be taken by another.
#: Beside it, the head's `prot` the config wants (built once, not at every event).
_PROTECTIONS: dict[int, tuple[PruneConfig, metrics.Protection, list[list[str]]]] = {}


def _protection_of(config: PruneConfig) -> tuple[PruneConfig, metrics.Protection, list[list[str]]]:
    found = _PROTECTIONS.get(id(config))
    if found is not None and found[0] is config:
        return found
    if len(_PROTECTIONS) >= 256:
        _PROTECTIONS.clear()
    protection = metrics.Protection(config.protectedTools, config.protectedPaths)
    wanted = [list(config.protectedTools), list(config.protectedPaths)]
    found = _PROTECTIONS[id(config)] = (config, protection, wanted)
    return found


def _protection(config: PruneConfig) -> metrics.Protection:
    return _protection_of(config)[1]


def _sync_protection(session: Session) -> None:
    """Keep the metrics' protection config equal to the effective one (the gap depends on it)."""
    wanted = _protection_of(session.config)[2]
    if session.head["prot"] != wanted:
        metrics.set_protection(session.store, session.session_id, session.protection)
        session.head["prot"] = [list(part) for part in wanted]  # the cached lists stay apart


def set_overrides(session: Session, settings: dict[str, Any]) -> None:
    """Apply a config command: merge its settings into the session's overrides (validated)."""
    merged = deep_merge(session.head["config"], settings)
    try:
        config = effective_config(session.base, merged)
    except ConfigError as exc:
        log.warning("config command refused", extra={"session": session.session_id, "key": exc.key})
        return
    session.head["config"] = merged
    session.config = config
    session.protection = _protection(config)
    _sync_protection(session)


def flush_records(store: Store, session_id: str) -> list[dict[str, Any]]:
    """Every flush-metrics record of a session, in attempt order."""
    count = load_head(store, session_id)["attempts"]
    records = (store.get(row_key(session_id, "m", n)) for n in range(1, count + 1))
    return [record for record in records if record is not None]  # None: still outstanding
