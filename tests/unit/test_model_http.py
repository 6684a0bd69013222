"""The OpenAI-compatible HTTP core against a fake server on a real socket: answers, usage and
cost, idle and ceiling timeouts, the one retry, the fallback model, error kinds, privacy."""

from __future__ import annotations

import logging
import re
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from fake_openai import (
    FakeOpenAI,
    Reply,
    answer,
    cut_off,
    dribble,
    drop,
    http_error,
    huge,
    malformed,
    silent,
    stall,
    trickle,
)
from hypothesis import given
from hypothesis import strategies as st

from sessionfold.ports.model_http import (
    Endpoint,
    HttpModelClient,
    ModelError,
    Price,
    Timeouts,
    _lines,
    parse_prices,
    resolve_endpoint,
    resolve_fallback,
)

SECRET = "SECRET-USER-TEXT-42"
MESSAGES = [{"role": "user", "content": f"summarize {SECRET}"}]
FAST = Timeouts(idle_s=0.25, ceiling_s=2.0, connect_s=1.0)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    """A running fake server, stopped after the test."""
    with FakeOpenAI() as server:
        yield server


def endpoint(fake: FakeOpenAI, model: str = "m1", **options: Any) -> Endpoint:
    return resolve_endpoint(model, base_url=fake.base_url, env={}, **options)


def client(fake: FakeOpenAI, **options: Any) -> HttpModelClient:
    options.setdefault("timeouts", FAST)
    options.setdefault("retry_wait_s", 0.0)
    return HttpModelClient(endpoint(fake, api_key=options.pop("api_key", None)), **options)


def failure(call: Any) -> tuple[ModelError, float]:
    """The ModelError a call raises, and how long it took."""
    started = time.monotonic()
    with pytest.raises(ModelError) as caught:
        call()
    return caught.value, time.monotonic() - started


# --- answers, usage, cost ----------------------------------------------------------------------


def test_streamed_answer_with_usage_and_cost(fake: FakeOpenAI) -> None:
    """A streamed answer is joined; usage comes from the usage chunk; cost from the price."""
    fake.script(answer("- `t1` read the file, found `foo()`", usage=(1_000, 200)))
    with client(fake, api_key="sk-test", prices={"m1": Price(2.0, 8.0)}) as http:
        completion = http.complete(MESSAGES, 512)
    assert completion.text == "- `t1` read the file, found `foo()`"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (1_000, 200)
    assert completion.cost == pytest.approx((1_000 * 2.0 + 200 * 8.0) / 1_000_000)
    assert (completion.model, completion.finish_reason, completion.attempts) == ("m1", "stop", 1)
    [request] = fake.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.body["stream"] is True
    assert request.body["stream_options"] == {"include_usage": True}
    assert request.body["max_tokens"] == 512
    assert request.body["messages"] == MESSAGES


def test_non_streamed_answer_and_unknown_price(fake: FakeOpenAI) -> None:
    """Without streaming the JSON body is read; no price and no reported cost: cost None."""
    fake.script(answer("plain", usage=(10, 2)))
    with client(fake, stream=False) as http:
        completion = http.complete(MESSAGES, 64)
    assert (completion.text, completion.cost) == ("plain", None)
    assert completion.usage.reported and completion.usage.prompt_tokens == 10
    assert fake.requests[0].body["stream"] is False
    assert "stream_options" not in fake.requests[0].body
    assert "authorization" not in fake.requests[0].headers


def test_a_reported_cost_is_used_when_no_price_is_configured(fake: FakeOpenAI) -> None:
    """OpenRouter reports `usage.cost`; a configured price would win over it."""
    fake.script(answer("a", cost=0.0042), answer("b", usage=(1_000_000, 0), cost=0.0042))
    with client(fake) as http:
        assert http.complete(MESSAGES, 64).cost == pytest.approx(0.0042)
    with client(fake, prices={"m1": Price(1.0, 1.0)}) as http:
        assert http.complete(MESSAGES, 64).cost == pytest.approx(1.0)


def test_no_usage_means_no_cost(fake: FakeOpenAI) -> None:
    """A server that sends no usage: zero tokens, not reported, cost None even with a price."""
    fake.script(answer("x", usage=None))
    with client(fake, prices={"m1": Price(1.0, 1.0)}) as http:
        completion = http.complete(MESSAGES, 64)
    assert not completion.usage.reported and completion.cost is None


