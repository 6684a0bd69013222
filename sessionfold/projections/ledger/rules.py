"""The lift check, and the text it judges: only the user's own words withdraw a rule.

A lift is applied only when the message says it withdraws something ("lifted", "no longer",
"doesn't apply", "instead of" the rule's own words, "ignore what I said", "stop doing",
"anymore") and shares a word with the rule it names (a flag such as `-x` is a word);
a lift of a replacement must also name what it set beyond the rule it replaced.
Quoted passages of six words or more (straight, curly, German or guillemet marks, or inline
code), blockquoted lines and code fences are left out first, so a pasted or relayed withdrawal
withdraws nothing.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable

_FENCE = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n.*?(?:^[ \t]*\1[^\n]*$|\Z)", re.S | re.M)
# A quoted passage may run over lines (a pasted error), never over a blank line: what
# `"(?:[^"\n]|\n(?![ \t]*\n))*"|“[^”]*”|„[^“”]*[“”]|«[^»]*»|»[^«]*«|`[^`\n]+`` finds, read by
# `quoted_passages` without that pattern's retry of every opening mark left unclosed.
_OPENING = re.compile('["“„«»`]')
_CLOSING = {
    '"': re.compile('"'),
    "“": re.compile("”"),
    "„": re.compile("[“”]"),
    "«": re.compile("»"),
    "»": re.compile("«"),
    "`": re.compile("[`\n]"),
}
_BLANK_LINE = re.compile(r"\n(?=[ \t]*\n)")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_'’.:/@#+-]*")
_WITHDRAWAL = re.compile(
    r"\b(?:lifted|lift(?:ing)?\s+(?:the|that|this|my|rule|r\d+|u\d+)\b|no\s+longer"
    r"|(?:doesn['’]?t|does\s+not|don['’]?t|do\s+not)\s+apply|not\s+apply(?:ing)?|instead\s+of"
    r"|forget\s+(?:the|that|this|my|about|what)\b|disregard|withdraw\w*|revoke\w*|rescind\w*"
    r"|scrap\s+(?:the|that)\b|drop\s+(?:the|that)\s+rule|ignore\s+(?:the|that|this|my)\s+"
    r"(?:rule|instruction)|(?:not|isn['’]?t)\s+(?:needed|required|necessary)\s+any\s?more"
    # "Ignore what I said about -x", "stop running the tests with -x" (a rule's action
    # stopped), "don't use -x anymore".
    r"|ignore\s+what\s+(?:i|we)(?:\s+(?:have|had|just))?\s+(?:said|wrote|told|asked)"
    r"|stop\s+\w+ing\b|any\s?more\b)",
    re.I,
)
# A rule's flag is a word of it however short: "-x", "--no-cache".
_FLAG = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*")
# "don't", "do not" or "never" just before a word, read back from the word (`negated_before`).
_NEGATION = re.compile(r"don['’]?t|never", re.I)
_NOT = re.compile(r"not", re.I)
_DO = re.compile(r"do", re.I)
_STOPWORDS = frozenset(
    """the and for you your that this with from now then have has had are was were will would
    should could can not don't dont never always must only stop rule rules lift lifted lifts
    longer apply applies instead forget about what when where which who why how all any some
    just also but use using it's its into out our their they them there here going forward okay
    yes please make sure does doesn't did get got let lets let's more less very much many one
    been being than too onto over under again still even ever every each other such own same
    i'm we're you're that's there's isn't aren't wasn't won't can't shouldn't wouldn't no yeah
    thing things stuff want need like just really""".split()  # noqa: SIM905
)
_MIN_QUOTED_WORDS = 6


def _space_before(text: str, end: int) -> int:
    """Where the run of whitespace that ends at `end` starts (`end` when there is none)."""
    start = end
    while start > 0 and text[start - 1].isspace():
        start -= 1
    return start


def _word_at(text: str, words: re.Pattern[str], lengths: Iterable[int], end: int) -> int:
    """The start of a word of `words` (each of one of `lengths`) that ends at `end` after a
    word boundary, or -1. Each word starts with a letter, so the boundary is a non-word
    character before it (or the start of the text)."""
    for length in lengths:
        start = end - length
        if (
            start >= 0
            and words.fullmatch(text, start, end)
            and (start == 0 or not (text[start - 1].isalnum() or text[start - 1] == "_"))
        ):
            return start
    return -1


def ends_in_word(text: str, end: int, words: re.Pattern[str], lengths: Iterable[int]) -> bool:
    """True when text[:end] ends in a word of `words`, then whitespace.

    What searching text[:end] for a word boundary, one of the words, whitespace and the end
    finds, read back from `end` alone: a loop that asks it once per match of a longer text
    stays linear in that text (a search of the whole prefix each time was quadratic).
    """
    stop = _space_before(text, end)
    return stop < end and _word_at(text, words, lengths, stop) >= 0


def negated_before(text: str, end: int) -> bool:
    """True when text[:end] ends in "don't" (any apostrophe, or none), "do not" or "never",
    then whitespace, in any case: `ends_in_word` for these words."""
    stop = _space_before(text, end)
    if stop == end:
        return False
    if _word_at(text, _NEGATION, (5, 4), stop) >= 0:
        return True
    if _word_at(text, _NOT, (3,), stop) < 0:
        return False
    # "do", whitespace, "not": "not" needs no boundary of its own after whitespace.
    gap = _space_before(text, stop - 3)
    return gap < stop - 3 and _word_at(text, _DO, (2,), gap) >= 0


def removed_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of what is not the user's own words: code fences, blockquoted lines and
    quoted passages of six words or more."""
    spans = [(m.start(), m.end()) for m in _FENCE.finditer(text)]
    offset = 0
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith(">"):
            spans.append((offset, offset + len(line)))
        offset += len(line)
    spans += [
        (start, end)
        for start, end in quoted_passages(text)
        if len(_WORD.findall(text[start:end])) >= _MIN_QUOTED_WORDS
    ]
    return sorted(spans)


