"""The heuristic reading of standing rules (seeds/002, "Taking over from another compactor").

A message reads as a standing rule when a sentence of it, not a question (a closing "ok?"
asks nothing), says "from now on" (or "from here on", "going forward") and withdraws nothing,
or has a clause with a rule word (never, always, don't, do not, must, stop, only) that is not
in a request for now ("yet", "for now", "this time"), not withdrawing something ("forget it";
"don't forget it" does not withdraw), not "never mind" and not describing a thing ("an option
that keeps only lines"). It is judged clause by clause, so "never deploy on a Friday, not even
this time" keeps its rule. The offline model labels with this reading; a real model is asked
to label every message and no word list decides for it.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from itertools import accumulate

from sessionfold.projections.ledger.rules import ends_in_word, negated_before, removed_spans
from sessionfold.projections.ledger.text import Region, quotable_regions

#: A message up to this long is recorded whole, even when words were given.
WHOLE_CHARS = 300
#: A message over this long is recorded only from the exact words given for it.
WORDS_REQUIRED_CHARS = 600

_RULE_WORD = re.compile(r"\b(?:never|always|don['’]?t|do\s+not|must|stop|only)\b", re.I)
_FROM_NOW = re.compile(r"\b(?:from\s+now\s+on|from\s+here\s+on|going\s+forward)\b", re.I)
_FOR_NOW = re.compile(r"\b(?:yet|for\s+now|this\s+time)\b", re.I)
_FORGET_IT = re.compile(r"\bforget\s+(?:it|that|about\s+it|about\s+that)\b", re.I)
_NEVER_MIND = re.compile(r"\bnever\s?mind\b", re.I)
# Withdrawals that stop a "from now on" sentence from reading as a rule; "instead of" does not:
# "two-space indentation instead of tabs from now on" is a rule that replaces another.
_WITHDRAWS = re.compile(
    r"\b(?:lifted|no\s+longer|(?:doesn['’]?t|does\s+not|don['’]?t|do\s+not)\s+apply"
    r"|withdraw\w*|revoke\w*|rescind\w*|disregard)\b",
    re.I,
)
# A rule word inside a relative clause describes a thing: "an option that keeps only lines".
_DESCRIBING = re.compile(
    r"\b(?:a|an|the|one|some|any)\s+(?:[\w-]+\s+){0,2}?(?:that|which|whose)\b", re.I
)
# "the only", "not only", "if only", "there's only": the word before "only", read back from
# it by `rules.ends_in_word` (each word's length is listed).
_NOT_RULE_ONLY = re.compile(r"the|not|if|my|our|your|an?|there['’]?s|is|are", re.I)
_NOT_RULE_ONLY_LENGTHS = (1, 2, 3, 4, 6, 7)
# "only one file left" counts something; it rules nothing.
_ONLY_COUNTING = re.compile(r"\s+(?:one|two|three|a\s+few|a\s+couple|\d+)\b", re.I)
# "I don't think ..." states an opinion about the work, not a rule over it.
_OPINION = re.compile(
    r"\b(?:i|we)\s+(?:don['’]?t|do\s+not)\s+(?:think|tink|know|understand|see|get|remember"
    r"|care|mind|believe|suppose|need|want\s+to\s+know)\b",
    re.I,
)
# A closing "ok?" asks nothing; "..., right?" does ask. The lookbehinds start a run of commas
# and spaces only at its first character (a match can start nowhere else), so a long run is
# not read again from each of its characters.
_TAG_QUESTION = re.compile(
    r"(?<![,\s])[,\s]*\b(?:ok|okay|alright|all\s+right|got\s+it|understood|capisce)"
    r"\s*\?+\s*$",
    re.I,
)
_CLAUSE_BREAK = re.compile(r"[,;:()]\s*|(?<!\s)\s+[-–—]+\s+|(?<!\s)\s+but\s+", re.I)
_TERMINATORS = ".!?…"
_CLOSERS = "\"'”’)]»"


def sentences(text: str) -> list[Region]:
    """(start, end) of each sentence: split at . ! ? … before whitespace, and at line breaks."""
    found: list[Region] = []

    def add(start: int, end: int) -> None:
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if end > start:
            found.append((start, end))

    start = index = 0
    size = len(text)
    while index < size:
        char = text[index]
        if char == "\n":
            add(start, index)
            start = index = index + 1
            continue
        if char in _TERMINATORS:
            stop = index
            while stop < size and text[stop] in _TERMINATORS:
                stop += 1
            while stop < size and text[stop] in _CLOSERS:
                stop += 1
            if stop == size or text[stop].isspace():
                add(start, stop)
                start = stop
            index = stop
            continue
        index += 1
    add(start, size)
    return found


def clauses(sentence: str) -> list[str]:
    """The clauses of a sentence, split at commas, semicolons, colons, dashes and "but"."""
    return [part for part in _CLAUSE_BREAK.split(sentence) if part.strip()]


def is_question(sentence: str) -> bool:
    """True for a sentence that asks something; a closing "ok?" asks nothing."""
    return _TAG_QUESTION.sub("", sentence).rstrip().endswith("?")


def withdraws_itself(text: str) -> bool:
    """True when text withdraws something: "forget it" (not "don't forget it"), "never mind",
    "lifted", "no longer", "doesn't apply"."""
    if _NEVER_MIND.search(text) or _WITHDRAWS.search(text):
        return True
    return any(not negated_before(text, m.start()) for m in _FORGET_IT.finditer(text))


def _rule_clause(clause: str) -> bool:
    """True when a rule word of the clause rules: not describing a thing, not "the only"
    or "only one", not inside an opinion ("I don't think").

    Each rule word is judged by the clause before it, read once for all of them: a thing
    described before one rule word is described before every later one, and the first match
    of `_DESCRIBING` ends before every other, so a rule word from its end on describes.
    """
    if _FOR_NOW.search(clause) or withdraws_itself(clause):
        return False
    describing = _DESCRIBING.search(clause)
    described_from = describing.end() if describing else len(clause) + 1
    opinions: list[tuple[int, int]] | None = None
    at = 0  # the first opinion that does not end before the rule word
    for match in _RULE_WORD.finditer(clause):
        start = match.start()
        if start >= described_from:
            break
        if match.group(0).lower() == "only" and (
            ends_in_word(clause, start, _NOT_RULE_ONLY, _NOT_RULE_ONLY_LENGTHS)
            or _ONLY_COUNTING.match(clause, match.end())
        ):
            continue
        if opinions is None:
            opinions = [(o.start(), o.end()) for o in _OPINION.finditer(clause)]
        while at < len(opinions) and opinions[at][1] <= start:
            at += 1
        if at < len(opinions) and opinions[at][0] <= start:
            continue
        return True
    return False


#: What a text holds lower-cased when `_RULE_WORD` or `_FROM_NOW` matches in it: each match
#: holds one of these ("do not" holds "not", "don't" and "dont" hold "don").
_RULE_ANCHORS = ("never", "always", "don", "not", "must", "stop", "only", "from", "going")
#: The characters re.I matches with an ASCII letter that lower() does not make it (dotted
#: capital I, dotless i, long s): a text holding one is read in full, not looked in.
_FOLD_BREAKERS = ("\u0130", "\u0131", "\u017f")


def _may_rule(text: str) -> bool:
    """False only when no sentence of `text` can read as a rule: neither `_RULE_WORD` nor
    `_FROM_NOW` can match in it, as its lower case holds none of `_RULE_ANCHORS` (a few
    `find`s in place of the ten case-insensitive scans of each sentence)."""
    if not text.isascii() and any(map(text.__contains__, _FOLD_BREAKERS)):
        return True
    return any(map(text.lower().__contains__, _RULE_ANCHORS))


def rule_sentences(text: str) -> list[Region]:
    """The sentences of `text` that read as standing rules (empty: the message reads as none)."""
    found: list[Region] = []
    if not _may_rule(text):
        return found
    for start, end in sentences(text):
        sentence = text[start:end]
        # A sentence reads as a rule only where a rule word or "from now on" matches in it.
        if not _may_rule(sentence) or is_question(sentence):
            continue
        body = _TAG_QUESTION.sub("", sentence)
        says_from_now = bool(_FROM_NOW.search(body)) and not withdraws_itself(body)
        if says_from_now or any(_rule_clause(clause) for clause in clauses(body)):
            found.append((start, end))
    return found


def reads_as_rule(text: str) -> bool:
    """True when a sentence of `text` reads as a standing rule."""
    return bool(rule_sentences(text))


def standing_sentences(text: str) -> list[Region]:
    """Offsets in `text` of the user's own sentences that read as standing rules.

    Only quotable regions count; a sentence that touches a code fence, a blockquoted line or
    a quoted passage of six words or more is not the user's own and is not read.
    """
    found: list[Region] = []
    for start, end in quotable_regions(text):
        region = text[start:end]
        removed = removed_spans(region)  # sorted by start
        starts = [r0 for r0, _ in removed]
        reach = list(accumulate((r1 for _, r1 in removed), max))  # furthest end so far
        for a, b in rule_sentences(region):
            # A removed span overlaps [a, b) when it starts before b and ends after a.
            before = bisect_left(starts, b)
            if before and reach[before - 1] > a:
                continue
            found.append((start + a, start + b))
    return found


def standing_region(
    text: str, whole_chars: int = WHOLE_CHARS, words_chars: int = WORDS_REQUIRED_CHARS
) -> Region | None:
    """Where the rule of a message that reads as standing stands, or None when it reads as none.

    A message of at most `whole_chars` is its rule whole (a part can lean on the rest);
    a longer one is its rule sentences, first to last, or the first alone when those run
    past `words_chars`. The region always lies inside one quotable region.
    """
    standing = standing_sentences(text)
    if not standing:
        return None
    regions = quotable_regions(text)
    if sum(end - start for start, end in regions) <= whole_chars:
        return max(regions, key=lambda r: r[1] - r[0])
    start, end = standing[0][0], standing[-1][1]
    inside = any(a <= start and end <= b for a, b in regions)
    if end - start > words_chars or not inside:
        end = standing[0][1]
    return start, end
