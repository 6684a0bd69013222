"""`command_values` against the whole-output scans it stands for (kept here as the oracle).

The fast path reads an output without a digit for commits only, finds the re.I patterns' words
in the output lower-cased (`_lowered`, non-ASCII text too when lower() keeps every character's
place and re.I's ASCII letters), and an error location from the few places its word stands.
Each must find what scanning the whole output with every pattern finds, on any output.
"""

from __future__ import annotations

import re
import sys

from hypothesis import example, given, settings
from hypothesis import strategies as st

from sessionfold.projections.ledger import values as ledger_values
from sessionfold.projections.ledger.values import command_values


def scanned_command_values(command: str, output: str) -> list[tuple[str, str]]:
    """`command_values` as its definition reads: every pattern over the whole output."""
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    output = ledger_values.without_cut(output)

    def add(value: str, what: str) -> None:
        value = value.strip()
        if value and value not in seen:
            seen.add(value)
            found.append((value, what))

    if ledger_values._WC_COMMAND.search(command):
        for line in output.splitlines():
            match = ledger_values._WC_LINE.match(line)
            if match:
                add(match.group(1), "lines, wc -l")
    for match in ledger_values._ERROR_LOCATION.finditer(output):
        add(match.group("loc"), "error location")
    for match in ledger_values._COMMIT_MADE.finditer(output):
        add(match.group("hash"), "commit made")
    if ledger_values._GIT_LOG.search(command):
        for line in output.splitlines()[:1]:
            match = ledger_values._LOG_LINE.match(line.strip())
            if match:
                add(match.group("hash"), "newest commit logged")
    for match in ledger_values._ADDRESS.finditer(output):
        add(match.group(0), "address")
    for match in ledger_values._PORT.finditer(output):
        add(match.group(0), "port")
    for match in ledger_values._TIMING.finditer(output):
        add(match.group("t"), "timing")
    for match in ledger_values._TESTS.finditer(output):
        add(match.group(0), "test total")
    return found


#: Pieces near every pattern's words: the words in several cases (and with the letters re.I
#: equates with ASCII ones that lower() does not: dotted capital I, dotless i, long s; and the
#: Kelvin sign, which lower() makes "k"), suffixes of error locations, separators with long
#: runs of spaces, ASCII and other decimal digits, hashes, addresses and non-ASCII text.
_PIECES = st.sampled_from(
    (
        "error",
        "ERROR",
        "Error",
        "errors",
        "warning",
        "WARNING",
        "warn\u0131ng",
        "WARN\u0130NG",
        "port",
        "PORT",
        "Port",
        "import",
        "took",
        "Took",
        "TOO\u212a",
        "too\u212a",
        "duration",
        "Duration:",
        "Elapsed:",
        "elap\u017fed",
        "time:",
        "Time:",
        "TIME:",
        "Done in",
        "done in",
        "Finished in",
        "Completed in",
        " passed",
        " failed",
        " skipped",
        " error",
        " errors",
        " test",
        " tests",
        "[main 1a2b3c4]",
        "[a/b (root-commit) deadbee]",
        "[",
        "\n[",
        "]",
        "localhost:8080",
        "127.0.0.1:3000",
        "0.0.0.0:80",
        "[::1]:8080",
        "[::]:9",
        "a.ts",
        "src/x.py",
        "b.ts(3,4)",
        "(3,4)",
        "(3,",
        ":12:5",
        ":7",
        ":",
        "(",
        ")",
        ",",
        "-",
        " - ",
        ": ",
        " ",
        "    ",
        " " * 40,
        "\t",
        "\n",
        "\r\n",
        "\x0b",
        "\x1c",
        "\u2028",
        "3",
        "42",
        "8080",
        "1.5",
        "ms",
        "s",
        "min",
        "3ms",
        "1.5 s",
        "\u0663",
        "\u0661\u0662",
        "\uff18\uff10",
        "é",
        "\u03a3",
        "\u0345",
        "x",
        "_",
        "@",
    )
)
_COMMANDS = st.sampled_from(("ls", "wc -l a b", "git log --oneline", "npm test", "x;wc -l"))


def _texts(pieces: int) -> st.SearchStrategy[str]:
    return st.one_of(st.lists(_PIECES, max_size=pieces).map("".join), st.text(max_size=80))


@settings(max_examples=3000)
@example("ls", "src/a.ts:12:5" + " " * 50 + "- ERROR TS2304")
@example("ls", "warn\u0131ng: x.py:1:2 warn\u0131ng")  # dotless i: re.I's, not lower()'s
@example("ls", "took \u0663\u0663s, port \u0661\u0662")  # digits that are not ASCII
@example("ls", "\u0130 a.ts(1,2): Error")  # lower() makes two characters of one
@example("git log -1", "deadbee fix\n[main abcdefa] x")  # a commit without a digit
@example("npm test", "TIME: 3s Time:\t12ms\nDone in 1.5 s, took 2m; 3 passed 1 error")
@example("ls", "serve localhost:8080 [main 1234567] x")  # an address and a commit made, gated
@given(_COMMANDS, _texts(40))
def test_command_values_finds_what_every_pattern_scanning_the_whole_output_finds(
    command: str, output: str
) -> None:
    """Property: the values of any output (with or without digits, ASCII or not) are the
    whole-output scans' values, in the same order."""
    assert command_values(command, output) == scanned_command_values(command, output)


