"""The lift check, and the text it judges: only the user's own words withdraw a rule.

A lift is applied only when the message says it withdraws something ("lifted", "no longer",
"doesn't apply", "instead of" the rule's own words) and shares a word with the rule it names;
a lift of a replacement must also name what it set beyond the rule it replaced.
Quoted passages of six words or more (straight, curly, German or guillemet marks, or inline
code), blockquoted lines and code fences are left out first, so a pasted or relayed withdrawal
withdraws nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_FENCE = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n.*?(?:^[ \t]*\1[^\n]*$|\Z)", re.S | re.M)
# A quoted passage may run over lines (a pasted error), never over a blank line.
_QUOTED = re.compile(r'"(?:[^"\n]|\n(?![ \t]*\n))*"|“[^”]*”|„[^“”]*[“”]|«[^»]*»|»[^«]*«|`[^`\n]+`')
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_'’.:/@#+-]*")
_WITHDRAWAL = re.compile(
    r"\b(?:lifted|lift(?:ing)?\s+(?:the|that|this|my|rule|r\d+|u\d+)\b|no\s+longer"
    r"|(?:doesn['’]?t|does\s+not|don['’]?t|do\s+not)\s+apply|not\s+apply(?:ing)?|instead\s+of"
    r"|forget\s+(?:the|that|this|my|about|what)\b|disregard|withdraw\w*|revoke\w*|rescind\w*"
    r"|scrap\s+(?:the|that)\b|drop\s+(?:the|that)\s+rule|ignore\s+(?:the|that|this|my)\s+"
    r"(?:rule|instruction)|(?:not|isn['’]?t)\s+(?:needed|required|necessary)\s+any\s?more)",
    re.I,
)
_NEGATED_BEFORE = re.compile(r"\b(?:don['’]?t|do\s+not|never)\s+$", re.I)
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
        (m.start(), m.end())
        for m in _QUOTED.finditer(text)
        if len(_WORD.findall(m.group(0))) >= _MIN_QUOTED_WORDS
    ]
    return sorted(spans)


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
        if match.group(0).lower().startswith("forget") and _NEGATED_BEFORE.search(
            text[: match.start()]
        ):
            continue  # "don't forget the tests" withdraws nothing
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
