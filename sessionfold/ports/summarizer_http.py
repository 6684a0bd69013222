"""The model port over OpenAI-compatible HTTP: batch summaries from a real model.

`HttpSummarizer.summarize` answers a flush request the way reference §6 describes: one call per
batch the fold sends to the model, with the per-batch prompt of §6.1 as a single user message;
a usable answer (non-blank, not cut off at the output limit, §6.3) gets its `[[N:name]]` labels
replaced by the batch's refs and the footer appended (§6.4). Timeouts, the one retry and the
fallback model (§6.5, §6.6) are the HTTP core's (`model_http`).

A model outage never loses a batch: a batch whose call failed is answered `failed` with a short
code (`timeout-idle`, `http-status:503`, ...), so the fold leaves its frontier where it was and
captures the batch again at its next flush. `summarize` never raises.

`summarizer_for(config)` picks the port a pruning configuration names: `offline`, an
OpenAI-compatible model or an Anthropic one (`provider/model-id`, `anthropic/claude-haiku-4-5`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sessionfold.events.flush import (
    BatchResult,
    CompactionPayload,
    FlushBatch,
    FlushRequestPayload,
    ModelUsage,
)
from sessionfold.ports.model_http import Completion, HttpModelClient, ModelError, Timeouts
from sessionfold.ports.summarizer import (
    ModelPort,
    OfflineSummarizer,
    batch_prompt,
    substitute_inline_refs,
    summary_footer,
)
from sessionfold.projections.pruning.config import PruneConfig

log = logging.getLogger(__name__)

#: Output budget of one batch summary; a summary must be shorter than its batch anyway.
DEFAULT_SUMMARY_MAX_TOKENS = 4_096


def reasoning_effort(thinking: str) -> str | None:
    """The `reasoning_effort` a flush request's `thinking` asks for (reference §6.3).

    `default` sends none; `off` sends none either (pi sends the key with no value, which JSON
    cannot say); every other level passes through.
    """
    return None if thinking in ("default", "off") else thinking


class HttpSummarizer:
    """`ModelPort` over an `HttpModelClient`.

    Batches are summarized one at a time by default, stopping at the first failure: the fold
    keeps nothing after a failed batch (reference §5.5 step 10), so later calls would be paid
    for and thrown away. With `concurrency` > 1 they run in parallel, as pi-condense's
    automatic flushes do, and every batch is attempted.
    """

    def __init__(
        self,
        client: HttpModelClient,
        *,
        max_tokens: int = DEFAULT_SUMMARY_MAX_TOKENS,
        concurrency: int = 1,
    ) -> None:
        if max_tokens < 1 or concurrency < 1:
            raise ValueError("max_tokens and concurrency must be positive")
        self.client = client
        self.max_tokens = max_tokens
        self.concurrency = concurrency

    @property
    def model(self) -> str:
        """The primary model's label."""
        return self.client.label

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()

    def __enter__(self) -> HttpSummarizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def summarize(self, request: FlushRequestPayload) -> CompactionPayload:
        """Answer a flush request: a summary or a failure per model batch; skips echoed."""
        effort = reasoning_effort(request.thinking)
        wanted = [n for n, b in enumerate(request.batches) if b.disposition == "summarize"]
        answers: dict[int, tuple[BatchResult, str | None]] = {}
        if self.concurrency > 1 and len(wanted) > 1:
            with ThreadPoolExecutor(min(self.concurrency, len(wanted))) as pool:
                futures = {
                    n: pool.submit(self._batch, n, request.batches[n], effort) for n in wanted
                }
                answers = {n: future.result() for n, future in futures.items()}
        else:
            failed = False
            for n in wanted:
                if failed:
                    skipped = BatchResult(batch=n, outcome="failed", error="not-attempted")
                    answers[n] = (skipped, None)
                    continue
                answers[n] = self._batch(n, request.batches[n], effort)
                failed = answers[n][0].outcome == "failed"
        results = tuple(
            answers[n][0] if n in answers else BatchResult(batch=n, outcome=batch.disposition)
            for n, batch in enumerate(request.batches)
        )
        usage = ModelUsage()
        for result in results:
            usage = usage.plus(result.usage)
        # The model that answered: the primary, the fallback, or both in batch order.
        answered = [model for _, model in (answers[n] for n in sorted(answers)) if model]
        return CompactionPayload(
            request_id=request.request_id,
            session_id=request.session_id,
            model=",".join(dict.fromkeys(answered)) or self.client.label,
            results=results,
            usage=usage,
        )

    # -- one batch ---------------------------------------------------------------------------

    def _batch(
        self, number: int, batch: FlushBatch, effort: str | None
    ) -> tuple[BatchResult, str | None]:
        """One batch's call and post-processing, and the model that answered (None if none).

        A failure is a result, never an exception.
        """
        messages = [{"role": "user", "content": batch_prompt(batch)}]
        try:
            completion = self.client.complete(messages, self.max_tokens, reasoning_effort=effort)
        except ModelError as exc:
            _log(number, "failed", exc.code)
            return BatchResult(batch=number, outcome="failed", error=exc.code), None
        except Exception as exc:  # the port must answer whatever breaks below it
            code = f"error:{type(exc).__name__}"
            _log(number, "failed", code)
            return BatchResult(batch=number, outcome="failed", error=code), None
        usage = _usage(completion)
        if completion.finish_reason in _UNUSABLE or not completion.text.strip():
            # Unusable (§6.3): cut off at the output limit, refused, or nothing said. Not retried.
            code = _UNUSABLE.get(completion.finish_reason or "", "unusable-empty")
            _log(number, "failed", code, completion)
            failed = BatchResult(batch=number, outcome="failed", error=code, usage=usage)
            return failed, completion.model
        refs = tuple(call.ref or call.tool_call_id for call in batch.calls)
        names = [call.tool_name for call in batch.calls]
        text = substitute_inline_refs(completion.text, refs, names) + summary_footer(refs)
        _log(number, "summarized", None, completion)
        summary = BatchResult(batch=number, outcome="summarized", text=text, refs=refs, usage=usage)
        return summary, completion.model


