"""The model port's `anthropic` provider against a fake Messages server on a real socket: the
request (URL, `x-api-key` from the environment, `anthropic-version`, a valid Messages body), the
answer (text, stop reason, usage with cache reads and writes), and every failure mapped to the
port's error kinds or a failed batch, with neither the key nor message text in logs or errors."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
from anthropic.types.message_create_params import (
    MessageCreateParamsNonStreaming,
    MessageCreateParamsStreaming,
)
from fake_anthropic import FakeMessages, Reply
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.events.flush import FlushBatch, FlushCall, FlushRequestPayload
from sessionfold.ports.model_http import (
    HttpModelClient,
    ModelError,
    Timeouts,
    _read_messages,
    resolve_endpoint,
    resolve_fallback,
)
from sessionfold.ports.summarizer_http import HttpSummarizer

KEY = "sk-ant-SECRET-KEY-0123456789"
SECRET = "SECRET-USER-TEXT-42"
MESSAGES = [
    {"role": "system", "content": "You summarize."},
    {"role": "user", "content": f"summarize {SECRET}"},
]
FAST = Timeouts(idle_s=0.3, ceiling_s=3.0, connect_s=1.0)
MODEL = "anthropic/claude-haiku-4-5"


@pytest.fixture
def fake() -> Iterator[FakeMessages]:
    """A running fake Messages server."""
    with FakeMessages() as server:
        yield server


def client(fake: FakeMessages, **options: Any) -> HttpModelClient:
    """A client built from the environment a Claude Code user has: base URL and key."""
    env = {"ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": KEY}
    options.setdefault("timeouts", FAST)
    options.setdefault("retry_wait_s", 0.0)
    return HttpModelClient.from_env(MODEL, env=env, **options)


def failure(http: HttpModelClient) -> ModelError:
    with pytest.raises(ModelError) as caught:
        http.complete(MESSAGES, 64)
    return caught.value


def assert_private(error: BaseException | None, caplog: pytest.LogCaptureFixture) -> None:
    """Neither the key nor message text in any log record or in the error."""
    assert caplog.records, "the calls are logged"
    for record in caplog.records:
        dumped = repr(record.__dict__)
        assert KEY not in dumped and SECRET not in dumped
    if error is not None:
        assert KEY not in str(error) and SECRET not in str(error) and KEY not in repr(error)
        assert error.__cause__ is None


@pytest.fixture(autouse=True)
def _debug_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)


# --- the request and a good answer -------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_an_answer_is_read_with_its_usage_and_the_request_is_a_messages_request(
    fake: FakeMessages, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """POST {base}/v1/messages with the key as x-api-key, never as a bearer token; the body
    validates as the SDK's MessageCreateParams; text, stop reason and usage come back."""
    fake.script(Reply(text=f"the answer {SECRET}", usage=(100, 25, 4000, 300)))
    with client(fake, stream=stream) as http:
        completion = http.complete(MESSAGES, 512)
    assert completion.text == f"the answer {SECRET}"
    assert completion.finish_reason == "stop" and completion.model == MODEL
    usage = completion.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (4400, 25)
    assert (usage.cache_read_tokens, usage.cache_write_tokens) == (4000, 300)
    assert usage.reported
    (request,) = fake.requests
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == KEY
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    params = MessageCreateParamsStreaming if stream else MessageCreateParamsNonStreaming
    pydantic.TypeAdapter(params).validate_python(request.body)
    assert request.body["model"] == "claude-haiku-4-5" and request.body["max_tokens"] == 512
    assert request.body["system"] == "You summarize."
    assert request.body["messages"] == [{"role": "user", "content": f"summarize {SECRET}"}]
    assert "response_format" not in request.body and "reasoning_effort" not in request.body
    assert_private(None, caplog)


