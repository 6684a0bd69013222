"""`rule_sentences` against its reading of every sentence (kept here as the oracle).

A text (and then a sentence) whose lower case holds none of the rule words' anchors is not
read sentence by sentence: no rule word or "from now on" can match in it. Every text must
read as the full reading reads it.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from sessionfold.projections.ledger import heuristics
from sessionfold.projections.ledger.text import Region


def read_rule_sentences(text: str) -> list[Region]:
    """`heuristics.rule_sentences` as it read every sentence, with no look for anchors."""
    found: list[Region] = []
    for start, end in heuristics.sentences(text):
        sentence = text[start:end]
        if heuristics.is_question(sentence):
            continue
        body = heuristics._TAG_QUESTION.sub("", sentence)
        says_from_now = bool(heuristics._FROM_NOW.search(body)) and not (
            heuristics.withdraws_itself(body)
        )
        if says_from_now or any(
            heuristics._rule_clause(clause) for clause in heuristics.clauses(body)
        ):
            found.append((start, end))
    return found


#: Rule words and "from now on" in several cases and spacings (with the letters re.I equates
#: with ASCII ones that lower() does not, and the Kelvin sign), withdrawals, requests for now,
#: descriptions, opinions, tag questions, terminators, clause breaks and plain words.
_PIECES = st.sampled_from(
    (
        "never",
        "NEVER",
        "Never",
        "always",
        "ALWAYS",
        "don't",
        "Don\u2019t",
        "dont",
        "do not",
        "DO\tNOT",
        "do  not",
        "must",
        "MUST",
        "mu\u017ft",
        "stop",
        "Stop",
        "only",
        "ONLY",
        "from now on",
        "From Now On",
        "from\nnow on",
        "from here on",
        "going forward",
        "Go\u0130ng forward",
        "go\u0131ng forward",
        "never mind",
        "forget it",
        "don't forget it",
        "no longer",
        "lifted",
        "for now",
        "yet",
        "this time",
        "an option that keeps",
        "the only",
        "only one",
        "I don't think",
        ", ok?",
        " right?",
        "?",
        ".",
        "!",
        "\u2026",
        ",",
        ";",
        " - ",
        " but ",
        "(",
        ")",
        " ",
        "\n",
        "deploy",
        "tabs",
        "use",
        "\u212a",
        "\u00e9",
        "x",
    )
)


@settings(max_examples=3000)
@example("Do not push.")
@example("From now on, use tabs")
@example("mu\u017ft use tabs")  # long s: re.I reads "must"
@example("Never mind. Stop it? ok")
@given(st.one_of(st.lists(_PIECES, max_size=30).map("".join), st.text(max_size=80)))
def test_rule_sentences_read_as_every_sentence_read_in_full(text: str) -> None:
    """Property: the sentences read as rules are the full reading's, for any text."""
    assert heuristics.rule_sentences(text) == read_rule_sentences(text)
