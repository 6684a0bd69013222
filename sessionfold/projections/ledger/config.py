"""Tunables of the ledger fold and pass, in one frozen object passed in (no globals)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    """Sizes and caps; every bound on state, prompt and summary lives here."""

    summary_chars: int = 12_000  # the rendered summary never exceeds this
    user_text_chars: int = 8_000  # a user message's text kept in state (rules quote from it)
    command_chars: int = 400  # a command line kept in state
    path_chars: int = 400  # a file path kept in state
    excerpt_chars: int = 240  # head and tail of a command's output kept, for values
    command_values: int = 8  # values read from a command's whole output, kept with it
    error_head_chars: int = 200
    prompt_message_chars: int = 240  # the prompt lists each message whole up to this
    retry_note_chars: int = 4_000  # retry notes and questions, shown whole or not at all
    carry_limit: int = 30  # unlabeled messages offered again by the next pass
    world_keys: int = 32
    world_value_chars: int = 200
    render_command_chars: int = 120  # a command line as the summary shows it
    # A span whose messages are longer than this in all goes to the model in chunks, one
    # call each, up to `max_chunks` (seeds/002: "up to four chunks").
    chunk_chars: int = 48_000
    max_chunks: int = 4
    # "single": one diff call per chunk; "turns" (opt-in): one continuing conversation, one
    # section per turn, for small models that write a poor single diff.
    narrative_mode: Literal["single", "turns"] = "single"
    pass_budget_s: float = 300.0  # turns mode: the whole pass (sections after it carry over)
    turn_budget_s: float = 120.0  # turns mode: one section, its shows and repairs included
    shows_per_turn: int = 3  # turns mode: read-only show(ref) answers per section
    show_chars: int = 2_000  # turns mode: what one show(ref) returns at most
    repair_turns: int = 2  # turns mode: repairs of a failing section before items drop
    digest_line_chars: int = 160  # turns mode: a condensed transcript line
    # Taking over from another compactor: how much of its summary the prompt shows.
    takeover_head_chars: int = 1_500
    takeover_tail_chars: int = 1_500


#: The ledger every runtime folds unless told otherwise.
DEFAULT_LEDGER = LedgerConfig()