def test_the_key_and_url_come_from_the_environment_only() -> None:
    """ANTHROPIC_BASE_URL, else the API's own URL; ANTHROPIC_API_KEY or the variable
    SESSIONFOLD_MODEL_API_KEY_ENV names; another provider's key is never sent to Anthropic."""
    bare = resolve_endpoint(MODEL, env={"OPENAI_API_KEY": "oa"})
    assert bare.url == "https://api.anthropic.com/v1/messages" and bare.api_key is None
    assert bare.api == "anthropic"
    env = {"ANTHROPIC_BASE_URL": "http://h:1/v1", "ANTHROPIC_API_KEY": KEY}
    assert resolve_endpoint(MODEL, env=env).url == "http://h:1/v1/messages"
    assert resolve_endpoint(MODEL, env=env).api_key == KEY
    named = {"SESSIONFOLD_MODEL_API_KEY_ENV": "WORK_KEY", "WORK_KEY": "w", **env}
    assert resolve_endpoint(MODEL, env=named).api_key == "w"
    own = {"SESSIONFOLD_MODEL_BASE_URL": "http://own:2", **env}
    assert resolve_endpoint(MODEL, env=own).url == "http://own:2/v1/messages"
    with pytest.raises(ValueError, match="names WORK_KEY, which is not set") as caught:
        resolve_endpoint(MODEL, env={"SESSIONFOLD_MODEL_API_KEY_ENV": "WORK_KEY"})
    assert KEY not in str(caught.value)
    assert KEY not in repr(resolve_endpoint(MODEL, env=env))
    # A fallback of no provider on the same server speaks Messages too.
    assert resolve_fallback("claude-sonnet-4-5", resolve_endpoint(MODEL, env=env), env).api == (
        "anthropic"
    )


# --- failures ---------------------------------------------------------------------------------


def test_429_is_retried_once_then_fails_as_http_status(
    fake: FakeMessages, caplog: pytest.LogCaptureFixture
) -> None:
    """A rate limit is transient: one more attempt, then `http-status:429`."""
    limited = Reply(status=429, error_type="rate_limit_error", headers={"retry-after": "0"})
    fake.script(limited, limited)
    with client(fake) as http:
        error = failure(http)
    assert error.code == "http-status:429" and error.transient
    assert len(fake.requests) == 2
    assert_private(error, caplog)


def test_500_then_an_answer_is_one_completion_of_two_attempts(
    fake: FakeMessages, caplog: pytest.LogCaptureFixture
) -> None:
    """A server error is retried; the retry's answer is the call's."""
    fake.script(Reply(status=500), Reply(text="second"))
    with client(fake) as http:
        completion = http.complete(MESSAGES, 64)
    assert (completion.text, completion.attempts) == ("second", 2)
    assert_private(None, caplog)