def test_a_cut_off_answer_is_returned_not_raised(fake: FakeOpenAI) -> None:
    """finish_reason "length" is the caller's to judge: the core returns it."""
    fake.script(cut_off('{"labels": ['))
    with client(fake) as http:
        completion = http.complete(MESSAGES, 64)
    assert (completion.text, completion.finish_reason) == ('{"labels": [', "length")
    assert len(fake.requests) == 1


def test_budget_is_capped_at_the_models_maximum_and_openai_uses_its_field(
    fake: FakeOpenAI,
) -> None:
    """A budget above the model's maximum is lowered; OpenAI gets `max_completion_tokens`."""
    capped = HttpModelClient(endpoint(fake, max_output_tokens=100), timeouts=FAST)
    openai = HttpModelClient(
        resolve_endpoint("openai/gpt-x", base_url=fake.base_url, env={}), timeouts=FAST
    )
    with capped, openai:
        assert capped.complete(MESSAGES, 5_000).max_tokens == 100
        openai.complete(MESSAGES, 300)
    assert fake.requests[0].body["max_tokens"] == 100
    assert fake.requests[1].body["max_completion_tokens"] == 300
    assert fake.requests[1].model == "gpt-x"


# --- timeouts ----------------------------------------------------------------------------------


def test_idle_timeout_fires_when_the_stream_stalls(fake: FakeOpenAI) -> None:
    """Headers, then no byte for longer than the idle timeout: timeout-idle, promptly."""
    fake.script(stall(1.5))
    with client(fake, retry=False) as http:
        error, took = failure(lambda: http.complete(MESSAGES, 64))
    assert error.kind == "timeout-idle" and error.seconds == 0.25
    assert 0.2 <= took < 1.0
    assert str(error) == "model m1 stalled (no output for 0.25s)"


def test_idle_timeout_fires_before_any_header(fake: FakeOpenAI) -> None:
    """A server that says nothing at all is idle too (non-streaming waits the same way)."""
    fake.script(silent(1.5), silent(1.5))
    with client(fake, retry=False) as http:
        assert failure(lambda: http.complete(MESSAGES, 64))[0].kind == "timeout-idle"
    with client(fake, retry=False, stream=False) as http:
        assert failure(lambda: http.complete(MESSAGES, 64))[0].kind == "timeout-idle"


def test_ceiling_fires_on_a_trickling_stream(fake: FakeOpenAI) -> None:
    """Bytes every 50 ms never trip the idle timeout; the ceiling ends the attempt."""
    fake.script(trickle("x" * 200, every_s=0.05))
    timeouts = Timeouts(idle_s=0.25, ceiling_s=0.4)
    with client(fake, retry=False, timeouts=timeouts) as http:
        error, took = failure(lambda: http.complete(MESSAGES, 64))
    assert error.kind == "timeout-ceiling" and str(error) == "model m1 exceeded 0.4s ceiling"
    assert 0.35 <= took < 1.0


def test_ceiling_wakes_a_blocked_read_when_idle_is_disabled(fake: FakeOpenAI) -> None:
    """Idle 0 (off): a stalled stream is cut by the ceiling timer, not left hanging."""
    fake.script(stall(3.0))
    timeouts = Timeouts(idle_s=0, ceiling_s=0.3)
    with client(fake, retry=False, timeouts=timeouts) as http:
        error, took = failure(lambda: http.complete(MESSAGES, 64))
    assert error.kind == "timeout-ceiling"
    assert took < 1.0


def test_ceiling_fires_on_a_dribbled_body(fake: FakeOpenAI) -> None:
    """A non-streamed body sent a byte every 50 ms never trips the idle timeout; the ceiling
    ends the attempt."""
    fake.script(dribble("x" * 200, every_s=0.05))
    timeouts = Timeouts(idle_s=0.25, ceiling_s=0.4)
    with client(fake, retry=False, timeouts=timeouts, stream=False) as http:
        error, took = failure(lambda: http.complete(MESSAGES, 64))
    assert error.kind == "timeout-ceiling"
    assert 0.35 <= took < 1.0


# --- the size cap ----------------------------------------------------------------------------

HUGE = 50 * 1024 * 1024
CAP = 256 * 1024