@settings(max_examples=2000)
@given(_texts(40))
def test_each_pattern_tried_from_the_lowered_text_finds_the_scans_matches(text: str) -> None:
    """Property: each output pattern, tried where its words stand in `_lowered`'s text (or
    scanned when there is none), finds the spans a scan of every position finds."""
    lowered = ledger_values._lowered(text)
    for pattern in ledger_values._NEEDS:
        tried = [m.span() for m in ledger_values._scanned(pattern, text, lowered)]
        assert tried == [m.span() for m in pattern.finditer(text)], pattern.pattern


def test_lower_case_keeps_places_and_re_i_letters_but_for_the_fold_breakers() -> None:
    """Over every code point: lower() gives one character for each but dotted capital I, and
    an ASCII letter matches under re.I exactly the characters lower() makes it, but for the
    characters `_lowered` refuses. This is what lets a look in the lowered text stand for a
    case-insensitive scan."""
    every = "".join(chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF)
    breakers = set(ledger_values._FOLD_BREAKERS)
    assert {c for c in every if len(c.lower()) != 1} <= breakers
    for letter in "abcdefghijklmnopqrstuvwxyz":
        under_re_i = set(re.findall(letter, every, re.I)) - breakers
        assert under_re_i == {c for c in every if c.lower() == letter} - breakers, letter
    for text in ("\u0130", "a\u0131", "\u017f", "x\u0130y"):
        assert ledger_values._lowered(text) is None
    assert ledger_values._lowered("\u212a \u00e9") == "k \u00e9"


@settings(max_examples=2000)
@given(
    st.one_of(
        st.text(alphabet=st.characters(max_codepoint=127), max_size=120),
        st.lists(_PIECES, max_size=30).map("".join),
        st.text(max_size=80),
    )
)
def test_runs_split_from_ascii_text_are_the_run_patterns_matches(text: str) -> None:
    """Property: the runs of any text, split at C speed from ASCII text, are the ones the
    run pattern finds, in order."""
    runs = [word for word in ledger_values._words(text) if len(word) >= 4]
    assert runs == ledger_values._SHAPE_RUN.findall(text)


def _places(text: str, words: tuple[str, ...]) -> list[int]:
    return [at for word in words for at in range(len(text)) if text.startswith(word, at)]


_ASCII_WORDS = tuple({word for words in ledger_values._NEEDS.values() for word in words}) + (
    ledger_values._TIMING_LOWER
)


@settings(max_examples=2000)
@example("TOO\u212a 3s ERROR \u00e9 port 80")  # the Kelvin sign's lower case is an ASCII "k"
@example("\u00c9rror: x.py:1:2 err\u00f6r \u03a3 warning")
@given(
    st.one_of(
        _texts(40),
        st.lists(st.sampled_from(["\u212a", "\u00e9", "ERROR", "Took", "port ", "\u0345"])).map(
            "".join
        ),
    )
)
def test_the_ascii_lower_case_holds_every_ascii_word_where_the_lower_case_does(text: str) -> None:
    """Property: `_ascii_lowered` (non-ASCII text encoded with "?" for each other character,
    then lowered) refuses what `_lowered` refuses, and holds every word command_values looks
    for at the places `_lowered`'s text holds it."""
    lowered = ledger_values._lowered(text)
    fast = ledger_values._ascii_lowered(text)
    assert (fast is None) == (lowered is None)
    if fast is not None and lowered is not None:
        assert len(fast) == len(text)
        assert _places(fast, _ASCII_WORDS) == _places(lowered, _ASCII_WORDS)


def test_only_the_kelvin_sign_and_dotted_capital_i_lower_case_to_ascii() -> None:
    """Over every non-ASCII code point: the ones whose lower case holds an ASCII character
    are the Kelvin sign, which `_ascii_lowered` lowers in full, and dotted capital I, a fold
    breaker; every other one is a "?" there, as it holds no ASCII word in the lower case."""
    found = {
        chr(c)
        for c in range(0x80, sys.maxunicode + 1)
        if not 0xD800 <= c <= 0xDFFF and any(ord(x) < 128 for x in chr(c).lower())
    }
    assert found == {"\u212a", "\u0130"}
    assert "\u0130" in ledger_values._FOLD_BREAKERS


@settings(max_examples=2000)
@example("")
@example("\u0663")  # a decimal digit that is not ASCII
@example("abc 9")
@given(st.one_of(st.text(max_size=60), st.text(alphabet="ab 09\u0663\u00e9", max_size=20)))
def test_a_digit_is_found_where_the_digit_pattern_finds_one(text: str) -> None:
    """Property: `_has_digit` (ten looks in ASCII text) answers as `_DIGIT.search` does."""
    assert ledger_values._has_digit(text) == (ledger_values._DIGIT.search(text) is not None)


@settings(max_examples=2000)
@example("src/a.ts \u2500\u2500 fooBar \u2026 x_y")  # marks and box drawing: split as ASCII
@example("caf\u00e9Bar/x.ts")  # a letter outside ASCII: through the regex
@example("n\u0663\u0663\u0663 \u2713 abcd")  # a digit outside ASCII
@given(
    st.one_of(
        st.text(alphabet="ab/_.X9 -\u2500\u2026\u2713\u00e9\u0663\u01c5\u00a0\u3000", max_size=60),
        st.text(max_size=80),
    )
)
def test_the_words_split_from_a_text_hold_its_runs_and_only_shorter_words_between(
    text: str,
) -> None:
    """Property: `_words` gives the run pattern's matches in order, and any other word it
    gives is shorter than a run (so shows no value)."""
    words = ledger_values._words(text)
    assert [w for w in words if len(w) >= 4] == ledger_values._SHAPE_RUN.findall(text)
    assert all(ledger_values._run_values(w) == () for w in words if len(w) < 4)
