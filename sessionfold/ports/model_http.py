"""An HTTP model client: the core of the model port, for chat completions and Anthropic Messages.

One client speaks to any server with the `/chat/completions` API (OpenAI, vLLM, llama.cpp
server, Ollama, OpenRouter), or to the Anthropic Messages API for a model named
`anthropic/model-id` (its headers, body and answers are read by `anthropic_messages`;
everything else here is the same for both). `HttpModelClient.complete(messages, max_tokens)`
returns a `Completion` (text, usage, model, finish reason, cost) or raises `ModelError`, whose
`kind` is one of `timeout-idle`, `timeout-ceiling`, `http-status`, `transport`, `malformed`,
`too-large`.

The answer's size is bounded too: the response body is read in chunks and counted, and a body
over `max_response_bytes` (default 4 MiB, `SESSIONFOLD_MODEL_MAX_RESPONSE_BYTES`) is dropped as
`too-large` the moment the count passes it, so a runaway model never sits in memory whole.

Timeouts follow reference §6.5: an idle timeout (no bytes for N seconds; with streaming that is
"no stream event", without it "no answer yet") and a ceiling on the whole attempt; `None` or 0
disables either. Retries follow §6.6: with a fallback model a transient failure of the primary
is retried once on the fallback, and a `FallbackController` keeps later calls on the fallback
for a cooldown before probing the primary again; without one, a transient failure is retried
once on the same model. A model that answered is never retried here: an empty or cut-off answer
comes back as a `Completion` and the caller decides what it is worth.

Privacy: nothing here logs or raises with prompt text, answer text or a server's error body.
Log records and exception messages carry model labels, error kinds, status codes, counts and
durations only; API keys are never in a repr.
"""

from __future__ import annotations

import codecs
import contextlib
import importlib
import json
import logging
import math
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

log = logging.getLogger(__name__)

#: Environment variables `from_env` reads (all optional; code may set every value directly).
ENV_BASE_URL = "SESSIONFOLD_MODEL_BASE_URL"
ENV_MODEL = "SESSIONFOLD_MODEL"
ENV_API_KEY = "SESSIONFOLD_MODEL_API_KEY"
ENV_API_KEY_ENV = "SESSIONFOLD_MODEL_API_KEY_ENV"
ENV_ANTHROPIC_BASE_URL = "ANTHROPIC_BASE_URL"
ENV_OPENAI_API_KEY = "OPENAI_API_KEY"
ENV_MAX_OUTPUT_TOKENS = "SESSIONFOLD_MODEL_MAX_OUTPUT_TOKENS"
ENV_FALLBACK_MODEL = "SESSIONFOLD_MODEL_FALLBACK"
ENV_FALLBACK_BASE_URL = "SESSIONFOLD_MODEL_FALLBACK_BASE_URL"
ENV_FALLBACK_API_KEY = "SESSIONFOLD_MODEL_FALLBACK_API_KEY"
ENV_FALLBACK_MAX_OUTPUT_TOKENS = "SESSIONFOLD_MODEL_FALLBACK_MAX_OUTPUT_TOKENS"
ENV_PRICES = "SESSIONFOLD_MODEL_PRICES"
ENV_STREAM = "SESSIONFOLD_MODEL_STREAM"
ENV_IDLE_TIMEOUT_MS = "SESSIONFOLD_MODEL_IDLE_TIMEOUT_MS"
ENV_MAX_TIMEOUT_MS = "SESSIONFOLD_MODEL_MAX_TIMEOUT_MS"
ENV_MAX_RESPONSE_BYTES = "SESSIONFOLD_MODEL_MAX_RESPONSE_BYTES"

Api = Literal["openai", "anthropic"]
ErrorKind = Literal[
    "timeout-idle", "timeout-ceiling", "http-status", "transport", "malformed", "too-large"
]

#: Statuses worth another attempt: the server is busy, rate-limited or briefly broken.
RETRYABLE_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529})
#: Reference §6.5 defaults.
DEFAULT_IDLE_TIMEOUT_S = 20.0
DEFAULT_MAX_TIMEOUT_S = 180.0
#: Reference §6.6: how long the fallback serves before the primary is probed again.
DEFAULT_FALLBACK_COOLDOWN_S = 600.0
#: The most response-body bytes one attempt reads. A streamed 4,096-token answer is about 1 MiB
#: of server-sent events (each token's chunk repeats the id, model and choice around it).
DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024


# --- endpoints ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Provider:
    """Defaults for a provider named in a `provider/model-id`."""

    base_url: str
    key_envs: tuple[str, ...] = ()
    # OpenAI's newer models refuse `max_tokens`; every other server here accepts it.
    max_tokens_field: str = "max_tokens"
    #: The wire format: `openai` (chat completions) or `anthropic` (Messages).
    api: Api = "openai"
    #: Variables that name the server's base URL, before the default.
    base_url_envs: tuple[str, ...] = ()


