"""The offline reading: standing rules clause by clause, withdrawals, the lift check, labels."""

from __future__ import annotations

import pytest

from sessionfold.ports.ledger.model import DiffModel, OfflineModel
from sessionfold.projections.ledger.heuristics import reads_as_rule, sentences
from sessionfold.projections.ledger.rules import judged_text, lift_check, withdraws
from sessionfold.projections.ledger.text import (
    at_word_boundaries,
    quotable_regions,
    sanitize,
)


@pytest.mark.parametrize(
    "text",
    [
        "never add dependencies",
        "the code must run on Node 22.11",
        "every dry-run line must start with DRY:",
        "from now on, answer in English",
        "going forward we write the tests first",
        "from here on use pnpm",
        "never deploy on a Friday, not even this time",
        "never push to main, ok?",
        "always run the linter before you commit",
        "stop adding comments to every line",
        "i would only want e2e tests for AgentSession",
        "don't forget it",
        "Do not touch the generated files.",
    ],
)
def test_reads_as_a_standing_rule(text: str) -> None:
    """Rule words and 'from now on' make a standing rule."""
    assert reads_as_rule(text)


@pytest.mark.parametrize(
    "text",
    [
        "don't push yet",
        "skip the slow tests, don't run them for now",
        "don't run the e2e suite this time",
        "forget it",
        "never mind, it works",
        "add an option that keeps only lines matching the pattern",
        "should we never cache these?",
        "from now on the DRY: rule no longer applies",
        "you may push to main now",
        "there's only one file left to fix",
        "I don't think that works",
        "that is what happens if we don't stream, right?",
        "tests go under tests/",
    ],
)
def test_does_not_read_as_a_standing_rule(text: str) -> None:
    """Requests for now, withdrawals, questions and descriptions are no rules to the heuristic."""
    assert not reads_as_rule(text)


def test_sentences_split_at_terminators_and_lines_not_inside_words() -> None:
    """README.md stays one word; a line break ends a sentence."""
    text = "README.md is fine. Never push!\nok"
    assert [text[a:b] for a, b in sentences(text)] == ["README.md is fine.", "Never push!", "ok"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("the DRY: prefix rule is lifted", True),
        ("tabs no longer matter", True),
        ("that rule doesn't apply here", True),
        ("use spaces instead of tabs", True),
        ("forget the rule about tabs", True),
        ("don't forget the tests", False),
        ("you may push to main now", False),
        ("please use tabs", False),
    ],
)
def test_withdrawal_words(text: str, expected: bool) -> None:
    """Only words that withdraw something count as a withdrawal."""
    assert withdraws(text) is expected


def test_lift_check_needs_a_withdrawal_and_a_shared_word() -> None:
    """Both halves of the lift check are required."""
    rule = "never use tabs in python files"
    assert lift_check("the tabs rule no longer applies", rule)
    assert not lift_check("the tabs look fine", rule)
    assert not lift_check("that rule no longer applies", rule)


def test_judged_text_leaves_out_long_quotes_blockquotes_and_fences() -> None:
    """Six quoted words or more, '>' lines and fences go; short quotes stay."""
    text = (
        'he said "this is a long quoted passage of words" and “tabs” stay\n'
        "> a quoted line\n```\ncode here\n```\nend"
    )
    judged = judged_text(text)
    assert "long quoted passage" not in judged and "a quoted line" not in judged
    assert "code here" not in judged and "“tabs” stay" in judged and "end" in judged


def test_goal_regions_and_word_boundaries() -> None:
    """A /goal message quotes only its objective; boundaries reject cuts inside words."""
    text = "<goal> ship it </goal>\ntemplate text"
    assert [text[a:b] for a, b in quotable_regions(text)] == ["ship it"]
    command = "/goal ship it"
    assert [command[a:b] for a, b in quotable_regions(command)] == ["ship it"]
    assert at_word_boundaries("never push", 0, 5) and not at_word_boundaries("never push", 1, 5)


def test_sanitize_keeps_no_control_characters() -> None:
    """Escape sequences, C1 controls and bidi overrides never survive the sanitizer."""
    dirty = "a\x1b[31mred\x07\x9b\u202eb\tc\nd"
    clean = sanitize(dirty, newlines=False)
    assert not any(ord(ch) < 32 or 0x7F <= ord(ch) <= 0x9F for ch in clean)
    assert "\u202e" not in clean and "↵" in clean


def _prompt(messages: list[str], rules: list[tuple[str, str]]) -> dict:
    return {
        "span": 1,
        "messages": [
            {"id": f"u{i}", "text": t, "excerpt": t[:240], "chars": len(t)}
            for i, t in enumerate(messages, start=1)
        ],
        "rules": [{"id": rid, "from": "u0", "words": words} for rid, words in rules],
        "commands": [],
        "errors": [],
    }


def test_offline_model_labels_rules_lifts_and_replacements() -> None:
    """The offline model labels by the heuristic reading and names what a withdrawal lifts."""
    model = OfflineModel()
    assert isinstance(model, DiffModel)
    answer = model.diff(
        _prompt(
            [
                "the tabs rule no longer applies",
                "never add dependencies",
                "switch to two-space indentation instead of tabs from now on",
                "thanks",
                "the dependencies rule is lifted",
            ],
            [("R1", "never use tabs"), ("R2", "indent with tabs")],
        )
    )
    assert [item["label"] for item in answer["labels"]] == [
        "lifts R2",
        "rule",
        "rule and lifts R1",
        "not a rule",
        "lifts u2",
    ]
    assert answer["narrative"] and answer["now"].startswith("Last user request (u5)")


def test_offline_model_gives_exact_words_for_long_messages() -> None:
    """Over 300 characters the offline model quotes its rule sentences, verbatim."""
    text = "Some context first. " * 10 + "Never commit secrets. " + "More context. " * 10
    [label] = OfflineModel().diff(_prompt([text], []))["labels"]
    assert label == {"message": "u1", "label": "rule", "words": "Never commit secrets."}
    assert label["words"] in text