@pytest.mark.parametrize(
    ("stream", "length_header"), [(False, True), (False, False), (True, False)]
)
def test_a_huge_answer_is_refused_without_being_held(
    fake: FakeOpenAI, stream: bool, length_header: bool
) -> None:
    """A 50 MB answer (declared or not, streamed as one event or not) is refused as
    `too-large` once the body passes the cap; the client never holds much more than the cap,
    and does not retry it."""
    fake.script(huge(HUGE, stream=stream, length_header=length_header))
    with client(fake, max_response_bytes=CAP, stream=stream, timeouts=Timeouts(5, 30)) as http:
        tracemalloc.start()
        try:
            error, took = failure(lambda: http.complete(MESSAGES, 64))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert (error.kind, error.code, error.transient) == ("too-large", "too-large", False)
    assert str(error) == f"model m1 answered more than {CAP} bytes"
    assert peak < 8 * CAP, peak
    assert len(fake.requests) == 1
    assert took < 5


def test_an_answer_within_the_cap_is_read_whole(fake: FakeOpenAI) -> None:
    """The cap counts bytes; an answer under it, streamed or not, comes back unchanged."""
    text = "é" * 20_000  # 40,000 bytes of UTF-8 split across chunks
    for stream in (False, True):
        fake.script(answer(text, stream=stream))
        with client(fake, max_response_bytes=CAP, stream=stream) as http:
            assert http.complete(MESSAGES, 64).text == text


def test_the_default_cap_and_its_variable(fake: FakeOpenAI) -> None:
    """4 MiB unless SESSIONFOLD_MODEL_MAX_RESPONSE_BYTES says otherwise; it must be positive."""
    base = {"SESSIONFOLD_MODEL": "m1", "SESSIONFOLD_MODEL_BASE_URL": fake.base_url}
    with HttpModelClient.from_env(env=base) as http:
        assert http.max_response_bytes == 4 * 1024 * 1024
    env = {**base, "SESSIONFOLD_MODEL_MAX_RESPONSE_BYTES": "1000"}
    with HttpModelClient.from_env(env=env) as http:
        assert http.max_response_bytes == 1000
        fake.script(huge(5_000))
        assert failure(lambda: http.complete(MESSAGES, 64))[0].kind == "too-large"
    with pytest.raises(ValueError, match="SESSIONFOLD_MODEL_MAX_RESPONSE_BYTES"):
        HttpModelClient.from_env(env={**base, "SESSIONFOLD_MODEL_MAX_RESPONSE_BYTES": "0"})


@given(
    st.text(alphabet="ab\r\né\u2028", max_size=40),
    st.lists(st.integers(min_value=0, max_value=200), max_size=6),
)
def test_lines_split_as_server_sent_events_do_wherever_the_chunks_break(
    text: str, cuts: list[int]
) -> None:
    """CRLF, LF and CR end lines (nothing else does), whatever the chunk boundaries."""
    raw = text.encode()
    points = sorted({min(c, len(raw)) for c in cuts})
    chunks = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    expected = re.split(r"\r\n|\n|\r", text)
    if expected[-1] == "":
        expected.pop()
    assert list(_lines(iter(chunks))) == expected


def test_config_milliseconds_map_to_timeouts() -> None:
    """summarizerIdleTimeoutMs / summarizerMaxTimeoutMs: milliseconds, 0 disables."""
    assert Timeouts.from_ms(20_000, 180_000) == Timeouts(20.0, 180.0)
    off = Timeouts.from_ms(0, 0)
    assert (off.idle, off.ceiling) == (None, None)


# --- retry and fallback ------------------------------------------------------------------------


def test_a_transient_failure_is_retried_once_then_succeeds(fake: FakeOpenAI) -> None:
    """No fallback model: a 503 is retried once on the same model."""
    fake.script(http_error(503), answer("second time"))
    with client(fake) as http:
        completion = http.complete(MESSAGES, 64)
    assert (completion.text, completion.attempts) == ("second time", 2)
    assert len(fake.requests) == 2


def test_a_timeout_is_retried_once_and_a_second_failure_raises(fake: FakeOpenAI) -> None:
    """Two stalls: two attempts, then the error; never a third."""
    fake.script(stall(1.0), http_error(429, retry_after="0"), answer("never"))
    with client(fake) as http:
        error, _ = failure(lambda: http.complete(MESSAGES, 64))
    assert (error.kind, error.status) == ("http-status", 429)
    assert len(fake.requests) == 2 and fake.pending() == 1


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_a_request_or_auth_error_is_not_retried(fake: FakeOpenAI, status: int) -> None:
    """A 4xx other than 408/409/425/429 would fail the same way again (§6.6 `auth`)."""
    fake.script(http_error(status), answer("unused"))
    with client(fake) as http:
        error, _ = failure(lambda: http.complete(MESSAGES, 64))
    assert (error.kind, error.status, error.transient) == ("http-status", status, False)
    assert len(fake.requests) == 1