def test_401_is_final(fake: FakeMessages, caplog: pytest.LogCaptureFixture) -> None:
    """A refused key is not retried, and the error says the status, never the key."""
    fake.script(Reply(status=401, error_type="authentication_error"))
    with client(fake) as http:
        error = failure(http)
    assert error.code == "http-status:401" and not error.transient
    assert len(fake.requests) == 1
    assert_private(error, caplog)


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ("{not json", "not-json"),
        ("[1, 2]", "not-an-object"),
        ('{"type": "message", "content": "no"}', "not-a-message"),
    ],
)
def test_a_body_that_is_no_message_is_malformed(
    fake: FakeMessages, body: str, detail: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Bad JSON, or JSON that is no Message, is `malformed` (after the one retry)."""
    fake.script(Reply(body=body), Reply(body=body))
    with client(fake, stream=False) as http:
        error = failure(http)
    assert (error.kind, error.detail) == ("malformed", detail)
    assert len(fake.requests) == 2
    assert_private(error, caplog)


def test_a_silent_model_times_out_idle(
    fake: FakeMessages, caplog: pytest.LogCaptureFixture
) -> None:
    """No event for longer than the idle timeout: `timeout-idle`, retried once."""
    fake.script(Reply(stall_s=1.0), Reply(stall_s=1.0))
    with client(fake) as http:
        error = failure(http)
    assert error.kind == "timeout-idle"
    assert len(fake.requests) == 2
    assert_private(error, caplog)


def test_a_trickling_model_ends_at_the_ceiling(
    fake: FakeMessages, caplog: pytest.LogCaptureFixture
) -> None:
    """Events that keep coming, each within the idle timeout, end at the attempt's ceiling."""
    trickle = Reply(text="x" * 400, chunk_chars=1, event_delay_s=0.01)
    fake.script(trickle, trickle)
    started = time.monotonic()
    with client(fake, timeouts=Timeouts(idle_s=1.0, ceiling_s=0.5, connect_s=1.0)) as http:
        error = failure(http)
    assert error.kind == "timeout-ceiling"
    assert time.monotonic() - started < 3.0  # two attempts of 0.5 s, not 400 events each
    assert_private(error, caplog)


def test_an_error_event_in_the_stream_is_the_status_its_type_stands_for(
    fake: FakeMessages, caplog: pytest.LogCaptureFixture
) -> None:
    """`overloaded_error` mid-stream is HTTP 529: transient, retried."""
    fake.script(Reply(text="partial text", error_event="overloaded_error"), Reply(text="fine"))
    with client(fake) as http:
        completion = http.complete(MESSAGES, 64)
    assert (completion.text, completion.attempts) == ("fine", 2)
    fake.script(*[Reply(text="x", error_event="overloaded_error")] * 2)
    with client(fake) as http:
        error = failure(http)
    assert error.code == "http-status:529"
    assert_private(error, caplog)


def test_a_stream_cut_before_its_stop_is_a_transport_failure(fake: FakeMessages) -> None:
    """Events that end without `message_stop` or a stop reason are no answer."""
    cut = 'event: message_start\ndata: {"type": "message_start", "message": {}}\n\n'
    fake.script(Reply(body=cut, headers={"content-type": "text/event-stream"}))
    with client(fake, retry=False) as http:
        error = failure(http)
    assert error.kind in ("malformed", "transport")


# --- answers that are no summary ----------------------------------------------------------------


def flush_request() -> FlushRequestPayload:
    call = FlushCall(
        key="c1@1",
        tool_call_id="c1",
        tool_name="read",
        arguments={"path": "/w/a.ts"},
        raw_chars=3_000,
        content_hash="h",
        head=f"{SECRET} " * 100,
        truncated_chars=1_000,
        seq=1,
        ref="t1",
    )
    batch = FlushBatch(
        turn_index=0, timestamp=0, assistant_text="Looking.", disposition="summarize", calls=(call,)
    )
    return FlushRequestPayload(
        request_id="s:9",
        session_id="s",
        seq=9,
        trigger="message-end",
        model=MODEL,
        batches=(batch,),
    )


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (Reply(stop_reason="max_tokens", text="cut off mid"), "unusable-length"),
        (
            Reply(blocks=[{"type": "thinking", "thinking": "hm", "signature": "s"}]),
            "unusable-empty",
        ),
        (
            Reply(blocks=[{"type": "tool_use", "id": "t", "name": "n", "input": {}}]),
            "unusable-empty",
        ),
        (Reply(stop_reason="refusal", text="I will not"), "unusable-refusal"),
    ],
)
@pytest.mark.parametrize("stream", [True, False])
def test_an_unusable_answer_fails_its_batch_with_usage(
    fake: FakeMessages, reply: Reply, code: str, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut off at max_tokens, no text block, or a refusal: the batch fails with a code and
    the call's usage; it is not retried (the model answered)."""
    fake.script(reply)
    with HttpSummarizer(client(fake, stream=stream)) as port:
        answer = port.summarize(flush_request())
    (result,) = answer.results
    assert (result.outcome, result.error, result.text) == ("failed", code, None)
    assert result.usage.calls == 1 and result.usage.output_tokens == 30
    assert len(fake.requests) == 1
    assert_private(None, caplog)


def test_a_summary_carries_the_models_text_refs_and_usage(fake: FakeMessages) -> None:
    """A usable answer becomes the batch's summary, labels replaced by refs, footer added."""
    fake.script(Reply(text="[[1:read]] read a.ts: exports foo", usage=(50, 12, 200, 0)))
    with HttpSummarizer(client(fake)) as port:
        answer = port.summarize(flush_request())
    (result,) = answer.results
    assert result.outcome == "summarized" and result.refs == ("t1",)
    assert result.text is not None and result.text.startswith("`t1` read a.ts: exports foo")
    assert (result.usage.input_tokens, result.usage.output_tokens) == (250, 12)
    assert (result.usage.cache_read_tokens, result.usage.cache_write_tokens) == (200, 0)
    assert answer.usage == result.usage
    assert answer.model == MODEL


# --- the stream reader, whatever the chunking --------------------------------------------------


def _sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(st.text(min_size=0, max_size=12), min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30),
    read=st.integers(min_value=0, max_value=10_000),
)
def test_a_streamed_answer_reads_the_same_however_its_bytes_are_split(
    parts: list[str], cuts: list[int], read: int
) -> None:
    """The text is the deltas joined and the usage is the stream's, for any split of the bytes
    into chunks (a multi-byte character or an event cut anywhere)."""
    start = {"id": "m", "type": "message", "role": "assistant", "model": "c", "content": []}
    start["usage"] = {"input_tokens": 9, "output_tokens": 1, "cache_read_input_tokens": read}
    deltas = [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}
        for p in parts
    ]
    events = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *deltas,
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 7},
        },
        {"type": "message_stop"},
    ]
    raw = _sse(events)
    chunks, at, n = [], 0, 0
    while at < len(raw):
        size = cuts[n % len(cuts)]
        chunks.append(raw[at : at + size])
        at, n = at + size, n + 1
    answer = _read_messages(iter(chunks), True, MODEL, None)
    assert answer.text == "".join(parts) and answer.finish_reason == "stop"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (9 + read, 7)
    assert answer.usage.cache_read_tokens == read


