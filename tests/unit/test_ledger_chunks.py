"""A span too large for one diff call: up to four chunks, each verified on the ones before."""

from __future__ import annotations

from typing import Any

from test_ledger_verify import Scripted, Session, labels

from sessionfold.ports.ledger.context import PassContext
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.ports.ledger.pass_ import run_pass
from sessionfold.ports.ledger.prompt import prompt_text
from sessionfold.projections.ledger.config import LedgerConfig

# Each message below is about 100 characters with its overhead: 250 fits two or three.
SMALL = LedgerConfig(chunk_chars=250)
TWO = LedgerConfig(chunk_chars=400)
FILLER = "please look at the parser module and tell me what you see there"


def run(session: Session, model: Any, config: LedgerConfig = SMALL) -> dict[str, Any]:
    """Run a pass with `config` and fold its payload."""
    payload = run_pass(session.request(), model, config)
    session.fold.apply_pass(payload)
    return payload


def ids(prompt: dict[str, Any]) -> list[str]:
    """The message ids a prompt asks about."""
    return [m["id"] for m in prompt["messages"]]


def test_a_span_that_fits_is_one_call_without_chunk_marks() -> None:
    """Below the size, one call and no chunk field; the record says one chunk."""
    session = Session()
    session.users("never push to main", "thanks")
    model = Scripted(labels(("u1", "rule"), ("u2", "not a rule")))
    payload = run(session, model, LedgerConfig())
    assert len(model.prompts) == 1 and "chunk" not in model.prompts[0]
    assert payload["record"]["chunks"] == 1 and payload["record"]["missing"] == []


def test_a_large_span_is_split_in_order_and_each_chunk_sees_its_own_commands() -> None:
    """Messages are split contiguously; a chunk's prompt holds the commands up to its end."""
    session = Session()
    session.users("never push to main", FILLER)
    session.bash("ls", "a.txt")
    session.users(FILLER, FILLER)
    session.bash("make", "built")
    session.users(FILLER)
    model = OfflineModel()
    prompts: list[dict[str, Any]] = []

    class Recording:
        name = "offline"

        def diff(self, prompt: dict[str, Any]) -> dict[str, Any]:
            prompts.append(prompt)
            return model.diff(prompt)

    payload = run(session, Recording())
    assert len(prompts) == payload["record"]["chunks"] > 1
    assert [p["chunk"]["index"] for p in prompts] == list(range(1, len(prompts) + 1))
    assert [m for p in prompts for m in ids(p)] == ["u1", "u2", "u3", "u4", "u5"]
    shown = [c["id"] for p in prompts for c in p["commands"]]
    assert shown == ["C1", "C2"]  # each command in exactly one chunk
    assert "part 1 of" in prompt_text(prompts[0])
    assert [r["words"] for r in session.state()["rules"]] == ["never push to main"]


def test_never_more_than_four_chunks() -> None:
    """However large the span, at most four calls' worth of chunks."""
    session = Session()
    session.users(*[f"{FILLER} {n}" for n in range(20)])
    request = session.request()
    views = PassContext.from_request(request).chunks(100, 4)
    assert len(views) == 4
    assert sum(len(v.messages) for v in views) == 20
    assert all(v.messages for v in views)
    assert [v.chunk for v in views] == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_a_later_chunk_lifts_a_rule_an_earlier_chunk_gave_by_its_u_id() -> None:
    """u1's rule (chunk 1) is shown to chunk 2 as u1, and `lifts u1` there is applied."""
    session = Session()
    session.users("never use tabs in python files", FILLER, FILLER)
    session.users("the tabs rule no longer applies", FILLER)
    model = OfflineModel()
    prompts: list[dict[str, Any]] = []

    class Recording:
        name = "offline"

        def diff(self, prompt: dict[str, Any]) -> dict[str, Any]:
            prompts.append(prompt)
            return model.diff(prompt)

    run(session, Recording())
    later = next(p for p in prompts if "u4" in ids(p))
    assert {"id": "u1", "from": "u1", "words": "never use tabs in python files"} in later["rules"]
    [rule] = session.state()["rules"]
    assert rule["lifted"]["by"] == "u4"


def test_a_chunk_that_never_verifies_is_carried_whole() -> None:
    """Chunk 2 fails twice: the others' rules stand, chunk 2's messages are all carried."""
    session = Session()
    session.users("never push to main", FILLER, FILLER, FILLER, "always run the tests", FILLER)
    request = session.request()
    views = PassContext.from_request(request).chunks(SMALL.chunk_chars, SMALL.max_chunks)
    groups = [list(v.messages) for v in views]
    assert len(groups) >= 3 and "u1" not in groups[1] and "u5" not in groups[1]
    script: list[Any] = []
    for index, group in enumerate(groups, start=1):
        if index == 2:
            script += [RuntimeError("down"), RuntimeError("down")]
        else:
            script.append(
                labels(*[(m, "rule" if m in ("u1", "u5") else "not a rule") for m in group])
            )
    model = Scripted(*script)
    second = groups[1]
    payload = run_pass(request, model, SMALL)
    session.fold.apply_pass(payload)
    record = payload["record"]
    assert (record["chunks"], record["missing"], record["narrativeKind"]) == (
        len(groups),
        [2],
        "model",
    )
    assert record["carried"] == second
    assert record["reason"] == "model-error:RuntimeError"
    assert f"chunk 2 of {len(groups)} missing" in record["narrative"]
    assert [r["words"] for r in session.state()["rules"]] == [
        "never push to main",
        "always run the tests",
    ]
    session.users("next")
    assert [m["id"] for m in session.request()["offered"]] == [*second, "u7"]


def test_every_chunk_failing_closes_narrative_less() -> None:
    """No chunk verifies: the span closes narrative-less and every message is carried."""
    session = Session()
    session.users("never push to main", FILLER, FILLER, FILLER)
    model = Scripted(*[RuntimeError("down")] * 8)
    payload = run(session, model)
    record = payload["record"]
    assert record["narrativeKind"] == "narrative-less"
    assert record["carried"] == ["u1", "u2", "u3", "u4"]
    assert session.state()["rules"] == []


def test_each_chunk_gets_its_own_retry_and_question() -> None:
    """A defect costs a retry within its chunk; a lift question is asked once per chunk."""
    session = Session()
    session.with_rules("never use tabs in python files", "always run the linter first")
    session.users("thanks, the tabs look fine", FILLER, FILLER)
    session.users("the linter is great", FILLER)
    request = session.request()
    views = PassContext.from_request(request).chunks(TWO.chunk_chars, TWO.max_chunks)
    first, second = (list(v.messages) for v in views)
    assert first[0] == "u3" and "u6" in second
    model = Scripted(
        labels(*[(m, "lifts R1" if m == "u3" else "not a rule") for m in first[:-1]]),
        labels(*[(m, "lifts R1" if m == "u3" else "not a rule") for m in first]),
        labels(("u3", "not a rule")),
        labels(*[(m, "lifts R2" if m == "u6" else "not a rule") for m in second]),
        labels(("u6", "not a rule")),
    )
    payload = run_pass(request, model, TWO)
    assert [bool(p.get("retryNote")) for p in model.prompts] == [False, True, False, False, False]
    assert [bool(p.get("questions")) for p in model.prompts] == [False, False, True, False, True]
    assert payload["record"]["dropped"]["lift-unplaced"] == 2