def test_fallback_model_answers_after_the_primary_fails_and_keeps_serving(
    fake: FakeOpenAI,
) -> None:
    """§6.6: the primary's transient failure is retried on the fallback; later calls go to the
    fallback until the cooldown passes, then one call probes the primary, which recovers."""
    now = [0.0]
    primary = endpoint(fake, "primary")
    http = HttpModelClient(
        primary,
        fallback=resolve_fallback("backup", primary, env={}),
        timeouts=FAST,
        fallback_cooldown_s=60.0,
        clock=lambda: now[0],
    )
    fake.script(http_error(500), model="primary")
    with http:
        first = http.complete(MESSAGES, 64)
        assert (first.model, first.fallback, first.attempts) == ("backup", True, 2)
        now[0] = 30.0
        assert http.complete(MESSAGES, 64).model == "backup"  # within the cooldown
        now[0] = 61.0
        probe = http.complete(MESSAGES, 64)  # the probe: the primary is back
        assert (probe.model, probe.fallback) == ("primary", False)
        assert http.complete(MESSAGES, 64).model == "primary"
    assert fake.models() == ["primary", "backup", "backup", "primary", "primary"]
    assert not http.controller.in_fallback


def test_primary_and_fallback_both_failing_raise_the_fallbacks_error(fake: FakeOpenAI) -> None:
    """Both down: one attempt each, the retry's error is raised, and the client falls back."""
    primary = endpoint(fake, "primary")
    http = HttpModelClient(
        primary, fallback=resolve_fallback("backup", primary, env={}), timeouts=FAST
    )
    fake.script(http_error(503), model="primary")
    fake.script(drop(), model="backup")
    with http:
        error, _ = failure(lambda: http.complete(MESSAGES, 64))
    assert (error.kind, error.model) == ("transport", "backup")
    assert fake.models() == ["primary", "backup"]
    assert http.controller.in_fallback and http.controller.warning_owed


# --- error kinds -------------------------------------------------------------------------------


def test_error_kinds(fake: FakeOpenAI) -> None:
    """Malformed bodies, broken events, cut streams, error objects, drops, a closed port."""
    cases: list[tuple[Reply, str]] = [
        (malformed("<html>bad gateway</html>"), "malformed"),
        (malformed('{"object": "chat.completion"}'), "malformed"),
        (malformed("data: {not json\n\n", stream=True), "malformed"),
        (malformed('data: {"choices": [{"index": 0, "delta": {}}]}\n\n', stream=True), "transport"),
        (malformed('{"error": {"message": "x", "code": 502}}'), "http-status"),
        (drop(), "transport"),
    ]
    with client(fake, retry=False) as http:
        for reply, kind in cases:
            fake.script(reply)
            error, _ = failure(lambda: http.complete(MESSAGES, 64))
            assert error.kind == kind, reply
    fake.stop()
    with client(fake, retry=False) as http:
        error, _ = failure(lambda: http.complete(MESSAGES, 64))
    assert (error.kind, error.detail) == ("transport", "ConnectError")