# --- the ledger's diff call ---------------------------------------------------------------------


def test_the_ledger_diff_call_runs_on_the_messages_api(fake: FakeMessages) -> None:
    """The diff model's system prompt goes as `system`; an answer cut at max_tokens is asked
    again with the raised budget; the JSON object is read out of the answer's prose."""
    from sessionfold.ports.ledger_http import SYSTEM_PROMPT, HttpDiffModel

    good = {"labels": [{"message": "u1", "label": "rule"}], "narrative": "set a rule", "now": "x"}
    prompt: dict[str, Any] = {
        "instructions": "label",
        "span": 1,
        "messages": [{"id": "u1", "entry": "e2", "chars": 5, "excerpt": "never", "text": "never"}],
        "rules": [],
        "commands": [],
        "errors": [],
        "world": None,
        "now": None,
    }
    fake.script(
        Reply(text='{"labels": [', stop_reason="max_tokens"),
        Reply(text=f"Here it is: {json.dumps(good)}"),
    )
    model = HttpDiffModel(client(fake))
    assert model.diff(prompt) == good
    first, second = fake.requests
    assert first.body["system"] == SYSTEM_PROMPT
    assert [m["role"] for m in first.body["messages"]] == ["user"]
    assert second.body["max_tokens"] > first.body["max_tokens"]
    assert [call.outcome for call in model.trace][-1] == "ok"


@pytest.mark.parametrize(("model", "loaded"), [(MODEL, True), ("openai/gpt-4o-mini", False)])
def test_the_sdk_is_loaded_with_an_anthropic_client_only(model: str, loaded: bool) -> None:
    """An Anthropic client loads the SDK when it is made (its first call would otherwise pay
    the second it takes); the OpenAI-compatible path never loads it."""
    code = (
        "import sys\n"
        "from sessionfold.ports.model_http import HttpModelClient\n"
        f"HttpModelClient.from_env({model!r}, env={{}}).close()\n"
        "print('anthropic' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
    assert done.stdout.decode().strip() == str(loaded)


_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_EVENT_TYPES = st.sampled_from(
    ["message_start", "content_block_delta", "message_delta", "message_stop", "error", "ping"]
)


_ANY_COUNT = st.none() | st.booleans() | st.integers(min_value=-(10**6), max_value=10**6)
_USAGE_EVENT = st.fixed_dictionaries(
    {
        "type": st.just("message_delta"),
        "delta": st.just({"stop_reason": "end_turn"}),
        "usage": st.fixed_dictionaries(
            {"output_tokens": _ANY_COUNT},
            optional={
                "input_tokens": _ANY_COUNT,
                "cache_read_input_tokens": _ANY_COUNT,
                "cache_creation_input_tokens": _ANY_COUNT,
            },
        ),
    }
)


@settings(max_examples=150, deadline=None)
@given(
    streamed=st.booleans(),
    junk=st.binary(max_size=300)
    | st.lists(_USAGE_EVENT, min_size=1, max_size=3).map(_sse)
    | _JSONISH.map(lambda v: json.dumps(v).encode())
    | st.lists(
        st.tuples(_EVENT_TYPES, st.dictionaries(st.text(max_size=8), _JSONISH, max_size=4)),
        max_size=5,
    ).map(lambda events: _sse([{**body, "type": kind} for kind, body in events])),
)
def test_any_body_is_an_answer_or_a_model_error(streamed: bool, junk: bytes) -> None:
    """Whatever a server sends, whole or as events, the reader returns an answer or raises
    `ModelError` with a code: no other exception, and nothing of the body in the message."""
    try:
        answer = _read_messages(iter([junk]), streamed, MODEL, None)
    except ModelError as exc:
        assert exc.kind in ("malformed", "transport", "http-status")
        assert exc.__cause__ is None and str(exc).startswith(f"model {MODEL} ")
        assert exc.detail is None or exc.detail.replace("-", "").isalpha()
    else:
        assert isinstance(answer.text, str)
        usage = answer.usage
        counts = (usage.prompt_tokens, usage.completion_tokens, usage.cache_read_tokens)
        assert min(*counts, usage.cache_write_tokens) >= 0
        assert usage.prompt_tokens >= usage.cache_read_tokens + usage.cache_write_tokens
