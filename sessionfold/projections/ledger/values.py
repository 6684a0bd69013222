"""Values a later turn may need, read from a span's commands (seeds/002: "a timing, a total, a
port"), each with what it is. The offline model names these with the command's id as their
turn; verification keeps one only where it stands verbatim in that turn, as for any model.

Code reads a few kinds from a command's whole output, each by a shape that says what it is,
never "any number" (`command_values`): a line count (`wc -l`), a compiler's error location, a
commit made or the newest one logged, an address or port a server listens on, a timing the
output reports ("took", "Duration"), a test total. The head and tail of each output (what the
ledger keeps of it) also show paths, hashes and identifiers by their shape alone. An answer
names only a few values, so `span_values` ranks them all by what the span itself shows of
each (`SIGNALS`): the assistant wrote it in a command, code shown defines it, an error line
shows it, the user named it, several turns show it, one of the last commands shows it. Nothing
later than the span is read. Values in the partial lines around the cut of an output's head
and tail are not read.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from itertools import accumulate
from typing import Any

# The group ends at the line's last non-space character; a lazy `.*?` before `\s*$` found that
# end by reading the rest of the line again at each character (quadratic in a long line).
_WC_LINE = re.compile(r"^\s*(\d+\s+\S(?:.*\S)?)\s*$")
_ERROR_LOCATION = re.compile(
    r"(?<![\w./@-])(?P<loc>[\w./@-]+\.\w+(?:\(\d+,\d+\)|:\d+:\d+))\s*[-:]?\s*(?:error|warning)\b",
    re.I,
)
_COMMIT_MADE = re.compile(r"^\[[\w./-]+(?: \(root-commit\))? (?P<hash>[0-9a-f]{7,40})\]", re.M)
_GIT_LOG = re.compile(r"(?:^|\s)git\s+(?:--no-pager\s+)?log\b")
_LOG_LINE = re.compile(r"^(?:\*\s+)?(?:commit\s+)?(?P<hash>[0-9a-f]{7,40})\b")
_ADDRESS = re.compile(r"\b(?:localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1?\]):\d{2,5}\b")
_PORT = re.compile(r"\bport\s+(\d{2,5})\b", re.I)
# A timing the output reports as one ("took 3.2s", "Duration 1.4 s", "Done in 12s"), not every
# "in 122ms" a linter prints on each run.
_TIMING = re.compile(
    r"\b(?:[Tt]ook|[Dd]uration:?|[Ee]lapsed:?|[Tt]ime:|(?:Done|Finished|Completed) in)\s+"
    r"(?P<t>\d+(?:\.\d+)?\s?(?:ms|s|sec|seconds|m|min))\b"
)
# The ledger keeps an output's head and tail joined by " … ": the lines either side of the
# cut are partial, and a value read there could be a fragment ("h.ts(8,49)").
CUT_MARK = " … "
_TESTS = re.compile(r"\b\d+ (?:passed|failed|skipped|errors?|tests?)\b")


def without_cut(text: str) -> str:
    """`text` without the line that holds its first " … " (the newline either side kept).

    What the pattern it replaces (any run of non-newlines, " … ", any run of non-newlines;
    first match deleted) returned, found with one `find` and no backtracking: that pattern
    retried every start of a long line that holds no cut, so it took seconds on a 64 K
    single-line output and minutes on a megabyte.
    """
    at = text.find(CUT_MARK)
    if at < 0:
        return text
    start = text.rfind("\n", 0, at) + 1
    end = text.find("\n", at + len(CUT_MARK))
    return text[:start] + (text[end:] if end >= 0 else "")


# Words each output pattern cannot match without (any one of them): an output that holds none
# of them is not scanned by that pattern, whose per-character cost is what the fold spends
# most on. A case-sensitive pattern's words are looked for in the output as it is; an re.I
# pattern's in the lower-cased output (`_lowered`), unless the output holds one of the letters
# re.I equates with an ASCII one that lower() does not make it: that text is scanned.
_NEEDS: dict[re.Pattern[str], tuple[str, ...]] = {
    _ERROR_LOCATION: ("error", "warning"),
    _COMMIT_MADE: ("[",),
    _ADDRESS: ("localhost:", "127.0.0.1:", "0.0.0.0:", "[::]:", "[::1]:"),
    # "port" then any character \s matches in ASCII text
    _PORT: tuple("port" + space for space in " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"),
    _TIMING: (
        "Took",
        "took",
        "Duration",
        "duration",
        "Elapsed",
        "elapsed",
        "Time:",
        "time:",
        "Done in",
        "Finished in",
        "Completed in",
    ),
    _TESTS: (" passed", " failed", " skipped", " error", " test"),
}


#: A timing's words lower-cased: an output whose lower case holds none of these holds none of
#: the timing's words (one look for both cases of a word).
_TIMING_LOWER = ("took", "duration", "elapsed", "time:", "done in", "finished in", "completed in")

#: The characters re.I matches with an ASCII letter that lower() does not make that letter:
#: dotted capital I (whose lower() is two characters), dotless i and long s. In a text without
#: them lower() keeps every character's place, and an ASCII letter matches under re.I exactly
#: the characters lower() makes it (a test checks every code point).
_FOLD_BREAKERS = ("\u0130", "\u0131", "\u017f")


def _lowered(output: str) -> str | None:
    """`output` lower-cased, character for character, where a look for an ASCII word in it
    finds every place re.I finds the word in `output`; None when the output holds one of
    `_FOLD_BREAKERS` (then the re.I patterns scan it)."""
    if output.isascii():
        return output.lower()
    if any(map(output.__contains__, _FOLD_BREAKERS)):
        return None
    lowered = output.lower()
    return lowered if len(lowered) == len(output) else None


def _ascii_lowered(output: str) -> str | None:
    """What `_lowered(output)` gives for a look for an ASCII word: the same places hold each
    one. A non-ASCII text's lower case is built from its ASCII letters alone, every other
    character made a "?" (one character each, so the places stay the output's), by an encode
    and a lower at C speed instead of `str.lower`'s Unicode mapping of every character; a
    text with the Kelvin sign, whose lower case is an ASCII "k", is lower-cased in full."""
    if output.isascii():
        return output.lower()
    if any(map(output.__contains__, _FOLD_BREAKERS)):
        return None
    if "\u212a" in output:
        return _lowered(output)
    return output.encode("ascii", "replace").lower().decode("ascii")


def _scanned(pattern: re.Pattern[str], output: str, lowered: str | None) -> list[re.Match[str]]:
    """`pattern`'s matches in `output` (one of `_NEEDS`' patterns; `lowered`: the output in
    lower case as `_lowered` gives it, or None), as `pattern.finditer(output)` finds them.

    No pattern scans every position: each is tried only where a match can start
    (`_matches_from`), found with `str.find` (and a regex for the error locations' suffixes
    and a test total's words):
    - a timing, an address: where one of its words stands (every match starts with one), a
      timing's in the lower case (seven looks for both cases of its eleven words), an
      address's IPv4 words only where ".0." stands and its IPv6 ones only where "[" does;
    - a commit made: at the start of a line that starts with "[";
    - a test total: at the start of the digits before " passed", " failed", ...;
    - a port: where "port" stands in the lower case (any case; with no lower case, scanned);
    - an error location: at the start of the name before the location suffix that ends
      where the separator before each "error" or "warning" of the lower case starts (with
      no lower case, at the start of the name before each location suffix).
    A `find` costs about a nanosecond a character (a one-character one, a fraction), so the
    looks are as few as the words allow."""
    if pattern is _ERROR_LOCATION:
        if lowered is None:
            return _matches_from(pattern, output, _location_starts(output))
        return _matches_from(pattern, output, _location_word_starts(output, lowered))
    if pattern is _PORT:
        if lowered is None:
            return list(pattern.finditer(output))
        return _matches_from(pattern, output, _port_starts(lowered, output))
    if pattern is _TESTS:
        return _matches_from(pattern, output, _test_total_starts(output))
    if pattern is _COMMIT_MADE:
        return _matches_from(pattern, output, _line_starts(output, "["))
    if pattern is _TIMING:
        if lowered is None:
            return _matches_from(pattern, output, _word_starts(output, _NEEDS[_TIMING]))
        return _matches_from(pattern, output, _word_starts(lowered, _TIMING_LOWER))
    if pattern is _ADDRESS:
        return _matches_from(pattern, output, _address_starts(output))
    raise ValueError("not an output pattern")  # pragma: no cover


def _port_starts(lowered: str, output: str) -> list[int]:
    """Where "port" stands in `lowered` (`output` lower-cased by `_lowered`) after no word
    character of `output` (the pattern's \\b: "import", "report" and "support" are not
    tried)."""
    return [
        at
        for at in _word_starts(lowered, ("port",))
        if not at or not (output[at - 1].isalnum() or output[at - 1] == "_")
    ]


def _address_starts(output: str) -> list[int]:
    """Where an address's words stand in `output`, ascending: "localhost:", the IPv4 words
    where ".0." does (both hold it), the IPv6 ones where "[" does."""
    words: tuple[str, ...] = ("localhost:",)
    if ".0." in output:
        words += ("127.0.0.1:", "0.0.0.0:")
    if "[" in output:
        words += ("[::]:", "[::1]:")
    return _word_starts(output, words)


def _matches_from(
    pattern: re.Pattern[str], output: str, starts: Iterable[int]
) -> list[re.Match[str]]:
    """`pattern.finditer(output)` when every match starts at one of `starts` (ascending): the
    match at each start that no earlier match covers, as the scan would find it there (a
    match at a position sees the whole text, lookbehinds included)."""
    found: list[re.Match[str]] = []
    end = 0
    for start in starts:
        if start >= end and (match := pattern.match(output, start)) is not None:
            found.append(match)
            end = match.end()
    return found


def _word_starts(text: str, words: tuple[str, ...]) -> list[int]:
    """Where any of `words` starts in `text`, ascending, each position once."""
    found: list[int] = []
    for word in words:
        at = text.find(word)
        while at >= 0:
            found.append(at)
            at = text.find(word, at + 1)
    if len(words) > 1 and found:
        return sorted(set(found))
    return found


def _line_starts(text: str, first: str) -> list[int]:
    """Where a line starts with the character `first` in `text`, ascending (a line starts
    at the text's start and after each "\n", as re.M's `^` does)."""
    if first not in text:
        return []  # a one-character look is the cheapest
    found = [0] if text.startswith(first) else []
    at = text.find("\n" + first)
    while at >= 0:
        found.append(at + 1)
        at = text.find("\n" + first, at + 1)
    return found


# A test total's words (`_NEEDS[_TESTS]`), each starting with a space that no other holds: the
# scan for the space and the letters after it finds every place one stands, in one read where
# five finds read the output five times.
_TEST_WORDS = re.compile(" (?:passed|failed|skipped|error|test)")


def _test_total_starts(output: str) -> list[int]:
    """Where a test total can start in `output`, ascending: at the first of the decimal digits
    (what \\d takes: `str.isdecimal`) that end where one of its words (" passed", " failed",
    ...) starts. Each run of digits ends at a space and the next starts after that word's
    letters, so the starts ascend as the words do, and no digit is read twice."""
    starts = []
    for end in map(re.Match.start, _TEST_WORDS.finditer(output)):
        start = end
        while start and output[start - 1].isdecimal():
            start -= 1
        if start < end:
            starts.append(start)
    return starts


# An error location's suffix ("(12,5)" or ":12:5"), found by its first character (a ':' or a
# '(', which the scan skips to), each one whether or not an earlier one overlaps it; and the
# name before it, read backwards: its characters end at the suffix, so the name starts where
# they start (the lookbehind refuses any other start). re.I, which the pattern has, adds no
# character to the name's class or to \d, so these two read without it.
_LOCATION_SUFFIX = re.compile(r":(?=\d+:\d)|\((?=\d+,\d+\))")
_NAME_CHARS = re.compile(r"[\w./@-]*")


# An error location read backwards from where its word stands (in the reversed output): the
# separator (`\s*[-:]?\s*`), a suffix, and the name's characters. Each part's end is the only
# one the pattern allows (a suffix ends in a digit or ")", neither a separator's character, and
# the name runs back to the lookbehind's non-name character), so its match ends where the one
# match of the pattern that ends in that word can start; possessive, as no part gives back
# (backtracking would try every split of a long run of spaces, quadratic in its length).
_LOCATION_BEFORE = re.compile(r"\s*+[-:]?+\s*+(?:\d++:\d++:|\)\d++,\d++\()[\w./@-]++")


def _location_word_starts(output: str, lowered: str) -> list[int]:
    """Where an error location can start in `output`, ascending: for each "error" or "warning"
    of `lowered` (`output` lower-cased by `_lowered`: re.I's words stand there), the start of
    the name and suffix that end at the separator before it, if they do. Only the few places
    the words stand are read, not every ":" and "(" of the output."""
    words = _word_starts(lowered, ("error", "warning"))
    if not words:
        return []
    backwards = output[::-1]
    size = len(output)
    starts = {
        size - found.end()
        for at in words
        if (found := _LOCATION_BEFORE.match(backwards, size - at)) is not None
    }
    return sorted(starts)


def _location_starts(output: str) -> Iterator[int]:
    """Where an error location can start in `output`, ascending: the start of each run of
    name characters that ends at a location suffix."""
    backwards = None
    size = len(output)
    for suffix in _LOCATION_SUFFIX.finditer(output):
        at = suffix.start()
        if backwards is None:
            backwards = output[::-1]
        run = _NAME_CHARS.match(backwards, size - at)  # `*`: it always matches
        name = 0 if run is None else run.end() - (size - at)
        if name:
            yield at - name


# A command that counts lines, and one that logs commits: looked for only in a command that
# holds "wc" or "git" (most do not; a search reads every character).
_WC_COMMAND = re.compile(r"(?:^|[\s;&|])wc\s+-l\b")
# A decimal digit, which every value `command_values` reads but a commit's hash holds.
_DIGIT = re.compile(r"\d")


def _has_digit(output: str) -> bool:
    """Whether `output` holds a decimal digit (`_DIGIT.search`): in ASCII text, a look for
    each of the ten (a `find` per digit at C speed, where \\d tests every character's Unicode
    category); other text is scanned."""
    if output.isascii():
        return any(map(output.__contains__, "0123456789"))
    return _DIGIT.search(output) is not None


def command_values(command: str, output: str) -> list[tuple[str, str]]:
    """(value, what) pairs a command's output shows, in output order, without repeats."""
    return _cut_output_values(command, without_cut(output))


def _cut_output_values(command: str, output: str) -> list[tuple[str, str]]:
    """`command_values` of an output already `without_cut` (`value_signals` reads it for
    its shapes too)."""
    found: list[tuple[str, str]] = []
    seen: set[str] = set()

    def add(value: str, what: str) -> None:
        value = value.strip()
        if value and value not in seen:
            seen.add(value)
            found.append((value, what))

    # Every kind but a commit's hash reads a digit (\\d): an output without one (a third to
    # a half of them) is read for commits only.
    digits = _has_digit(output)
    lowered = _ascii_lowered(output) if digits else None
    # Each pattern is tried only when a word it cannot match without stands in the output (as
    # `_scanned` would find none): most outputs are short, and a scan's calls cost more than
    # their looks.
    if digits:
        if "wc" in command and _WC_COMMAND.search(command):
            for line in output.splitlines():
                match = _WC_LINE.match(line)
                if match:
                    add(match.group(1), "lines, wc -l")
        if lowered is None or "error" in lowered or "warning" in lowered:
            for match in _scanned(_ERROR_LOCATION, output, lowered):
                add(match.group("loc"), "error location")
    if "[" in output:
        for match in _scanned(_COMMIT_MADE, output, lowered):
            add(match.group("hash"), "commit made")
    if "git" in command and _GIT_LOG.search(command):
        for line in output.splitlines()[:1]:
            match = _LOG_LINE.match(line.strip())
            if match:
                add(match.group("hash"), "newest commit logged")
    if not digits:
        return found
    if ":" in output:  # every address's words end with one
        for match in _scanned(_ADDRESS, output, lowered):
            add(match.group(0), "address")
    if lowered is None or "port" in lowered:
        for match in _scanned(_PORT, output, lowered):
            add(match.group(0), "port")
    if lowered is None or any(map(lowered.__contains__, _TIMING_LOWER)):
        for match in _scanned(_TIMING, output, lowered):
            add(match.group("t"), "timing")
    if any(map(output.__contains__, _NEEDS[_TESTS])):
        for match in _scanned(_TESTS, output, lowered):
            add(match.group(0), "test total")
    return found


# The other values an output shows, by shape alone (seeds/002: "a path, a number, a hash, a
# port, an identifier"): a path (absolute, home- or dot-relative, or relative with an
# extension), a hash (hex digits with a letter and a digit), an identifier (camelCase,
# PascalCase with an inner capital, snake_case). No bare number: a number alone does not say
# what it is, and the kinds above already read the ones that do.
#: `_SHAPE`'s alternatives, in its order: two paths (each needs a "/"), a hash, camelCase and
#: PascalCase (each needs a capital), snake_case (needs a "_").
_SHAPE_ALTERNATIVES = (
    r"(?<![\w.@/~-])(?:~|\.{1,2})?/(?:[\w.@+-]+/)*[\w.@+-]+",
    r"(?<![\w.@/-])[\w.@-]+(?:/[\w.@-]+)+\.\w+\b",
    r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b",
    r"\b[a-z]+(?:[A-Z][a-z0-9]*)+\b",
    r"\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b",
    r"\b[A-Za-z][a-z0-9]*(?:_[A-Za-z0-9]+)+\b",
)
_SHAPE = re.compile("|".join(_SHAPE_ALTERNATIVES))
_MIN_CHARS = 4
# `_SHAPE` read at a word's start only: every alternative starts after a non-word character
# (a lookbehind that refuses \w, or \b before a word character), so the prefix changes no
# match; it ends the attempt at each position inside a word after one check, not six.
_SHAPE_AT_START = re.compile(r"(?<!\w)(?:" + _SHAPE.pattern + ")")


def _shape_at_start(slash: bool, underscore: bool, capital: bool) -> re.Pattern[str]:
    """`_SHAPE_AT_START` with only the alternatives a run can match: the paths where it holds
    a "/", snake_case where a "_", camelCase and PascalCase where it may hold a capital (the
    hash always). At a position the first alternative that matches is the match, and one that
    cannot match anywhere in the run changes none: the run's matches are the same, without
    the tries of the others (a path's greedy run, given back a character at a time, is most
    of a run's cost)."""
    kept = [
        alternative
        for index, alternative in enumerate(_SHAPE_ALTERNATIVES)
        if (index > 1 or slash) and (index not in (3, 4) or capital) and (index < 5 or underscore)
    ]
    return re.compile(r"(?<!\w)(?:" + "|".join(kept) + ")")


#: `_shape_at_start` by (slash, underscore, capital).
_SHAPE_AT_START_BY = {
    (slash, underscore, capital): _shape_at_start(slash, underscore, capital)
    for slash in (False, True)
    for underscore in (False, True)
    for capital in (False, True)
}
#: Seven hex digits: `_SHAPE_HINT`'s one alternative a run without "/", "_" or a capital can
#: match.
_HEX_DIGITS = re.compile(r"[0-9a-f]{7}")
# A run of the characters `_SHAPE` reads (it matches nothing else and looks at nothing else),
# as long as the shortest value kept: no match spans two runs or depends on what is around one
# (the neighbours, never \w nor in a lookbehind's set, read as the text's ends), so the text's
# matches are its runs' matches in order.
_SHAPE_RUN = re.compile(r"[\w.@/~+-]{4,}")
# What a run holds when any alternative can match in it: a slash (the paths), an underscore
# (snake_case), a capital after a lower-case letter or digit (camelCase, PascalCase), seven hex
# digits (a hash). A run without one, most words of prose and code, is not read by `_SHAPE`,
# whose per-character cost is the ledger's largest.
_SHAPE_HINT = re.compile(r"[/_]|[a-z0-9][A-Z]|[0-9a-f]{7}")
# A name the code an output shows defines ("function getThemesDir(", "class AgentSession",
# "def first_kept_id", "const queueMode =").
_DEFINES = re.compile(
    r"\b(?:function\*?|class|interface|type|enum|struct|trait|def|fn|const|let|var)\s+"
    r"(?P<name>[A-Za-z_$][\w$]*)"
)
# A line that reports a failure (the words the fold's error heads are chosen by).
_ERROR_WORDS = (
    "error",
    "fail",
    "not found",
    "no such",
    "cannot",
    "can't",
    "denied",
    "invalid",
    "refused",
    "exception",
    "×",
)
_ERROR_LINE = re.compile("|".join(map(re.escape, _ERROR_WORDS)), re.I)


def _reports_failure(text: str) -> bool:
    """Whether `text` holds one of the error words in any case (`_ERROR_LINE`'s search): in
    ASCII text, a look for each in the lower-cased text, which costs a fraction of the
    case-insensitive scan; other text is scanned (re.I equates a few non-ASCII letters with
    ASCII ones, which lower() does not)."""
    if not text.isascii():
        return _ERROR_LINE.search(text) is not None
    lowered = text.lower()
    return any(map(lowered.__contains__, _ERROR_WORDS))


#: How many of a span's last commands are its last turns.
RECENT_COMMANDS = 8

#: What the span shows of a value, how much each says that a later turn will need it, and
#: how the summary names it. Each is read from the span's own turns (its commands, their
#: outputs' head and tail, its errors, its user messages), never from anything later.
SIGNALS: tuple[tuple[str, int, str], ...] = (
    # code read it by a shape that says what it is (`command_values`, the whole output)
    ("read", 2, ""),
    # the assistant wrote this name or hash in a command: it searched for it, looked at it
    ("command", 3, "in a command"),
    # the assistant wrote this path in a command: the file it works on, which the command
    # line and the files the summary lists already record, so it weighs less
    ("operand", 1, "in a command"),
    ("defined", 2, "defined"),  # code an output shows defines it
    ("error", 2, "on an error line"),  # a line that reports a failure shows it
    ("user", 2, "named by the user"),  # a user message of the span names it
    ("repeated", 1, "seen again"),  # two turns or more show or name it
    ("again", 1, "seen again"),  # three turns or more
    ("recent", 1, "recent"),  # one of the span's last commands shows it
)
_WEIGHT = {name: weight for name, weight, _ in SIGNALS}


def shapes(text: str) -> list[str]:
    """The values a text shows by their shape alone, in text order, without repeats."""
    found: dict[str, None] = {}
    # `_SHAPE_RUN`, `_SHAPE_HINT` and `_SHAPE_AT_START` find what `_SHAPE.finditer(text)`
    # finds, in the same order, reading only the runs that can hold a match. A value shorter
    # than `_MIN_CHARS` is dropped ("/", "./" and "../" among them).
    for run in filter(_SHAPE_HINT.search, _SHAPE_RUN.findall(text)):
        for value in _SHAPE_AT_START.findall(run):
            value = value.rstrip(".:,")
            if len(value) >= _MIN_CHARS:
                found[value] = None
    return list(found)


#: What the runs of a text show (`_run_values`), by run: one `value_signals` call reads many
#: texts of one span, whose runs repeat (names, paths), and each error line again.
RunMemo = dict[str, tuple[str, ...]]


def _run_values(run: str) -> tuple[str, ...]:
    """The values one run of `_SHAPE_RUN` shows, in order (repeats kept): none without a
    hint, else `_SHAPE_AT_START`'s matches without trailing ".:," and at least
    `_MIN_CHARS` long. Both read only what the run's characters allow (`_shape_at_start`):
    a run that `islower` holds no capital, so neither camelCase nor PascalCase; a word
    shorter than `_MIN_CHARS` (`_words` gives them) holds no value that long."""
    if len(run) < _MIN_CHARS:
        return ()
    slash = "/" in run
    underscore = "_" in run
    capital = not run.islower()
    if not (slash or underscore):
        # `_SHAPE_HINT` without its "/" and "_", and without its capital where there is none
        if capital:
            if _SHAPE_HINT.search(run) is None:
                return ()
        elif len(run) < 7 or _HEX_DIGITS.search(run) is None:
            return ()
    found = _SHAPE_AT_START_BY[slash, underscore, capital].findall(run)
    values = (value.rstrip(".:,") for value in found)
    return tuple(value for value in values if len(value) >= _MIN_CHARS)


#: ASCII bytes, each a space unless `_SHAPE_RUN` reads it (\\w is [A-Za-z0-9_] in ASCII).
_RUN_BYTES = bytes(
    byte if chr(byte).isascii() and (chr(byte).isalnum() or chr(byte) in "_./@~+-") else 32
    for byte in range(256)
)


#: The ASCII bytes: deleted from a text's UTF-8 to leave its other characters.
_ASCII_BYTES = bytes(range(128))


def _words(text: str) -> list[str]:
    """The runs of `text` (`_SHAPE_RUN.findall`) in order, with the words shorter than a run
    between them (none shows a value: `_run_values` of a word shorter than `_MIN_CHARS` is
    empty) where a split at C speed (about half the regex's time) can read the text: ASCII
    text, and text whose other characters are none of them a word character (\\w:
    `isalnum`), as most outputs' box drawing and marks, those made spaces (each byte of their
    UTF-8 is one, and a run ends at them as at any character it cannot hold). Other text goes
    through the regex."""
    data = text.encode()
    if not text.isascii():
        others = data.translate(None, _ASCII_BYTES).decode()
        if any(char.isalnum() for char in set(others)):
            return _SHAPE_RUN.findall(text)
    return data.translate(_RUN_BYTES).decode().split()


def _shapes(text: str, memo: RunMemo) -> list[str]:
    """`shapes(text)`, each run read once per `memo` (a run's values do not depend on
    what stands around it: see `_SHAPE_RUN`)."""
    found: dict[str, None] = {}
    # One look in the memo per word: most words show no value (an empty tuple), and a step
    # per word costs less than building a set of them and chaining their tuples.
    for word in _words(text):
        values = memo.get(word)
        if values is None:
            values = memo[word] = _run_values(word)
        if values:
            found.update(dict.fromkeys(values))
    return list(found)


#: The words `_DEFINES` starts with: each of its matches starts where one stands after no
#: word character.
_DEFINE_WORDS = (
    "function",
    "class",
    "interface",
    "type",
    "enum",
    "struct",
    "trait",
    "def",
    "fn",
    "const",
    "let",
    "var",
)


def _defined_names(output: str) -> list[str]:
    """The names `_DEFINES` finds in `output` (`finditer`'s), tried only where one of its
    words stands after no word character (its leading \\b) instead of at every position."""
    starts = [
        at
        for at in _word_starts(output, _DEFINE_WORDS)
        if not at or not (output[at - 1].isalnum() or output[at - 1] == "_")
    ]
    return [match.group("name") for match in _matches_from(_DEFINES, output, starts)]


def _error_lines(output: str) -> list[str]:
    """The lines of `output` (`splitlines`) that report a failure (`_reports_failure`), in
    order: the lines that hold the words' occurrences in the lower-cased output (`_lowered`,
    non-ASCII text too; no word holds a line break), found with a `find` per occurrence
    instead of a look for every word in every line; a text `_lowered` refuses is read line
    by line."""
    lowered = _lowered(output)
    if lowered is None:
        if not _reports_failure(output):
            return []
        return [line for line in output.splitlines() if _reports_failure(line)]
    occurrences = _word_starts(lowered, _ERROR_WORDS)
    if not occurrences:
        return []
    # Where each line ends, its line break included: a word at `at` is in the first line
    # that ends after it.
    ends = list(accumulate(map(len, output.splitlines(keepends=True))))
    lines = output.splitlines()
    return [lines[i] for i in sorted({bisect_right(ends, at) for at in occurrences})]


def _unclipped(text: str) -> str:
    """A text a prompt clipped ("…" at its end) without the word the clip cut."""
    if not text.endswith("…"):
        return text
    return text[:-1].rsplit(None, 1)[0] if " " in text.strip() else ""


def value_signals(
    commands: list[dict[str, Any]],
    per_command: int = 4,
    *,
    messages: list[dict[str, Any]] | None = None,
    errors: list[dict[str, Any]] | None = None,
) -> dict[str, tuple[set[str], int, str, str]]:
    """Every value a span's commands showed: its signals, the position and id of the newest
    command that shows it verbatim (its output's head and tail, or the values code read
    from the whole output), and what code read it as ("" for a value read by shape alone).

    The values are the ones `command_values` read (up to `per_command` of each command, so
    one long listing cannot crowd out the span's others) and the shapes the outputs' head
    and tail show, not in the partial lines either side of the cut. Commands, error heads
    and user messages give signals only: a value no output shows is not one of the span's.
    """
    found: dict[str, tuple[set[str], int, str, str]] = {}
    turns_of: dict[str, set[str]] = {}  # value -> the turns that show or name it
    written: set[str] = set()
    defined: set[str] = set()
    on_error: set[str] = set()
    recent_from = len(commands) - RECENT_COMMANDS
    memo: RunMemo = {}

    def shown(value: str, position: int, turn: str, kind: str = "") -> None:
        signals, _, _, read_as = found.get(value, (set(), 0, "", ""))
        if position >= recent_from:
            signals.add("recent")
        found[value] = (signals, position, turn, kind or read_as)
        turns_of.setdefault(value, set()).add(turn)

    for position, command in enumerate(commands):
        turn = str(command["id"])
        # The output without its cut, read once for the values code reads and the shapes.
        output = without_cut(str(command.get("output") or ""))
        pairs = command.get("values") or _cut_output_values(command.get("command", ""), output)
        for value, kind in list(pairs)[:per_command]:
            value = str(value).strip()
            if value:
                shown(value, position, turn, str(kind))
                found[value][0].add("read")
        for value in _shapes(output, memo):
            shown(value, position, turn)
        defined.update(_defined_names(output))
        for line in _error_lines(output):
            on_error.update(_shapes(line, memo))
        for value in _shapes(_unclipped(str(command.get("command") or "")), memo):
            written.add(value)
            turns_of.setdefault(value, set()).add(turn)
    for error in errors or []:
        for value in _shapes(str(error.get("head") or ""), memo):
            on_error.add(value)
            turns_of.setdefault(value, set()).add(str(error.get("id")))
    named: set[str] = set()
    for message in messages or []:
        for value in _shapes(str(message.get("text") or ""), memo):
            named.add(value)
            turns_of.setdefault(value, set()).add(str(message.get("id")))
    for value, (signals, _, _, _) in found.items():
        if value in written:
            signals.add("operand" if "/" in value else "command")
        if value in defined:
            signals.add("defined")
        if value in on_error:
            signals.add("error")
        if value in named:
            signals.add("user")
        turns = len(turns_of[value])
        if turns >= 2:
            signals.add("repeated")
            if turns >= 3:
                signals.add("again")
    return found


def span_values(
    commands: list[dict[str, Any]],
    per_command: int = 4,
    per_span: int = 16,
    *,
    messages: list[dict[str, Any]] | None = None,
    errors: list[dict[str, Any]] | None = None,
) -> list[dict[str, str]]:
    """The values a span's commands showed, as answer items (value, turn, what): the
    `per_span` that the span gives the most reason to expect again (`value_signals`,
    weighed by `SIGNALS`; ties: the newest), each with the newest command that shows it
    verbatim. A value another kept value holds verbatim is not named again.

    Items come weakest first, so the summary's size bound, which leaves out the oldest value
    lines first, leaves out the weakest first.
    """
    if not per_span:
        return []
    found = value_signals(commands, per_command, messages=messages, errors=errors)

    def rank(value: str) -> tuple[int, int]:
        signals, position, _, _ = found[value]
        return sum(_WEIGHT[name] for name in signals), position

    kept: list[str] = []
    for value in sorted(found, key=rank, reverse=True):
        if len(kept) >= per_span:
            break
        if any(value in other for other in kept):
            continue  # a kept value holds it verbatim
        # A value that holds kept ones verbatim names them too: it takes their place.
        kept = [other for other in kept if other not in value]
        kept.append(value)
    items = []
    for value in reversed(kept):
        signals, _, turn, read_as = found[value]
        what = read_as or next(
            (label for name, _, label in SIGNALS if label and name in signals), "shown"
        )
        items.append({"value": value, "turn": turn, "what": what})
    return items