def test_no_message_text_in_logs_or_errors(
    fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """Prompt text, answer text and a server's error body never reach a log record or error."""
    caplog.set_level(logging.DEBUG, logger="sessionfold")
    fake.script(answer(f"answer {SECRET}"), http_error(500), http_error(500))
    errors = []
    with client(fake) as http:
        http.complete(MESSAGES, 64)
        errors.append(failure(lambda: http.complete(MESSAGES, 64))[0])
    assert caplog.records, "the calls are logged"
    for record in caplog.records:
        dumped = repr(record.__dict__)
        assert SECRET not in dumped and "SECRET-ERROR-BODY" not in dumped
    for error in errors:
        assert SECRET not in str(error) and "SECRET-ERROR-BODY" not in str(error)
        assert error.__cause__ is None or SECRET not in str(error.__cause__)


# --- configuration -----------------------------------------------------------------------------


def test_endpoint_resolution_from_names_and_environment() -> None:
    """provider/model-id splits at the first slash; env and presets give URL and key."""
    env = {"OPENROUTER_API_KEY": "or-key", "OPENAI_API_KEY": "oa-key"}
    routed = resolve_endpoint("openrouter/anthropic/claude-x", env=env)
    assert (routed.model, routed.base_url, routed.api_key) == (
        "anthropic/claude-x",
        "https://openrouter.ai/api/v1",
        "or-key",
    )
    assert routed.label == "openrouter/anthropic/claude-x"
    assert "or-key" not in repr(routed)
    local = resolve_endpoint("ollama/llama3.1", env={})
    assert (local.base_url, local.api_key) == ("http://127.0.0.1:11434/v1", None)
    assert local.url == "http://127.0.0.1:11434/v1/chat/completions"
    overridden = resolve_endpoint(
        "vllm/Qwen/Qwen2.5-7B",
        env={"SESSIONFOLD_MODEL_BASE_URL": "http://gpu:9000/v1", "SESSIONFOLD_MODEL_API_KEY": "k"},
    )
    assert (overridden.model, overridden.base_url, overridden.api_key) == (
        "Qwen/Qwen2.5-7B",
        "http://gpu:9000/v1",
        "k",
    )
    with pytest.raises(ValueError, match="SESSIONFOLD_MODEL_BASE_URL"):
        resolve_endpoint("acme/model", env={})
    with pytest.raises(ValueError, match="provider/model-id"):
        resolve_endpoint("/model", env={})


def test_client_from_environment(fake: FakeOpenAI) -> None:
    """SESSIONFOLD_MODEL* variables configure model, URL, key, fallback, prices and timeouts."""
    env = {
        "SESSIONFOLD_MODEL": "primary",
        "SESSIONFOLD_MODEL_BASE_URL": fake.base_url,
        "SESSIONFOLD_MODEL_API_KEY": "sk-env",
        "SESSIONFOLD_MODEL_FALLBACK": "backup",
        "SESSIONFOLD_MODEL_PRICES": '{"primary": [1, 2], "backup": {"input": 0.5, "output": 1}}',
        "SESSIONFOLD_MODEL_STREAM": "0",
        "SESSIONFOLD_MODEL_IDLE_TIMEOUT_MS": "0",
        "SESSIONFOLD_MODEL_MAX_TIMEOUT_MS": "5000",
    }
    with HttpModelClient.from_env(env=env) as http:
        assert (http.primary.model, http.fallback and http.fallback.model) == ("primary", "backup")
        assert http.fallback is not None and http.fallback.base_url == fake.base_url
        assert http.fallback.api_key == "sk-env"  # same server, same key
        assert (http.timeouts.idle, http.timeouts.ceiling, http.stream) == (None, 5.0, False)
        assert http.prices["backup"] == Price(0.5, 1.0)
        http.complete(MESSAGES, 16)
    assert fake.requests[0].headers["authorization"] == "Bearer sk-env"
    with pytest.raises(ValueError, match="SESSIONFOLD_MODEL"):
        HttpModelClient.from_env(env={})
    with pytest.raises(ValueError, match="SESSIONFOLD_MODEL_PRICES"):
        parse_prices('{"m": "cheap"}')


def test_fallback_resolution() -> None:
    """Same provider or none: the primary's server and key; another provider: its own."""
    env = {
        "SESSIONFOLD_MODEL_BASE_URL": "http://gpu:9000/v1",
        "SESSIONFOLD_MODEL_API_KEY": "vllm-key",
        "OPENAI_API_KEY": "oa-key",
    }
    primary = resolve_endpoint("vllm/Qwen/Qwen2.5-72B", env=env)
    small = resolve_fallback("vllm/Qwen/Qwen2.5-7B", primary, env=env)
    assert (small.model, small.base_url, small.api_key) == (
        "Qwen/Qwen2.5-7B",
        "http://gpu:9000/v1",
        "vllm-key",
    )
    hosted = resolve_fallback("openai/gpt-4o-mini", primary, env=env)
    assert (hosted.base_url, hosted.api_key) == ("https://api.openai.com/v1", "oa-key")
    assert hosted.max_tokens_field == "max_completion_tokens"
    own = resolve_fallback(
        "backup",
        primary,
        env={
            **env,
            "SESSIONFOLD_MODEL_FALLBACK_BASE_URL": "http://cpu:8080/v1",
            "SESSIONFOLD_MODEL_FALLBACK_API_KEY": "cpu-key",
            "SESSIONFOLD_MODEL_FALLBACK_MAX_OUTPUT_TOKENS": "2048",
        },
    )
    assert (own.base_url, own.api_key, own.max_output_tokens) == (
        "http://cpu:8080/v1",
        "cpu-key",
        2048,
    )