PROVIDERS: dict[str, Provider] = {
    "openai": Provider("https://api.openai.com/v1", ("OPENAI_API_KEY",), "max_completion_tokens"),
    "openrouter": Provider("https://openrouter.ai/api/v1", ("OPENROUTER_API_KEY",)),
    "ollama": Provider("http://127.0.0.1:11434/v1"),
    "vllm": Provider("http://127.0.0.1:8000/v1"),
    "llamacpp": Provider("http://127.0.0.1:8080/v1"),
    "llama.cpp": Provider("http://127.0.0.1:8080/v1"),
    # Claude Code's own variables; the default is anthropic_messages.DEFAULT_BASE_URL (not
    # imported: it loads the SDK).
    "anthropic": Provider(
        "https://api.anthropic.com",
        ("ANTHROPIC_API_KEY",),
        api="anthropic",
        base_url_envs=(ENV_ANTHROPIC_BASE_URL,),
    ),
}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One model at one server: what a request needs, and how the model is named in records."""

    model: str
    base_url: str
    api_key: str | None = field(default=None, repr=False)
    #: The model's own output limit; a larger budget asked of it is lowered to this.
    max_output_tokens: int | None = None
    #: The provider prefix it was named with (`openai`, `ollama`, ...), if any.
    provider: str | None = None
    max_tokens_field: str = "max_tokens"
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    api: Api = "openai"

    @property
    def label(self) -> str:
        """`provider/model-id` when named with a provider, else the model id."""
        return f"{self.provider}/{self.model}" if self.provider else self.model

    @property
    def url(self) -> str:
        """The chat-completions (or Messages) URL under the base URL."""
        base = self.base_url.rstrip("/")
        if self.api == "anthropic":
            return f"{base}/messages" if base.endswith("/v1") else _messages_url(base)
        return base if base.endswith("/chat/completions") else f"{base}/chat/completions"


def _messages_url(base: str) -> str:
    return base if base.endswith("/v1/messages") else f"{base}/v1/messages"


def resolve_endpoint(
    name: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    max_output_tokens: int | None = None,
    env: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    api: Api | None = None,
) -> Endpoint:
    """The endpoint of a model named `provider/model-id` (split at the first `/`) or a bare id.

    The base URL is `base_url`, else `SESSIONFOLD_MODEL_BASE_URL`, else the provider's own
    variable (`ANTHROPIC_BASE_URL`), else the named provider's default; a model whose provider
    is unknown needs one of the first two. The API key is `api_key`, else
    `SESSIONFOLD_MODEL_API_KEY`, else the variable `SESSIONFOLD_MODEL_API_KEY_ENV` names (which
    must then be set), else the provider's own variable (`OPENROUTER_API_KEY`,
    `ANTHROPIC_API_KEY`), else, for a chat-completions server, `OPENAI_API_KEY`, else none
    (local servers need none). `api` overrides the wire format the provider implies.
    """
    env = os.environ if env is None else env
    provider_name, model = _split_name(name)
    preset = PROVIDERS.get(provider_name.lower()) if provider_name else None
    base = base_url or env.get(ENV_BASE_URL)
    for variable in preset.base_url_envs if preset else ():
        base = base or env.get(variable)
    base = base or (preset.base_url if preset else None)
    if not base:
        raise ValueError(
            f"no base URL for model {name!r}: set {ENV_BASE_URL} or name a known provider "
            f"({', '.join(sorted(PROVIDERS))})"
        )
    api = api or (preset.api if preset else "openai")
    key = api_key or env.get(ENV_API_KEY)
    named = env.get(ENV_API_KEY_ENV, "").strip()
    if not key and named:
        key = env.get(named)
        if not key:
            # The variable's name is not secret; its value never appears.
            raise ValueError(f"{ENV_API_KEY_ENV} names {named}, which is not set")
    # Another provider's key is never sent to Anthropic.
    last = (ENV_OPENAI_API_KEY,) if api == "openai" else ()
    for variable in (*(preset.key_envs if preset else ()), *last):
        key = key or env.get(variable)
    if max_output_tokens is None:
        max_output_tokens = _env_int(env, ENV_MAX_OUTPUT_TOKENS)
    return Endpoint(
        model=model,
        base_url=base,
        api_key=key or None,
        max_output_tokens=max_output_tokens,
        provider=provider_name or None,
        max_tokens_field=preset.max_tokens_field if preset else "max_tokens",
        headers=tuple((headers or {}).items()),
        api=api,
    )


def resolve_fallback(
    name: str, primary: Endpoint, env: Mapping[str, str] | None = None
) -> Endpoint:
    """The fallback endpoint, named like the primary (`provider/model-id` or a bare id).

    With `SESSIONFOLD_MODEL_FALLBACK_BASE_URL` set, that server (and
    `SESSIONFOLD_MODEL_FALLBACK_API_KEY`). Otherwise a model of the primary's provider, of no
    provider or of an unknown one is served by the primary's server with the primary's key
    (the usual vLLM, Ollama or OpenRouter setup: two models behind one URL); a model of another
    known provider goes to that provider's default URL with that provider's key.
    """
    env = os.environ if env is None else env
    provider_name, _ = _split_name(name)
    provider = provider_name.lower()
    own_base = env.get(ENV_FALLBACK_BASE_URL)
    other_provider = (
        provider in PROVIDERS and provider != (primary.provider or "").lower() and bool(provider)
    )
    same_server = not own_base and not other_provider
    base = own_base or (primary.base_url if same_server else None)
    key = env.get(ENV_FALLBACK_API_KEY) or (primary.api_key if same_server else None)
    # The primary's URL, key and limit variables are not the fallback's.
    primary_only = (ENV_BASE_URL, ENV_API_KEY, ENV_API_KEY_ENV, ENV_MAX_OUTPUT_TOKENS)
    fallback_env = {k: v for k, v in env.items() if k not in primary_only}
    return resolve_endpoint(
        name,
        base_url=base,
        api_key=key,
        max_output_tokens=_env_int(env, ENV_FALLBACK_MAX_OUTPUT_TOKENS),
        env=fallback_env,
        headers=dict(primary.headers) if same_server else None,
        # A model of no provider on the primary's server speaks the primary's API.
        api=primary.api if same_server and not provider_name else None,
    )


def model_urls(name: str, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The URLs a client `HttpModelClient.from_env(name)` would call: the primary's, and the
    fallback's when `SESSIONFOLD_MODEL_FALLBACK` names one. Raises ValueError as `from_env`
    does (no base URL, a key variable named but not set)."""
    env = os.environ if env is None else env
    primary = resolve_endpoint(name, env=env)
    fallback_name = env.get(ENV_FALLBACK_MODEL, "").strip()
    if not fallback_name:
        return (primary.url,)
    return (primary.url, resolve_fallback(fallback_name, primary, env).url)


