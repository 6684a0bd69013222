"""Tunables of the ledger fold and pass, in one frozen object passed in (no globals)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    """Sizes and caps; every bound on state, prompt and summary lives here."""

    summary_chars: int = 12_000  # the rendered summary never exceeds this
    user_text_chars: int = 8_000  # a user message's text kept in state (rules quote from it)
    command_chars: int = 400  # a command line kept in state
    excerpt_chars: int = 240  # head and tail of a command's output kept, for values
    error_head_chars: int = 200
    prompt_message_chars: int = 240  # the prompt lists each message whole up to this
    retry_note_chars: int = 4_000  # retry notes and questions, shown whole or not at all
    carry_limit: int = 30  # unlabeled messages offered again by the next pass
    world_keys: int = 32
    world_value_chars: int = 200
    render_command_chars: int = 120  # a command line as the summary shows it
