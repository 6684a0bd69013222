"""The gateway's cache policy: between two changes every call of a session gets the very same
texts (the provider's cached prefix holds), and a change comes only when it frees enough tokens
or the cache has expired anyway."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.streams.web.cache_policy import CachePolicy


def test_the_first_call_takes_the_plan_and_small_changes_wait() -> None:
    policy = CachePolicy(min_freed_tokens=1000, cache_ttl_s=300)
    present = {"a": 8000, "b": 400, "c": 9000}
    first = policy.choose("s", {"a": "stub a"}, present, now=0.0).texts
    assert first == {"a": "stub a"}
    # b frees (400 - 6) / 4 < 1000 tokens: the prefix stays as it was
    assert policy.choose("s", {"a": "stub a", "b": "stub b"}, present, now=10.0).texts == first
    # c frees ~2250 tokens: the change pays for the cache write
    wanted = {"a": "stub a", "b": "stub b", "c": "stub c"}
    assert policy.choose("s", wanted, present, now=20.0).texts == wanted


def test_after_the_cache_life_the_newest_plan_is_taken() -> None:
    policy = CachePolicy(min_freed_tokens=10**9, cache_ttl_s=300)
    present = {"a": 100, "b": 100}
    policy.choose("s", {"a": "x"}, present, now=0.0)
    assert policy.choose("s", {"a": "x", "b": "y"}, present, now=299.0).texts == {"a": "x"}
    assert policy.choose("s", {"a": "x", "b": "y"}, present, now=600.0).texts == {
        "a": "x",
        "b": "y",
    }


def test_a_token_count_reads_the_policy_and_changes_nothing() -> None:
    policy = CachePolicy(min_freed_tokens=10**9)
    present = {"a": 100, "b": 100}
    policy.choose("s", {"a": "x"}, present, now=0.0)
    counted = policy.choose("s", {"a": "x", "b": "y"}, present, 1.0, count_only=True)
    assert counted.texts == {"a": "x"}
    assert policy.sessions["s"].last_call == 0.0


def test_results_the_call_does_not_carry_are_not_sent() -> None:
    policy = CachePolicy()
    assert policy.choose("s", {"gone": "x", "a": "y"}, {"a": 50}, now=0.0).texts == {"a": "y"}


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 6), st.floats(0, 200, allow_nan=False)), min_size=1, max_size=12
    ),
    min_freed=st.integers(0, 3000),
    after=st.none() | st.integers(0, 40_000),
)
def test_texts_change_exactly_when_the_change_pays_or_the_cache_expired(
    steps: list[tuple[int, float]], min_freed: int, after: int | None
) -> None:
    """A session summarizes its results one after another (plan k stubs the first k); at each
    call the texts sent are the last ones applied, unless the plan frees `min_freed` tokens
    over them, or at least a third of the request from the first result it changes to the end
    (the results in order, then `after` chars; None: the gateway does not say), or `ttl`
    passed since the last call."""
    order = [f"r{n}" for n in range(7)]
    sizes = {call: 1000 * (n + 1) for n, call in enumerate(order)}
    ttl = 300.0
    policy = CachePolicy(min_freed_tokens=min_freed, cache_ttl_s=ttl)

    def tail(calls: set[str], _chains: set[str]) -> int:
        first = min(order.index(call) for call in calls)
        return sum(sizes[call] for call in order[first:]) + (after or 0)

    now = 0.0
    sent: dict[str, str] | None = None
    last = 0.0
    for k, gap in steps:
        now += gap
        plan = {f"r{n}": "stub" for n in range(k)}
        got = policy.choose("s", plan, sizes, now, tail=None if after is None else tail).texts
        if sent is not None and plan != sent:
            freed = sum(sizes[c] - 4 for c in plan if c not in sent) - sum(
                sizes[c] - 4 for c in sent if c not in plan
            )
            changed = set(plan) ^ set(sent)
            pays = freed // 4 >= min_freed or (
                after is not None and freed > 0 and tail(changed, set()) <= 3 * freed
            )
            assert got == (plan if pays or now - last >= ttl else sent)
        assert got in (plan, sent)
        sent, last = got, now