def _split_name(name: str) -> tuple[str, str]:
    name = name.strip()
    if not name:
        raise ValueError("empty model name")
    provider, slash, model = name.partition("/")
    if not slash:
        return "", name
    if not provider or not model:
        raise ValueError('expected "provider/model-id" or a model id')
    return provider, model


def _env_whole(env: Mapping[str, str], name: str, least: int, expected: str) -> int | None:
    """An integer of at least `least` from the environment, None when unset or blank."""
    value = env.get(name, "").strip()
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name}: {expected}") from None
    if number < least:
        raise ValueError(f"{name}: {expected}")
    return number


def _env_ms(env: Mapping[str, str], name: str, default_s: float) -> int:
    """Milliseconds from the environment (0 disables), else the default."""
    number = _env_whole(env, name, 0, "expected milliseconds (0 disables)")
    return int(default_s * 1000) if number is None else number


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    return _env_whole(env, name, 1, "expected a positive integer")


# --- usage and cost ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one answer cost; `reported` is false when the server sent no usage."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reported: bool = False
    #: Of `prompt_tokens`, those read from and written to the provider's prompt cache
    #: (Anthropic reports them; chat-completions servers leave them 0).
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def plus(self, other: Usage) -> Usage:
        """The sum of two usages (reported when either was)."""
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.reported or other.reported,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )


@dataclass(frozen=True, slots=True)
class Price:
    """A model's price in currency units (usually USD) per million tokens."""

    input_per_mtok: float
    output_per_mtok: float

    def cost(self, usage: Usage) -> float:
        """What `usage` costs at this price."""
        return (
            usage.prompt_tokens * self.input_per_mtok
            + usage.completion_tokens * self.output_per_mtok
        ) / 1_000_000


def parse_prices(text: str) -> dict[str, Price]:
    """Prices from JSON: `{"gpt-4o-mini": {"input": 0.15, "output": 0.6}}` or `[0.15, 0.6]`.

    Keys are model ids or `provider/model-id` labels; values are per million tokens.
    """
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"{ENV_PRICES}: expected a JSON object") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{ENV_PRICES}: expected a JSON object")
    prices: dict[str, Price] = {}
    for model, value in raw.items():
        if isinstance(value, dict):
            pair = (value.get("input"), value.get("output"))
        elif isinstance(value, list | tuple) and len(value) == 2:
            pair = (value[0], value[1])
        else:
            raise ValueError(f"{ENV_PRICES}: price of {model!r} must be {{input, output}}")
        if not all(_is_price(p) for p in pair):
            raise ValueError(f"{ENV_PRICES}: price of {model!r} must be non-negative numbers")
        prices[str(model)] = Price(float(pair[0]), float(pair[1]))  # type: ignore[arg-type]
    return prices