#: Finish reasons whose answer is no summary, whatever text came with it, and their codes.
_UNUSABLE = {"length": "unusable-length", "content_filter": "unusable-refusal"}


def _log(number: int, outcome: str, code: str | None, completion: Completion | None = None) -> None:
    """One record per batch: outcome, error code, model and tokens; never text."""
    detail: dict[str, Any] = {"batch": number, "outcome": outcome, "error": code}
    if completion is not None:
        detail.update(
            model=completion.model,
            fallback=completion.fallback,
            prompt_tokens=completion.usage.prompt_tokens,
            completion_tokens=completion.usage.completion_tokens,
            cache_read_tokens=completion.usage.cache_read_tokens,
            cache_write_tokens=completion.usage.cache_write_tokens,
        )
    log.info("summarizer batch", extra={"summarizer": detail})


def _usage(completion: Completion) -> ModelUsage:
    """A completion's usage as the compaction records it.

    `ModelUsage.cost` is a number: an unknown cost (no price configured, none reported)
    counts as 0 there; the `Completion` itself keeps None.
    """
    return ModelUsage(
        input_tokens=completion.usage.prompt_tokens,
        output_tokens=completion.usage.completion_tokens,
        cost=completion.cost or 0.0,
        calls=1,
        cache_read_tokens=completion.usage.cache_read_tokens,
        cache_write_tokens=completion.usage.cache_write_tokens,
    )


def summarizer_for(
    config: PruneConfig,
    *,
    env: Mapping[str, str] | None = None,
    **client_options: Any,
) -> ModelPort:
    """The model port a pruning config names: offline, or HTTP to `summarizerModel`.

    The HTTP client takes its timeouts from `summarizerIdleTimeoutMs` / `...MaxTimeoutMs`
    and everything else (base URL, key, fallback, prices) from the environment; see
    `HttpModelClient.from_env`. `client_options` are passed on to it.
    """
    if config.summarizerModel == "offline":
        return OfflineSummarizer()
    env = os.environ if env is None else env
    client_options.setdefault(
        "timeouts",
        Timeouts.from_ms(config.summarizerIdleTimeoutMs, config.summarizerMaxTimeoutMs),
    )
    client = HttpModelClient.from_env(config.summarizerModel, env=env, **client_options)
    return HttpSummarizer(client)