def quoted_passages(text: str) -> list[tuple[int, int]]:
    """(start, end) of each quoted passage, left to right and not overlapping: straight or
    curly double quotes, German quotes, guillemets either way round, inline code.

    Each opening mark closes at the first closing mark after it (a straight quote only when
    no blank line comes first; inline code only on its line, with something inside). An
    opening mark whose closing mark never comes is skipped, and so is every later one of its
    kind, so every character is read a bounded number of times.
    """
    found: list[tuple[int, int]] = []
    unclosed: set[str] = set()  # marks with no closing mark after the last one tried
    blank_lines: list[int] | None = None
    position = 0
    while (opening := _OPENING.search(text, position)) is not None:
        start = opening.start()
        mark = text[start]
        end = -1
        closing = None if mark in unclosed else _CLOSING[mark].search(text, start + 1)
        if closing is None:
            unclosed.add(mark)
        elif mark == "`":
            if text[closing.start()] == "`" and closing.start() > start + 1:
                end = closing.end()
        elif mark == '"':
            if blank_lines is None:
                blank_lines = [m.start() for m in _BLANK_LINE.finditer(text)]
            after = bisect_right(blank_lines, start)
            if after == len(blank_lines) or blank_lines[after] >= closing.start():
                end = closing.end()
        else:
            end = closing.end()
        if end >= 0:
            found.append((start, end))
            position = end
        else:
            position = start + 1
    return found


def judged_text(text: str) -> str:
    """`text` without code fences, blockquoted lines and quoted passages of six words or more."""
    parts, position = [], 0
    for start, end in removed_spans(text):
        if end <= position:
            continue
        parts.append(text[position : max(start, position)])
        parts.append(" ")
        position = end
    parts.append(text[position:])
    return "".join(parts)


def withdraws(text: str) -> bool:
    """True when `text` (already judged) says it withdraws something."""
    for match in _WITHDRAWAL.finditer(text):
        if match.group(0).lower().startswith(("forget", "stop")) and negated_before(
            text, match.start()
        ):
            continue  # "don't forget the tests", "never stop running them" withdraw nothing
        return True
    return False


def content_words(text: str) -> set[str]:
    """Lower-cased words of three letters or more that say something (no stopwords)."""
    words = set()
    for raw in _WORD.findall(text.lower()):
        word = raw.rstrip(".:'’-").replace("’", "'")
        if len(word) < 3 or word in _STOPWORDS:
            continue
        if len(word) > 4 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]  # "tabs" and "tab" are one word for sharing
        words.add(word)
    words.update(flag.lower() for flag in _FLAG.findall(text))
    return words


def shared_words(text: str, rule_words: str) -> set[str]:
    """Content words `text` and a rule's words have in common."""
    return content_words(text) & content_words(rule_words)


def beyond_words(rule_words: str, replaced: Iterable[str]) -> set[str]:
    """Content words a replacement set beyond the rules it replaced."""
    before: set[str] = set()
    for words in replaced:
        before |= content_words(words)
    return content_words(rule_words) - before


def lift_check(
    message: str, rule_words: str, given: Iterable[str] = (), replaced: Iterable[str] = ()
) -> bool:
    """True when the message, and each of the words given for it, withdraws and shares a word.

    For a rule that replaced others (`replaced`: their words), the shared word must be one
    the replacement set beyond them: a withdrawal worded after the old rule does not lift
    what only the replacement says, so it is lifted only when named.
    """
    beyond = beyond_words(rule_words, replaced) if replaced else set()
    for text in (message, *given):
        judged = judged_text(text)
        if not (withdraws(judged) and shared_words(judged, rule_words)):
            return False
        if beyond and not content_words(judged) & beyond:
            return False
    return True


def conflicts(rules: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """Rules in force (id, words; oldest first) that may contradict an earlier one in force:
    their words would pass the lift check against it, yet they did not lift it. The summary
    shows such a pair rather than keep both silently; each rule maps to the earlier ids."""
    found: dict[str, list[str]] = {}
    earlier: list[tuple[str, str]] = []
    for rule_id, words in rules:
        judged = judged_text(words)
        if withdraws(judged):
            named = [other for other, before in earlier if shared_words(judged, before)]
            if named:
                found[rule_id] = named
        earlier.append((rule_id, words))
    return found