def _is_price(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


# --- answers and errors ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Completion:
    """One answer: its text, what it cost, which model gave it and why it stopped.

    `cost` is None when the model's price is unknown (and the server reported none) or the
    server sent no usage. `fallback` says the fallback model answered; `attempts` counts the
    HTTP calls this answer took (2 after a retry); `max_tokens` is the budget sent.
    """

    text: str
    usage: Usage
    model: str
    finish_reason: str | None
    cost: float | None = None
    fallback: bool = False
    attempts: int = 1
    max_tokens: int | None = None


class ModelError(Exception):
    """A model call that produced no answer. The message names the kind, never any text."""

    def __init__(
        self,
        kind: ErrorKind,
        *,
        model: str,
        status: int | None = None,
        detail: str | None = None,
        seconds: float | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.kind: ErrorKind = kind
        self.model = model
        self.status = status
        self.detail = detail
        self.seconds = seconds
        self.retry_after = retry_after
        super().__init__(self._describe())

    def _describe(self) -> str:
        if self.kind == "timeout-idle":
            return f"model {self.model} stalled (no output for {_secs(self.seconds)})"
        if self.kind == "timeout-ceiling":
            return f"model {self.model} exceeded {_secs(self.seconds)} ceiling"
        if self.kind == "too-large":
            return f"model {self.model} answered more than {self.detail} bytes"
        if self.kind == "http-status":
            status = self.status if self.status is not None else "error"
            return f"model {self.model} answered HTTP {status}" + (
                f" ({self.detail})" if self.detail else ""
            )
        return f"model {self.model} {self.kind}" + (f" ({self.detail})" if self.detail else "")

    @property
    def code(self) -> str:
        """A short code for records: `timeout-idle`, `http-status:503`, `transport`."""
        return f"{self.kind}:{self.status}" if self.status is not None else self.kind

    @property
    def transient(self) -> bool:
        """Worth another attempt: a timeout, a dropped connection, a busy or broken server.

        An authentication or request error (401, 403, 404, 400) is not: a retry would fail
        the same way (reference §6.6 treats auth failures as final). Nor is an answer over
        the size cap: the model answered, and would likely ramble the same way again.
        """
        if self.kind == "too-large":
            return False
        if self.kind != "http-status":
            return True
        return self.status is None or self.status in RETRYABLE_STATUSES


def _secs(seconds: float | None) -> str:
    if seconds is None:
        return "?s"
    return f"{seconds:g}s"


# --- timeouts and the fallback controller -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Per attempt: idle (no bytes for this long), ceiling (whole attempt), connect."""

    idle_s: float | None = DEFAULT_IDLE_TIMEOUT_S
    ceiling_s: float | None = DEFAULT_MAX_TIMEOUT_S
    connect_s: float = 10.0

    @classmethod
    def from_ms(cls, idle_ms: int | None, max_ms: int | None, connect_s: float = 10.0) -> Timeouts:
        """From the config's milliseconds (`summarizerIdleTimeoutMs`, `...MaxTimeoutMs`); 0 off."""
        return cls(
            idle_s=idle_ms / 1000 if idle_ms else None,
            ceiling_s=max_ms / 1000 if max_ms else None,
            connect_s=connect_s,
        )

    @property
    def idle(self) -> float | None:
        """The idle timeout in seconds, None when disabled."""
        return self.idle_s if self.idle_s and self.idle_s > 0 else None

    @property
    def ceiling(self) -> float | None:
        """The ceiling in seconds, None when disabled."""
        return self.ceiling_s if self.ceiling_s and self.ceiling_s > 0 else None


Target = Literal["primary", "probe", "fallback"]


class FallbackController:
    """Reference §6.6: which model a call targets while the primary is failing.

    Not in fallback: the primary. In fallback: the fallback model, except one call per
    cooldown that probes the primary. The choice is made under a lock so that, of several
    concurrent calls, only the first probes. State is in memory only.
    """

    def __init__(
        self,
        cooldown_s: float = DEFAULT_FALLBACK_COOLDOWN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self.in_fallback = False
        self.last_probe_at: float | None = None
        self.warning_owed = False

    def choose(self) -> Target:
        """The target of the next call."""
        with self._lock:
            if not self.in_fallback:
                return "primary"
            now = self._clock()
            if self.last_probe_at is None or now - self.last_probe_at >= self.cooldown_s:
                self.last_probe_at = now
                return "probe"
            return "fallback"

    def primary_ok(self, target: Target, primary: str) -> None:
        """The primary answered; a successful probe ends the fallback."""
        with self._lock:
            if target == "probe" and self.in_fallback:
                self.in_fallback = False
                self.warning_owed = False
                log.info("model recovered", extra={"model_port": {"model": primary}})

    def fallback_ok(self, primary: str, fallback: str) -> None:
        """A steady-state fallback call answered: emit a warning still owed."""
        with self._lock:
            if self.warning_owed:
                self.warning_owed = False
                _warn_fallback(primary, fallback)

    def retry_ok(self, primary: str, fallback: str) -> None:
        """The primary failed and the retry on the fallback answered."""
        with self._lock:
            self.last_probe_at = self._clock()
            if self.warning_owed or not self.in_fallback:
                self.in_fallback = True
                self.warning_owed = False
                _warn_fallback(primary, fallback)

    def retry_failed(self) -> None:
        """The primary failed and so did the retry: fall back, warning when one answers."""
        with self._lock:
            self.last_probe_at = self._clock()
            if not self.in_fallback:
                self.in_fallback = True
                self.warning_owed = True


def _warn_fallback(primary: str, fallback: str) -> None:
    log.warning(
        "model failing, using fallback until it recovers",
        extra={"model_port": {"model": primary, "fallback": fallback}},
    )


# --- the client --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Answer:
    text: str = ""
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    reported_cost: float | None = None


class HttpModelClient:
    """Chat completions against a primary model, with an optional fallback model.

    `stream` (default on) is what makes the idle timeout mean "no stream event for N s";
    without it the idle timeout bounds the wait for the whole answer's first byte.
    `prices` maps model ids or labels to `Price`; `http` may be handed in (tests, proxies).
    With `retry` (default on) a transient failure (timeout, transport, malformed answer, HTTP
    408/409/425/429/5xx) is tried once more: on the fallback model when there is one, else on
    the same model after `retry_wait_s` (a `Retry-After` header is honoured up to
    `max_retry_wait_s`). `fallback_cooldown_s` and `clock` drive the `FallbackController`.
    `max_response_bytes` caps the body one attempt reads (`too-large` past it).
    The client is thread-safe; close it (or use `with`) when done.
    """

    def __init__(
        self,
        primary: Endpoint,
        *,
        fallback: Endpoint | None = None,
        timeouts: Timeouts | None = None,
        stream: bool = True,
        stream_usage: bool = True,
        prices: Mapping[str, Price] | None = None,
        retry: bool = True,
        retry_wait_s: float = 1.0,
        max_retry_wait_s: float = 10.0,
        fallback_cooldown_s: float = DEFAULT_FALLBACK_COOLDOWN_S,
        temperature: float | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        http: httpx.Client | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_response_bytes < 1:
            raise ValueError("max_response_bytes must be positive")
        self.max_response_bytes = max_response_bytes
        self.primary = primary
        self.fallback = fallback
        self.timeouts = timeouts or Timeouts()
        self.stream = stream
        self.stream_usage = stream_usage
        self.prices: dict[str, Price] = dict(prices or {})
        self.retry = retry
        self.retry_wait_s = retry_wait_s
        self.max_retry_wait_s = max_retry_wait_s
        self.temperature = temperature
        self.controller = FallbackController(fallback_cooldown_s, clock)
        if any(e is not None and e.api == "anthropic" for e in (primary, fallback)):
            # The SDK's types take about a second to load: at start, not in the first call
            # (serve's gateway does not wait for a flush's answer).
            importlib.import_module("sessionfold.ports.anthropic_messages")
        self._own_http = http is None
        self._http = http or httpx.Client(
            limits=httpx.Limits(max_connections=16, max_keepalive_connections=8),
            follow_redirects=False,
        )

    @classmethod
    def from_env(
        cls,
        model: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        fallback: str | None = None,
        timeouts: Timeouts | None = None,
        **options: Any,
    ) -> HttpModelClient:
        """A client configured from the environment, each value overridable in code.

        `model` defaults to `SESSIONFOLD_MODEL`; `fallback` to `SESSIONFOLD_MODEL_FALLBACK`;
        prices come from `SESSIONFOLD_MODEL_PRICES` (JSON), streaming from
        `SESSIONFOLD_MODEL_STREAM` (`0` turns it off), the timeouts, when not given, from
        `SESSIONFOLD_MODEL_IDLE_TIMEOUT_MS` / `SESSIONFOLD_MODEL_MAX_TIMEOUT_MS` and the body
        cap from `SESSIONFOLD_MODEL_MAX_RESPONSE_BYTES`.
        """
        env = os.environ if env is None else env
        name = model or env.get(ENV_MODEL, "").strip()
        if not name:
            raise ValueError(f"no model: pass one or set {ENV_MODEL}")
        primary = resolve_endpoint(name, base_url=base_url, api_key=api_key, env=env)
        fallback_name = fallback or env.get(ENV_FALLBACK_MODEL, "").strip()
        fallback_endpoint = resolve_fallback(fallback_name, primary, env) if fallback_name else None
        if timeouts is None:
            timeouts = Timeouts.from_ms(
                _env_ms(env, ENV_IDLE_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_S),
                _env_ms(env, ENV_MAX_TIMEOUT_MS, DEFAULT_MAX_TIMEOUT_S),
            )
        if "prices" not in options and env.get(ENV_PRICES, "").strip():
            options["prices"] = parse_prices(env[ENV_PRICES])
        if "stream" not in options and env.get(ENV_STREAM, "").strip():
            options["stream"] = env[ENV_STREAM].strip().lower() not in {"0", "false", "no", "off"}
        if "max_response_bytes" not in options:
            cap = _env_int(env, ENV_MAX_RESPONSE_BYTES)
            if cap is not None:
                options["max_response_bytes"] = cap
        return cls(primary, fallback=fallback_endpoint, timeouts=timeouts, **options)

    # -- public -------------------------------------------------------------------------------

    @property
    def label(self) -> str:
        """The primary model's label."""
        return self.primary.label

    def close(self) -> None:
        """Close the HTTP connections this client opened."""
        if self._own_http:
            self._http.close()

    def __enter__(self) -> HttpModelClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        response_format: Mapping[str, Any] | None = None,
        *,
        reasoning_effort: str | None = None,
    ) -> Completion:
        """One answer to `messages`, at most `max_tokens` long (lowered to the model's limit).

        Raises `ModelError` when no model answered: the primary's error, or the retry's
        when the retry failed too (reference §6.6 prefers the retry's message).
        """
        if max_tokens < 1:
            raise ValueError("max_tokens must be positive")

        def attempt(endpoint: Endpoint, *, fallback: bool = False, attempts: int = 1) -> Completion:
            return self._attempt(
                endpoint,
                messages,
                max_tokens,
                response_format=response_format,
                reasoning_effort=reasoning_effort,
                fallback=fallback,
                attempts=attempts,
            )

        backup = self.fallback
        if backup is None:
            try:
                return attempt(self.primary)
            except ModelError as exc:
                if not (self.retry and exc.transient):
                    raise
                self._pause(exc)
                return attempt(self.primary, attempts=2)
        target = self.controller.choose()
        if target == "fallback":
            # A failure here changes nothing: the next probe is still due on time (§6.6).
            completion = attempt(backup, fallback=True)
            self.controller.fallback_ok(self.primary.label, backup.label)
            return completion
        try:
            completion = attempt(self.primary)
        except ModelError as exc:
            if not (self.retry and exc.transient):
                raise
            try:
                completion = attempt(backup, fallback=True, attempts=2)
            except ModelError:
                self.controller.retry_failed()
                raise
            self.controller.retry_ok(self.primary.label, backup.label)
            return completion
        self.controller.primary_ok(target, self.primary.label)
        return completion

    # -- one attempt --------------------------------------------------------------------------

    def _pause(self, error: ModelError) -> None:
        wait = self.retry_wait_s
        if error.retry_after is not None:
            wait = max(wait, error.retry_after)
        wait = min(wait, self.max_retry_wait_s)
        if wait > 0:
            time.sleep(wait)

    def _body(
        self,
        endpoint: Endpoint,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        response_format: Mapping[str, Any] | None,
        reasoning_effort: str | None,
    ) -> Mapping[str, Any]:
        if endpoint.api == "anthropic":
            from sessionfold.ports import anthropic_messages  # loads the SDK: only when used

            return anthropic_messages.request_body(
                endpoint.model,
                messages,
                max_tokens,
                stream=self.stream,
                temperature=self.temperature,
            )
        body: dict[str, Any] = {
            "model": endpoint.model,
            "messages": [dict(m) for m in messages],
            endpoint.max_tokens_field: max_tokens,
            "stream": self.stream,
        }
        if self.stream and self.stream_usage:
            body["stream_options"] = {"include_usage": True}
        if response_format is not None:
            body["response_format"] = dict(response_format)
        if reasoning_effort is not None:
            body["reasoning_effort"] = reasoning_effort
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return body

    def _attempt(
        self,
        endpoint: Endpoint,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        *,
        response_format: Mapping[str, Any] | None = None,
        reasoning_effort: str | None = None,
        fallback: bool = False,
        attempts: int = 1,
    ) -> Completion:
        if endpoint.max_output_tokens is not None:
            max_tokens = min(max_tokens, endpoint.max_output_tokens)
        body = self._body(endpoint, messages, max_tokens, response_format, reasoning_effort)
        started = time.monotonic()
        try:
            answer = self._exchange(endpoint, body)
        except ModelError as exc:
            log.warning(
                "model call failed",
                extra={
                    "model_port": {
                        "model": endpoint.label,
                        "kind": exc.kind,
                        "status": exc.status,
                        "detail": exc.detail,
                        "elapsed_ms": round((time.monotonic() - started) * 1000),
                        "fallback": fallback,
                    }
                },
            )
            raise
        cost = self._cost(endpoint, answer)
        log.debug(
            "model call",
            extra={
                "model_port": {
                    "model": endpoint.label,
                    "finish_reason": answer.finish_reason,
                    "prompt_tokens": answer.usage.prompt_tokens,
                    "completion_tokens": answer.usage.completion_tokens,
                    "cache_read_tokens": answer.usage.cache_read_tokens,
                    "cache_write_tokens": answer.usage.cache_write_tokens,
                    "text_chars": len(answer.text),
                    "elapsed_ms": round((time.monotonic() - started) * 1000),
                    "fallback": fallback,
                }
            },
        )
        return Completion(
            text=answer.text,
            usage=answer.usage,
            model=endpoint.label,
            finish_reason=answer.finish_reason,
            cost=cost,
            fallback=fallback,
            attempts=attempts,
            max_tokens=max_tokens,
        )

    def _cost(self, endpoint: Endpoint, answer: _Answer) -> float | None:
        """Configured price first; else the provider's own figure (OpenRouter); else None."""
        price = self.prices.get(endpoint.model) or self.prices.get(endpoint.label)
        if price is not None and answer.usage.reported:
            return price.cost(answer.usage)
        return answer.reported_cost

    def _exchange(self, endpoint: Endpoint, body: Mapping[str, Any]) -> _Answer:
        """POST one request and read its answer under the idle and ceiling timeouts.

        The idle timeout is the socket read timeout: httpx applies it to every read, so it
        fires after that long without a byte. The ceiling is a timer armed once the headers
        are in; when it fires it shuts the socket down, which wakes a blocked read at once.
        Before the headers, the read timeout is the smaller of the two.
        """
        label = endpoint.label
        idle, ceiling = self.timeouts.idle, self.timeouts.ceiling
        read_s = min((t for t in (idle, ceiling) if t is not None), default=None)
        # A read timeout that came from the ceiling (idle off, or not shorter) is the ceiling's.
        read_is_ceiling = ceiling is not None and (idle is None or ceiling <= idle)
        connect_s = min(self.timeouts.connect_s, ceiling) if ceiling else self.timeouts.connect_s
        timeout = httpx.Timeout(connect=connect_s, read=read_s, write=read_s, pool=connect_s)
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if self.stream else "application/json",
            **dict(endpoint.headers),
        }
        if endpoint.api == "anthropic":
            from sessionfold.ports import anthropic_messages

            headers.update(anthropic_messages.request_headers(endpoint.api_key))
        elif endpoint.api_key:
            headers["Authorization"] = f"Bearer {endpoint.api_key}"
        started = time.monotonic()
        deadline = started + ceiling if ceiling else None
        fired = threading.Event()
        timer: threading.Timer | None = None

        def timeout_error(kind: ErrorKind) -> ModelError:
            seconds = ceiling if kind == "timeout-ceiling" else idle
            return ModelError(kind, model=label, seconds=seconds)

        try:
            with self._http.stream(
                "POST", endpoint.url, content=_json_bytes(body), headers=headers, timeout=timeout
            ) as response:
                timer = _arm_ceiling(response, deadline, fired)
                if response.status_code >= 400:
                    raise ModelError(
                        "http-status",
                        model=label,
                        status=response.status_code,
                        retry_after=_retry_after(response.headers.get("retry-after")),
                    )
                content_type = response.headers.get("content-type", "")
                chunks = _capped(response, self.max_response_bytes, label, deadline)
                streamed = "text/event-stream" in content_type
                if endpoint.api == "anthropic":
                    answer = _read_messages(chunks, streamed, label, deadline)
                elif streamed:
                    answer = _read_events(_lines(chunks), label, deadline)
                else:
                    answer = _read_body(b"".join(chunks), label)
        except ModelError as exc:
            # A read cut by the ceiling timer can surface as a cut or garbled stream.
            if exc.kind == "timeout-ceiling" or (fired.is_set() and exc.kind != "http-status"):
                raise timeout_error("timeout-ceiling") from None
            raise
        except httpx.TimeoutException as exc:
            if fired.is_set() or _past(deadline):
                raise timeout_error("timeout-ceiling") from None
            if isinstance(exc, httpx.ReadTimeout):
                kind: ErrorKind = "timeout-ceiling" if read_is_ceiling else "timeout-idle"
                raise timeout_error(kind) from None
            raise ModelError("transport", model=label, detail=type(exc).__name__) from None
        except httpx.HTTPError as exc:
            if fired.is_set():
                raise timeout_error("timeout-ceiling") from None
            raise ModelError("transport", model=label, detail=type(exc).__name__) from None
        finally:
            if timer is not None:
                timer.cancel()
        return answer


def _capped(
    response: httpx.Response, cap: int, label: str, deadline: float | None
) -> Iterator[bytes]:
    """The body's chunks, refused as `too-large` once they add up to more than `cap` bytes.

    A declared Content-Length over the cap is refused before any byte is read. The count is of
    decoded bytes (what would be held), and the ceiling is checked per chunk as well: a body
    dribbled a byte at a time never trips the idle timeout.
    """
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise ModelError("too-large", model=label, detail=str(cap))
    seen = 0
    for chunk in response.iter_bytes():
        seen += len(chunk)
        if seen > cap:
            raise ModelError("too-large", model=label, detail=str(cap))
        if _past(deadline):
            raise ModelError("timeout-ceiling", model=label)
        yield chunk


def _lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """Text lines of a UTF-8 byte stream, ended by CRLF, LF or CR as server-sent events are.

    A line is never longer than the bytes `chunks` let through, so a capped stream bounds it.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    held: list[str] = []  # the start of a line not ended yet
    cr = False  # the last chunk ended in a CR, which may be the first half of a CRLF
    for chunk in chunks:
        text = decoder.decode(chunk)
        if cr:
            text, cr = "\r" + text, False
        if text.endswith("\r"):
            text, cr = text[:-1], True
        parts = _LINE_END.split(text)
        if len(parts) == 1:
            if text:
                held.append(text)
            continue
        yield "".join([*held, parts[0]])
        yield from parts[1:-1]
        held = [parts[-1]] if parts[-1] else []
    rest = "".join(held) + decoder.decode(b"", final=True)
    if rest or cr:
        yield rest


_LINE_END = re.compile(r"\r\n|\n|\r")


def _read_messages(
    chunks: Iterator[bytes], streamed: bool, label: str, deadline: float | None
) -> _Answer:
    """An Anthropic Messages answer, whole or streamed, in the port's terms."""
    from sessionfold.ports import anthropic_messages as wire

    def tick() -> None:
        if _past(deadline):
            # A server that trickles bytes never trips the read timeout; the clock decides.
            raise ModelError("timeout-ceiling", model=label)

    try:
        if streamed:
            got = wire.read_events(_sse_data(_lines(chunks)), tick)
        else:
            got = wire.read_message(b"".join(chunks))
    except wire.MessagesFormat as exc:
        kind: ErrorKind = "transport" if exc.detail == "stream-cut" else "malformed"
        raise ModelError(kind, model=label, detail=exc.detail) from None
    except wire.MessagesApiError as exc:
        raise ModelError(
            "http-status", model=label, status=exc.status, detail="error-in-answer"
        ) from None
    usage = Usage(
        got.input_tokens,
        got.output_tokens,
        got.reported,
        got.cache_read_tokens,
        got.cache_write_tokens,
    )
    return _Answer(got.text, got.finish_reason, usage)


def _json_bytes(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _arm_ceiling(
    response: httpx.Response, deadline: float | None, fired: threading.Event
) -> threading.Timer | None:
    """Start the ceiling timer: at the deadline, flag it and shut the socket down."""
    if deadline is None:
        return None
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None

    def fire() -> None:
        fired.set()
        if isinstance(sock, socket.socket):
            # Already closed means the read has ended anyway.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(max(0.0, deadline - time.monotonic()), fire)
    timer.daemon = True
    timer.start()
    return timer


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: not worth parsing for a capped pause
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _read_usage(raw: Any) -> tuple[Usage, float | None]:
    if not isinstance(raw, dict):
        return Usage(), None
    prompt, completion = raw.get("prompt_tokens"), raw.get("completion_tokens")
    cost = raw.get("cost")
    reported_cost = float(cost) if _is_price(cost) else None
    if isinstance(prompt, int) and isinstance(completion, int):
        return Usage(prompt, completion, True), reported_cost
    return Usage(), reported_cost


def _provider_error(data: dict[str, Any], label: str) -> ModelError:
    """An error object in a 200 answer (OpenRouter mid-stream, some proxies): its code only."""
    error = data.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and 100 <= code < 600 else None
    return ModelError("http-status", model=label, status=status, detail="error-in-answer")


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _read_body(raw: bytes, label: str) -> _Answer:
    """A non-streamed answer."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise ModelError("malformed", model=label, detail="not-json") from None
    if not isinstance(data, dict):
        raise ModelError("malformed", model=label, detail="not-an-object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        if "error" in data:
            raise _provider_error(data, label)
        raise ModelError("malformed", model=label, detail="no-choices")
    choice = choices[0]
    message = choice.get("message")
    text = _content_text(message.get("content")) if isinstance(message, dict) else ""
    usage, cost = _read_usage(data.get("usage"))
    finish = choice.get("finish_reason")
    return _Answer(text, finish if isinstance(finish, str) else None, usage, cost)


def _sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The data of each server-sent event (multi-line data joined; comments skipped)."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            yield ""  # a comment (keep-alive): no data, but the caller checks its clock
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def _read_events(lines: Iterator[str], label: str, deadline: float | None) -> _Answer:
    """A streamed answer: content deltas of choice 0, its finish reason, the usage chunk."""
    answer = _Answer()
    parts: list[str] = []
    done = False
    for data in _sse_data(lines):
        if _past(deadline):
            # A server that trickles bytes never trips the read timeout; the clock decides.
            raise ModelError("timeout-ceiling", model=label)
        if not data:
            continue
        if data.strip() == "[DONE]":
            done = True
            break
        try:
            chunk = json.loads(data)
        except (json.JSONDecodeError, RecursionError):  # the json module recurses per level
            raise ModelError("malformed", model=label, detail="bad-event") from None
        if not isinstance(chunk, dict):
            raise ModelError("malformed", model=label, detail="bad-event")
        if "error" in chunk and not chunk.get("choices"):
            raise _provider_error(chunk, label)
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                text = _content_text(delta.get("content"))
                if text:
                    parts.append(text)
            finish = choice.get("finish_reason")
            if isinstance(finish, str):
                answer.finish_reason = finish
        if chunk.get("usage"):
            answer.usage, answer.reported_cost = _read_usage(chunk["usage"])
    if not done and answer.finish_reason is None:
        raise ModelError("transport", model=label, detail="stream-cut")
    answer.text = "".join(parts)
    return answer
