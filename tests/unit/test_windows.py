"""Tool windows, turn gates and capture (projections/pruning/windows.py), one message at a time."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from pruning_session import assistant, driver, result, user

from sessionfold.projections.pruning import message_facts, windows


def test_a_turn_without_tool_calls_ends_with_its_message() -> None:
    """A final text reply ends its turn at once and leaves the turn gate open for evaluation."""
    d = driver()
    session = d.session
    assert not d.add(session, user())
    assert not windows.gate_open(session)
    assert d.add(session, assistant())
    assert windows.gate_open(session)


def test_a_turn_ends_when_every_call_has_its_result() -> None:
    """The turn of an assistant with two calls ends at the second result, not the first."""
    d = driver()
    session = d.session
    d.add(session, user())
    assert not d.add(session, assistant("c1", "c2"))
    assert not d.add(session, result("c2"))
    assert d.add(session, result("c1"))


def test_an_errored_or_aborted_turn_ends_at_once() -> None:
    """pi ends an errored or aborted assistant's turn without tool results."""
    for stop in ("error", "aborted"):
        d = driver()
        session = d.session
        d.add(session, user())
        assert d.add(session, assistant("c1", stop=stop))


def test_a_result_for_no_call_of_the_latest_assistant_is_not_paired() -> None:
    """A result whose id the latest assistant did not call ends nothing and captures nothing."""
    d = driver()
    session = d.session
    d.add(session, user())
    d.add(session, assistant("c1"))
    assert not d.add(session, result("other", "x" * 2000))
    assert windows.capture(session) == []


def test_the_first_result_per_call_id_wins() -> None:
    """A second result with the same call id is ignored: the batch holds the first one."""
    d = driver()
    session = d.session
    d.add(session, user())
    d.add(session, assistant("c1", "c2"))
    d.add(session, result("c1", "first"))
    assert not d.add(session, result("c1", "second, longer"))
    [batch] = windows.capture(session)
    assert [(c.tool_call_id, c.head) for c in batch.calls] == [("c1", "first")]


def test_capture_groups_ready_calls_per_turn() -> None:
    """Each turn with paired results is one batch of its calls, in call order."""
    d = driver()
    session = d.session
    d.add(session, user())
    d.add(session, assistant("a1", "a2"))
    d.add(session, result("a2", "two"))
    d.add(session, result("a1", "one"))
    d.add(session, assistant("b1"))
    d.add(session, result("b1", "three"))
    batches = windows.capture(session)
    assert [b.turn_index for b in batches] == [0, 1]
    assert [[c.tool_call_id for c in b.calls] for b in batches] == [["a1", "a2"], ["b1"]]
    assert [c.raw_chars for c in batches[0].calls] == [3, 3]
    assert batches[0].assistant_text == "working"


def test_a_new_assistant_drops_a_window_no_result_paired_with() -> None:
    """The calls of an assistant followed by another assistant are never captured."""
    d = driver()
    session = d.session
    d.add(session, user())
    d.add(session, assistant("a1"))
    d.add(session, assistant("b1"))
    d.add(session, result("a1"))
    d.add(session, result("b1"))
    assert [[c.tool_call_id for c in b.calls] for b in windows.capture(session)] == [["b1"]]
    assert windows.turn_batch(session, 0) is None


def test_protected_tools_are_not_captured() -> None:
    """A call of a protected tool stays out of its turn's batch."""
    d = driver(protectedTools=["read"])
    session = d.session
    d.add(session, user())
    d.add(session, assistant("c1", tool="read"))
    d.add(session, result("c1", tool="read"))
    assert windows.turn_batch(session, 0) is None
    assert windows.capture(session) == []


def test_the_assistants_usage_is_the_context_size() -> None:
    """totalTokens, else the sum of the four counts; an aborted turn's usage is ignored."""
    d = driver()
    session = d.session
    d.add(session, assistant(usage={"input": 5, "output": 2, "cacheRead": 3}))
    assert session.head["tokens"] == 10
    d.add(session, assistant(usage={"totalTokens": 40}))
    assert session.head["tokens"] == 40
    d.add(session, assistant(usage={"totalTokens": 99}, stop="aborted"))
    assert session.head["tokens"] == 40


def test_a_usage_event_sets_tokens_and_only_a_positive_window() -> None:
    """Tokens follow the event (null after a compaction); the window only when positive."""
    session = driver().session
    windows.note_usage_event(session, 120, 1000)
    windows.note_usage_event(session, None, 0)
    assert (session.head["tokens"], session.head["window"]) == (None, 1000)


def test_is_text_only() -> None:
    """An assistant without tool calls is a final reply; other roles never are."""
    assert message_facts.is_text_only_assistant(assistant())
    assert not message_facts.is_text_only_assistant(assistant("c1"))
    assert not message_facts.is_text_only_assistant(user())


def test_a_reload_closes_the_gate_and_rearms_on_ready_work() -> None:
    """A reload forgets the gate, the queue and the delta reading; ready work rearms."""
    d = driver()
    session = d.session
    d.add(session, user())
    d.add(session, assistant("c1"))
    d.add(session, result("c1"))
    session.head.update(queued=2, prev=0.5)
    windows.on_reload(session)
    assert not windows.gate_open(session)
    assert (session.head["queued"], session.head["prev"], session.head["rearmed"]) == (
        0,
        None,
        True,
    )


def test_a_reload_with_nothing_ready_does_not_rearm() -> None:
    """No ready batch, no rearm."""
    session = driver().session
    windows.on_reload(session)
    assert session.head["rearmed"] is False


@given(
    calls=st.integers(min_value=1, max_value=5),
    order=st.lists(st.integers(min_value=0, max_value=4), max_size=12),
)
def test_a_turn_ends_exactly_when_its_last_distinct_call_first_gets_a_result(
    calls: int, order: list[int]
) -> None:
    """Whatever order and repeats results come in, the turn ends once: at the last new id."""
    d = driver()
    session = d.session
    d.add(session, user())
    ids = [f"c{i}" for i in range(calls)]
    d.add(session, assistant(*ids))
    seen: set[str] = set()
    for i in order:
        call_id = f"c{i}"
        new = call_id in ids and call_id not in seen
        seen |= {call_id} & set(ids)
        assert d.add(session, result(call_id)) == (new and seen == set(ids))
