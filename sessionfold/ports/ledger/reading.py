"""Where a user message's rule stands, read once per text for the pass and the offline model.

A pass taking over from another compactor reads each earlier message's standing region
(`context.PassContext.from_request`), and the offline model reads every message's again to
label it. The reading (`heuristics.standing_region`) is a pure function of the text, so it
is kept for the pass: a small bounded memo, emptied when a pass starts (`forget`: nothing
outlives its pass, and a run of folds reads as much as one does), and none for a text longer
than `CACHED_CHARS` (a pasted file is read each time rather than kept by the memo).
"""

from __future__ import annotations

from functools import lru_cache

from sessionfold.projections.ledger.heuristics import (
    WHOLE_CHARS,
    WORDS_REQUIRED_CHARS,
    standing_region,
)
from sessionfold.projections.ledger.text import Region

#: How many texts the memo keeps, and the longest one it keeps: 256 x 16 K characters at most.
CACHED_TEXTS = 256
CACHED_CHARS = 16_384


@lru_cache(maxsize=CACHED_TEXTS)
def _cached(text: str, whole_chars: int, words_chars: int) -> Region | None:
    return standing_region(text, whole_chars, words_chars)


def standing_region_of(
    text: str, whole_chars: int = WHOLE_CHARS, words_chars: int = WORDS_REQUIRED_CHARS
) -> Region | None:
    """`heuristics.standing_region(text, whole_chars, words_chars)`, remembered for a short
    text: None exactly when no sentence of the user's own reads as a standing rule."""
    if len(text) > CACHED_CHARS:
        return standing_region(text, whole_chars, words_chars)
    return _cached(text, whole_chars, words_chars)


def forget() -> None:
    """Empty the memo: a pass starts."""
    _cached.cache_clear()
