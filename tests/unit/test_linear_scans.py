"""Every scan of an entry's text is linear in its size (issue #10, item 1).

Each scan that was quadratic (a regex that retried every start of a long line, a prefix
searched again for every match) is checked twice here: on a pathological input of 200,000
characters it finishes well inside a timeout (before the fix it took minutes), and on short
random inputs it returns exactly what the old code returned. The old code is kept below as
the oracle: on short inputs it is fast enough.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionfold.projections.ledger import facts, heuristics, rules, text, values
from sessionfold.projections.ledger.facts import values_in
from sessionfold.projections.pruning import context_metrics as metrics

BIG = 200_000

# --- the old code, the oracle ------------------------------------------------------------------

OLD_CUT = re.compile(r"[^\n]* … [^\n]*")
OLD_WC_LINE = re.compile(r"^\s*(\d+\s+\S.*?)\s*$")
OLD_QUOTED = re.compile(
    r'"(?:[^"\n]|\n(?![ \t]*\n))*"|“[^”]*”|„[^“”]*[“”]|«[^»]*»|»[^«]*«|`[^`\n]+`'
)
OLD_NEGATED_BEFORE = re.compile(r"\b(?:don['’]?t|do\s+not|never)\s+$", re.I)
OLD_NOT_RULE_ONLY = re.compile(r"\b(?:the|not|if|my|our|your|an?|there['’]?s|is|are)\s+$", re.I)
OLD_TAG_QUESTION = re.compile(
    r"[,\s]*\b(?:ok|okay|alright|all\s+right|got\s+it|understood|capisce)\s*\?+\s*$", re.I
)
OLD_CLAUSE_BREAK = re.compile(r"[,;:()]\s*|\s+[-–—]+\s+|\s+but\s+", re.I)
OLD_GOAL_TAG = re.compile(r"<(goal|objective)\b[^>]*>(.*?)</\1\s*>", re.S | re.I)
OLD_FACT_PATH = re.compile(
    r"(?<![\w.@/-])(?:~|\.{1,2})?/(?:[\w.@+-]+/)*[\w.@+-]+|\b[\w.@-]+(?:/[\w.@-]+)+\.\w+\b"
)


def old_command_values(command: str, output: str) -> list[tuple[str, str]]:
    """`values.command_values` as it was: the old cut and a list scan for repeats."""
    found: list[tuple[str, str]] = []
    output = OLD_CUT.sub("", output, count=1)

    def add(value: str, what: str) -> None:
        value = value.strip()
        if value and all(value != v for v, _ in found):
            found.append((value, what))

    if re.search(r"(?:^|[\s;&|])wc\s+-l\b", command):
        for line in output.splitlines():
            match = OLD_WC_LINE.match(line)
            if match:
                add(match.group(1), "lines, wc -l")
    for match in values._ERROR_LOCATION.finditer(output):
        add(match.group("loc"), "error location")
    for match in values._COMMIT_MADE.finditer(output):
        add(match.group("hash"), "commit made")
    if values._GIT_LOG.search(command):
        for line in output.splitlines()[:1]:
            match = values._LOG_LINE.match(line.strip())
            if match:
                add(match.group("hash"), "newest commit logged")
    for pattern, what in (
        (values._ADDRESS, "address"),
        (values._PORT, "port"),
    ):
        for match in pattern.finditer(output):
            add(match.group(0), what)
    for match in values._TIMING.finditer(output):
        add(match.group("t"), "timing")
    for match in values._TESTS.finditer(output):
        add(match.group(0), "test total")
    return found


def old_withdraws_itself(clause: str) -> bool:
    if heuristics._NEVER_MIND.search(clause) or heuristics._WITHDRAWS.search(clause):
        return True
    return any(
        not OLD_NEGATED_BEFORE.search(clause[: m.start()])
        for m in heuristics._FORGET_IT.finditer(clause)
    )


def old_rule_clause(clause: str) -> bool:
    if heuristics._FOR_NOW.search(clause) or old_withdraws_itself(clause):
        return False
    for match in heuristics._RULE_WORD.finditer(clause):
        before = clause[: match.start()]
        if heuristics._DESCRIBING.search(before):
            continue
        if match.group(0).lower() == "only" and (
            OLD_NOT_RULE_ONLY.search(before) or heuristics._ONLY_COUNTING.match(clause, match.end())
        ):
            continue
        if any(o.start() <= match.start() < o.end() for o in heuristics._OPINION.finditer(clause)):
            continue
        return True
    return False


def old_withdraws(judged: str) -> bool:
    for match in rules._WITHDRAWAL.finditer(judged):
        if match.group(0).lower().startswith("forget") and OLD_NEGATED_BEFORE.search(
            judged[: match.start()]
        ):
            continue
        return True
    return False


def old_standing_sentences(message: str) -> list[tuple[int, int]]:
    found = []
    for start, end in text.quotable_regions(message):
        region = message[start:end]
        removed = rules.removed_spans(region)
        for a, b in heuristics.rule_sentences(region):
            if any(r0 < b and a < r1 for r0, r1 in removed):
                continue
            found.append((start + a, start + b))
    return found


# --- short random inputs ---------------------------------------------------------------------

# Pieces the patterns turn on, so that short random texts hit them often.
PIECES = [
    *"abcxyzAZ019 ,;:()-–—.?!…\n\t'’\"“”„«»`<>/_@~+#",
    "  ",
    "\n\n",
    " \t\n",
    " … ",
    "never",
    "Never",
    "don't",
    "don’t",
    "dont",
    "DO",
    "do",
    "not",
    "NOT",
    "forget",
    " it",
    " that",
    "the",
    "only",
    "one",
    "a",
    "an",
    "thing",
    "that",
    "which",
    "I",
    "we",
    "think",
    "ok",
    "okay",
    "got it",
    "all right",
    "but",
    "must",
    "always",
    "stop",
    "from now on",
    "for now",
    "no longer",
    "lifted",
    "<goal>",
    "<goal x>",
    "<Goal",
    "<objective>",
    "</goal>",
    "</GOAL >",
    "</objective>",
    "```",
    "~~~",
    "> ",
    "wc",
    "12",
    "src/a.ts",
    "f.ts:1:2 error",
    "port 8080",
    "localhost:3000",
    "3 passed",
    "took 2s",
    "[main 3f9a2c1]",
    "a.b",
    "x/y",
    "../",
    "~/",
    "e9f6de7",
]
texts = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)
SETTINGS = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(texts)
def test_the_cut_line_goes_as_the_old_pattern_took_it(sample: str) -> None:
    """`without_cut` removes what `[^\\n]* … [^\\n]*` (first match) removed."""
    assert values.without_cut(sample) == OLD_CUT.sub("", sample, count=1)


@SETTINGS
@given(texts)
def test_wc_lines_read_as_before(sample: str) -> None:
    """Each line's `wc -l` reading is the old pattern's."""
    for line in sample.splitlines():
        old, new = OLD_WC_LINE.match(line), values._WC_LINE.match(line)
        assert (old and old.group(1)) == (new and new.group(1))


@SETTINGS
@given(texts, st.sampled_from(["wc -l x", "git log -3", "npm test", "wc -l a; git log"]))
def test_command_values_are_the_old_ones(sample: str, command: str) -> None:
    """Every (value, what) pair, in order, is the one the old code read."""
    assert values.command_values(command, sample) == old_command_values(command, sample)


@SETTINGS
@given(texts)
def test_quoted_passages_are_the_old_patterns_matches(sample: str) -> None:
    """`quoted_passages` finds the spans the old quoted-passage pattern found."""
    expected = [(m.start(), m.end()) for m in OLD_QUOTED.finditer(sample)]
    assert rules.quoted_passages(sample) == expected


@SETTINGS
@given(texts)
def test_negation_and_only_words_read_back_as_the_old_searches(sample: str) -> None:
    """At every offset, the read-back checks say what the old prefix searches said."""
    for end in range(len(sample) + 1):
        prefix = sample[:end]
        assert rules.negated_before(sample, end) == bool(OLD_NEGATED_BEFORE.search(prefix))
        assert rules.ends_in_word(
            sample, end, heuristics._NOT_RULE_ONLY, heuristics._NOT_RULE_ONLY_LENGTHS
        ) == bool(OLD_NOT_RULE_ONLY.search(prefix))


@SETTINGS
@given(texts)
def test_tag_questions_and_clause_breaks_match_as_before(sample: str) -> None:
    """The anchored tag-question and clause-break patterns cut where the old ones did."""
    assert heuristics._TAG_QUESTION.sub("", sample) == OLD_TAG_QUESTION.sub("", sample)
    assert heuristics._CLAUSE_BREAK.split(sample) == OLD_CLAUSE_BREAK.split(sample)


@SETTINGS
@given(texts)
def test_rule_reading_is_unchanged(sample: str) -> None:
    """Clauses, withdrawals and standing sentences read as the old code read them."""
    assert heuristics._rule_clause(sample) == old_rule_clause(sample)
    assert heuristics.withdraws_itself(sample) == old_withdraws_itself(sample)
    assert rules.withdraws(sample) == old_withdraws(sample)
    assert heuristics.standing_sentences(sample) == old_standing_sentences(sample)


@SETTINGS
@given(texts)
def test_goal_objectives_are_the_old_patterns_groups(sample: str) -> None:
    """`goal_objectives` finds the objectives (second groups) the old goal-tag pattern found."""
    expected = [(m.start(2), m.end(2)) for m in OLD_GOAL_TAG.finditer(sample)]
    assert text.goal_objectives(sample) == expected


def test_goal_tag_names_compare_as_a_back_reference_does() -> None:
    """A closing tag of another case closes, one of another name does not."""
    for sample, objectives in (
        ("<Goal>x</gOAL>", ["x"]),
        ("<goal>x</objective> <objective a=1>y</OBJECTIVE >", ["y"]),
        ("<goal>x", []),
        ("<goal <goal>x</goal>", ["x"]),
    ):
        found = text.goal_objectives(sample)
        assert [sample[a:b] for a, b in found] == objectives
        assert found == [(m.start(2), m.end(2)) for m in OLD_GOAL_TAG.finditer(sample)]


@SETTINGS
@given(texts)
def test_fact_values_are_the_old_patterns_values(sample: str) -> None:
    """`facts.values_in` finds the values the old path pattern (and the others) found."""
    expected: set[str] = set()
    for pattern in (OLD_FACT_PATH, *facts._PATTERNS[1:]):
        for match in pattern.finditer(sample):
            value = match.group(0).rstrip(".:,")
            if len(value) >= 3 and value not in ("/", "./", "../"):
                expected.add(value)
    assert values_in(sample) == expected


globs = st.lists(
    st.sampled_from(["**/", "**", "*", "?", "a", "b", "/", ".", "skills", ".md"]), max_size=8
).map("".join)
paths = st.lists(
    st.sampled_from(["a", "b", "/", ".", "skills", "x", ".md", "\n"]), max_size=24
).map("".join)


@SETTINGS
@given(st.lists(globs, min_size=1, max_size=3), paths)
def test_glob_machines_match_as_the_glob_regex_does(patterns: list[str], path: str) -> None:
    """A long path's glob machines say what the globs' regex says of it."""
    regex = metrics._globs(tuple(patterns))
    machines = any(metrics._machine(glob).matches(path) for glob in patterns)
    assert machines == (regex.fullmatch(path) is not None)


# --- pathological inputs at 200 K characters ----------------------------------------------------


def repeat(unit: str, size: int = BIG) -> str:
    """`unit` repeated to exactly `size` characters, one line unless the unit has a newline."""
    return (unit * (size // len(unit) + 1))[:size]


PATHOLOGICAL: list[tuple[str, Any]] = [
    ("cut, one long line", lambda: values.without_cut(repeat("x"))),
    (
        "command values, one long line",
        lambda: values.command_values("wc -l x; git log", repeat("a f.ts:1:2 error  ")),
    ),
    (
        "command values, many distinct values",
        lambda: values.command_values(
            "pytest", "".join(f"{n} passed port {n % 60000} " for n in range(BIG // 24))
        ),
    ),
    ("wc -l line of spaces", lambda: values.command_values("wc -l", "1 a" + " " * BIG + "b")),
    (
        "value signals of a long output",
        lambda: values.value_signals(
            [{"id": "C1", "command": "cat x", "output": repeat("a.b/c " + "x" * 50)}]
        ),
    ),
    ("curly quotes left open", lambda: rules.removed_spans(repeat("“ x "))),
    ("guillemets left open", lambda: rules.removed_spans(repeat("« x ") + repeat("» y "))),
    ("backticks", lambda: rules.removed_spans(repeat("` x"))),
    ("straight quotes over blank lines", lambda: rules.removed_spans(repeat('" x\n\n'))),
    ("negated forgets", lambda: rules.withdraws(repeat("don't forget the "))),
    ("negated forget-its", lambda: heuristics.withdraws_itself(repeat("don't forget it "))),
    ("described rule words", lambda: heuristics._rule_clause("a thing that " + repeat("never "))),
    ("the only", lambda: heuristics._rule_clause(repeat("the only "))),
    ("opinions", lambda: heuristics._rule_clause(repeat("I don't think "))),
    ("a run of spaces in a clause", lambda: heuristics.clauses("a" + " " * BIG + "b")),
    ("a run of commas before ok?", lambda: heuristics.is_question("a" + ", " * (BIG // 2))),
    (
        "standing sentences among quotes",
        lambda: heuristics.standing_sentences(repeat('never do x. "a b c d e f" ')),
    ),
    ("goal tags left open", lambda: text.quotable_regions(repeat("<goal>"))),
    ("goal tags without >", lambda: text.quotable_regions(repeat("<goal "))),
    ("goal tags of many names", lambda: text.quotable_regions(repeat("<goal>x</objective>"))),
    (
        "a protected-path glob over skills/skills/...",
        lambda: metrics.DEFAULT_PROTECTION.protects("read", repeat("skills/") + "x.txt"),
    ),
    ("fact paths a.a.a", lambda: values_in(repeat("a."))),
    ("fact paths a/a/a", lambda: values_in(repeat("a/"))),
    ("fact paths a.b/", lambda: values_in(repeat("a.b/"))),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("name", "run"), PATHOLOGICAL, ids=[name for name, _ in PATHOLOGICAL])
def test_a_pathological_input_of_200k_characters_finishes(name: str, run: Any) -> None:
    """Each fixed scan finishes a 200 K pathological input in well under its timeout."""
    run()
