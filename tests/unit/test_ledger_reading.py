"""The standing-region memo the pass context and the offline model share."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionfold.events.envelope import CompactRequestEnvelope, LedgerRequestEnvelope
from sessionfold.events.ledger import read_ledger_request
from sessionfold.ports.ledger import reading
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.ports.ledger.pass_ import run_pass
from sessionfold.projections.ledger.heuristics import standing_region, standing_sentences
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.runtime.embedded import EmbeddedRuntime
from sessionfold.streams.tools.synthetic import generate_session, write_session

#: Pieces of user messages: rule words, withdrawals, questions, fences and quotes, breaks.
_PIECES = st.sampled_from(
    (
        "never push to main",
        "always run the linter",
        "from now on, answer in English",
        "forget it",
        "can you check?",
        "the only way",
        "```\nnever do this\n```",
        "> always quote me",
        '"never ever use the old config file, it is gone"',
        ". ",
        "\n",
        " ",
        "ok",
        "x" * 200,
    )
)


@given(st.lists(_PIECES, max_size=12).map("".join), st.integers(0, 700), st.integers(0, 900))
def test_the_memo_reads_what_the_heuristics_read(text: str, whole: int, words: int) -> None:
    """Property: the memo's region is `standing_region`'s, the first time and the next, and
    it is None exactly when no standing sentence is found (what the offline model asks)."""
    expected = standing_region(text, whole, words)
    assert reading.standing_region_of(text, whole, words) == expected
    assert reading.standing_region_of(text, whole, words) == expected
    assert (expected is None) == (not standing_sentences(text))


def test_a_text_is_read_once_and_a_long_one_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A short text read again is the memo's; one over `CACHED_CHARS` is not kept."""
    reads: list[int] = []

    def counted(text: str, whole: int, words: int) -> tuple[int, int] | None:
        reads.append(len(text))
        return standing_region(text, whole, words)

    monkeypatch.setattr(reading, "standing_region", counted)
    reading._cached.cache_clear()
    short = "never push to main on a Friday"
    long = "always run the linter. " * (reading.CACHED_CHARS // 20)
    for _ in range(3):
        reading.standing_region_of(short)
        reading.standing_region_of(long)
    assert reads == [len(short), len(long), len(long), len(long)]


def test_the_offline_labels_read_each_message_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The offline model reads a message's standing region once for its label and its words
    (it read the sentences, then the region, before)."""
    reads: list[str] = []

    def counted(text: str, whole: int, words: int) -> tuple[int, int] | None:
        reads.append(text)
        return standing_region(text, whole, words)

    monkeypatch.setattr(reading, "standing_region", counted)
    reading._cached.cache_clear()
    long_rule = "Please look at the build. " * 20 + "Never push to main without a review."
    prompt = {
        "messages": [
            {"id": "u1", "text": long_rule, "excerpt": long_rule[:240]},
            {"id": "u2", "text": "thanks, looks good", "excerpt": "thanks, looks good"},
        ],
        "rules": [],
        "commands": [],
    }
    labels = OfflineModel().diff(prompt)["labels"]
    assert labels[0]["label"] == "rule"
    assert labels[0]["words"] == "Never push to main without a review."
    assert labels[1]["label"] == "not a rule"
    assert reads == [long_rule, "thanks, looks good"]


def test_a_pass_starts_with_an_empty_memo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing read in one pass is kept for the next: the same request answered twice reads
    its messages twice (a run of folds reads what one fold does)."""
    runtime = EmbeddedRuntime()
    for record in read_session_file(write_session(tmp_path, generate_session(7, 40)).path):
        runtime.publish(record)
    last = max(e.seq for e in runtime.log["session-events"] if not isinstance(e, DeadLetter))
    runtime.publish(CompactRequestEnvelope(session_id=runtime.sessions()[0], seq=last + 1))
    envelope = next(
        e for e in runtime.log["flush-requests"] if isinstance(e, LedgerRequestEnvelope)
    )
    reads: list[str] = []

    def counted(text: str, whole: int, words: int) -> tuple[int, int] | None:
        reads.append(text)
        return standing_region(text, whole, words)

    monkeypatch.setattr(reading, "standing_region", counted)
    run_pass(read_ledger_request(envelope), OfflineModel())
    first = list(reads)
    run_pass(read_ledger_request(envelope), OfflineModel())
    assert first and reads == first * 2
