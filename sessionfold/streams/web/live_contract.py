"""The live API's contract, shared by `sessionfold serve` (live_api.py) and the fold workers
(live_worker.py): request checks and answer bodies, pure over a rendered view and a Store.

Both servers answer the same JSON for the same session state (docs/live.md); what differs is
only where the entries and the state come from (a tailed file, or session-events and the
worker's table).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Histogram

from sessionfold.projections.pruning import session as pruning
from sessionfold.projections.store import Store
from sessionfold.projections.views.context import (
    ContextView,
    Identity,
    message_identities,
    patch_of,
)
from sessionfold.projections.views.rewrite import chain_plan, rewrite_plan
from sessionfold.projections.views.status import footer
from sessionfold.streams.runtime.ledger_loop import compaction_entries

#: How long a context call waits for its leaf by default, seconds.
DEFAULT_WAIT_S = 30.0
#: How long a call for a session nobody has seen waits for it to appear, seconds: pi writes a
#: new session's file only once its first model call has answered, so there is nothing to
#: prune yet and the call is answered `unknown-session` (not stale) soon.
UNKNOWN_GRACE_S = 0.25
#: How often a waiting call looks again, seconds.
WAIT_STEP_S = 0.01
#: Longest session id, ref or leaf id accepted.
MAX_ID_CHARS = 256
#: Most refs one recall names.
MAX_RECALL_IDS = 100
#: Longest `sessionFile` a context call may name.
MAX_PATH_CHARS = 4096
#: A context answer's `reason` when the session is in no watched file and the `sessionFile`
#: the call named (if any) lies under no allowed root (serve's `--allow-root`), or is no file.
NOT_WATCHED = "not-watched"
#: Largest context call body read (a larger one is answered 413 unread). The extension sends
#: the array's shape (28 KB at 914 messages of the shared large-session.jsonl) or, when a
#: message has no string role or tool call id, the whole array (0.85 to 0.9 MB for the shared
#: sessions; 1.3 MB for 320k tokens); images ride in it base64, and a model's API refuses a
#: request much past this (Anthropic's: 32 MB), so pi never holds a larger array for one call.
MAX_CONTEXT_BODY_BYTES = 32 * 1024 * 1024
#: Largest body of every other route (a recall's 100 ids of 256 characters is 27 KB; a
#: compact's and a client event's are a few hundred bytes).
MAX_SMALL_BODY_BYTES = 64 * 1024
#: Largest request body any live route reads (aiohttp's `client_max_size` of the apps; each
#: route reads within its own, smaller or equal: web/live_api.py `bounded_middleware`). Only
#: a caller past the token guard gets its body read.
MAX_BODY_BYTES = MAX_CONTEXT_BODY_BYTES
#: How long a request may take to send its headers, and then its body, and how long an idle
#: connection is kept open, by default, seconds (serve's `--read-timeout`).
READ_TIMEOUT_S = 10.0


#: The fail-opens the pi extension reports (`client-events`).
FAIL_OPEN_KINDS = ("unreachable", "timeout", "bad-answer", "http-error")
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0)


@dataclass(frozen=True, slots=True)
class LiveMetrics:
    """The live calls, for Prometheus: by route and answer, never by session; the fail-opens
    the extension reports, by kind."""

    registry: CollectorRegistry
    calls: Counter
    seconds: Histogram
    fail_opens: Counter
    files_set_aside: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> LiveMetrics:
        """The metrics over `registry`."""
        return cls(
            registry,
            Counter(
                "sessionfold_live_calls",
                "Live API calls by route and answer (changed, unchanged, stale, ...).",
                ["route", "outcome"],
                registry=registry,
            ),
            Histogram(
                "sessionfold_live_call_seconds",
                "Time to answer a live API call, waiting included.",
                ["route"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            ),
            Counter(
                "sessionfold_live_fail_opens",
                "Fail-opens the pi extension reported (it kept pi's own context).",
                ["kind"],
                registry=registry,
            ),
            Counter(
                "sessionfold_live_files_set_aside",
                "Session files serve set aside after a fault reading or folding them (each "
                "until it changes; the other sessions go on).",
                registry=registry,
            ),
        )

    def fail_open(self, kind: Any) -> None:
        """Count one fail-open the extension reported (`kind` one of `FAIL_OPEN_KINDS`, else
        `other`: the label stays bounded whatever a client sends)."""
        self.fail_opens.labels(kind if kind in FAIL_OPEN_KINDS else "other").inc()

    def observe(self, route: str, outcome: str, seconds: float) -> None:
        """Count one answered call of `route` and its time."""
        self.seconds.labels(route).observe(seconds)
        self.calls.labels(route, outcome).inc()


def outcome(answer: dict[str, Any]) -> str:
    """A context answer's metric outcome: stale, changed or unchanged."""
    return "stale" if answer["stale"] else "changed" if answer["changed"] else "unchanged"


class BadRequest(ValueError):
    """A request body the contract refuses (a 400); the message says what is wanted."""


def is_id(value: Any) -> bool:
    """Whether `value` is a non-empty string of at most `MAX_ID_CHARS` characters."""
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS


@dataclass(frozen=True, slots=True)
class ContextRequest:
    """A context call: the leaf, pi's array as identities, how long to wait, and whether the
    answer is wanted as a patch to pi's array rather than the whole array."""

    leaf: str | None
    shape: list[Identity]
    wait_s: float
    patch: bool = False
    #: The session's file as the client knows it (`sessionFile`): serve tails it when it
    #: holds no file of the session and the file lies under an allowed root.
    session_file: str | None = None


def context_request(
    body: dict[str, Any],
    default_wait_s: float,
    known: tuple[list[list[str | None]], list[Identity]] | None = None,
) -> ContextRequest:
    """A context request's fields; BadRequest when the body is not one.

    pi's array comes as `shape` (each message's `[role, toolCallId]`, what the check reads: a
    few bytes per message) or whole as `messages` (megabytes in a long session, parsed only to
    be checked). `"answer": "patch"` asks for the changed array as a patch (`patch_of`).
    `known`: a shape as JSON gives it and its identities; a `shape` equal to it is taken as
    those identities, unchecked again (serve's API process: pi's array most often matches)."""
    leaf = body.get("leaf")
    shape = body.get("shape")
    messages = body.get("messages")
    wait_ms = body.get("wait_ms")
    form = body.get("answer", "messages")
    session_file = body.get("sessionFile")
    if (leaf is not None and not is_id(leaf)) or form not in ("messages", "patch"):
        raise BadRequest(_WANT)
    if session_file is not None and not (
        isinstance(session_file, str) and 0 < len(session_file) <= MAX_PATH_CHARS
    ):
        raise BadRequest(_WANT)
    if shape is not None:
        identities = known[1] if known is not None and shape == known[0] else _identities(shape)
    elif isinstance(messages, list):
        identities = message_identities(messages)
    else:
        raise BadRequest(_WANT)
    wait = default_wait_s
    if isinstance(wait_ms, int | float) and not isinstance(wait_ms, bool):
        wait = max(0.0, wait_ms / 1000)
    return ContextRequest(leaf, identities, wait, form == "patch", session_file)


_WANT = (
    "want {leaf: string or null, shape: array of [role, toolCallId or null]}"
    " (or messages: array instead of shape; answer: messages or patch;"
    f" sessionFile: an absolute path of at most {MAX_PATH_CHARS} characters)"
)


def _identities(shape: Any) -> list[Identity]:
    """A request's `shape` as identities; BadRequest unless every item is [string, string or
    null]."""
    if not isinstance(shape, list):
        raise BadRequest(_WANT)
    identities = []
    for item in shape:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], str)
            or not (item[1] is None or isinstance(item[1], str))
        ):
            raise BadRequest(_WANT)
        identities.append((item[0], item[1]))
    return identities


def recall_request(body: dict[str, Any]) -> list[str]:
    """The ids a recall request names; BadRequest otherwise."""
    ids = body.get("ids")
    if not isinstance(ids, list) or not ids or len(ids) > MAX_RECALL_IDS:
        raise BadRequest(f"want {{ids: a non-empty array of at most {MAX_RECALL_IDS} strings}}")
    if not all(is_id(i) for i in ids):
        raise BadRequest(f"every id is a string of at most {MAX_ID_CHARS} characters")
    return ids


def recall_whole(body: dict[str, Any]) -> bool:
    """Whether a recall asks for every output whole (`"whole": true`, the MCP server, which
    pages the text itself) rather than cut to pi's defaults; BadRequest when not a boolean."""
    whole = body.get("whole", False)
    if not isinstance(whole, bool):
        raise BadRequest("whole is a boolean")
    return whole


def epoch_of(store: Store, session_id: str) -> int:
    """The session's flush attempts folded so far: the rendered context moves with it.

    Read from the state (the pruning head), so every runtime and every restart agrees.
    """
    return int(pruning.load_head(store, session_id)["attempts"])


def same_messages(ours: list[Identity], theirs: list[Identity]) -> bool:
    """Whether pi's array is the log's context: the same roles and tool call ids in order."""
    return ours is theirs or ours == theirs


def context_answer(
    session_id: str,
    request: ContextRequest,
    view: ContextView,
    epoch: int,
    stale: bool,
    tokens: dict[str, int] | None = None,
    unpruned_shape: list[Identity] | None = None,
    with_array: bool = True,
) -> dict[str, Any]:
    """The context route's answer for a rendered `view` (docs/live.md); `tokens` and
    `unpruned_shape` are the view's when the caller has them already (serve keeps them with
    its render). A changed array comes as `messages`, or as `patch` when the request asks;
    without `with_array` it is left to the caller (serve splices in one encoded per render)."""
    if unpruned_shape is None:
        unpruned_shape = message_identities(view.unpruned)
    answer = context_head(
        session_id,
        request,
        epoch,
        stale,
        view.tokens if tokens is None else tokens,
        unpruned_shape,
        lambda: view.messages != view.unpruned,
    )
    if answer["changed"] and with_array:
        if request.patch:
            answer["patch"] = patch_of(view.messages, view.unpruned)
        else:
            answer["messages"] = view.messages
    return answer


def context_head(
    session_id: str,
    request: ContextRequest,
    epoch: int,
    stale: bool,
    tokens: dict[str, int],
    unpruned_shape: list[Identity],
    pruned: Callable[[], bool],
) -> dict[str, Any]:
    """A context answer's fields but its array, from what a render gives: its tokens, its
    unpruned array's shape and whether its array differs from the unpruned one (`pruned`,
    asked only when pi's array matches). serve's API process answers from these alone."""
    answer: dict[str, Any] = {
        "session_id": session_id,
        "leaf": request.leaf,
        "changed": False,
        "stale": stale,
        "reason": None,
        "epoch": epoch,
        "tokens": tokens,
    }
    if not same_messages(request.shape, unpruned_shape):
        answer["reason"] = "mismatch"  # pi holds messages the log does not (yet): keep its own
    elif pruned():
        # Not only what the render phases pruned: the per-batch summaries pi-condense would
        # have logged are in no log, so a context with them differs from pi's own array.
        answer["changed"] = True
    return answer


def unchanged(
    session_id: str, leaf: str | None, epoch: int, reason: str, stale: bool
) -> dict[str, Any]:
    """A context answer that keeps pi's own array, for `reason`."""
    return {
        "session_id": session_id,
        "leaf": leaf,
        "changed": False,
        "stale": stale,
        "reason": reason,
        "epoch": epoch,
        "tokens": None,
    }


def fallback(reason: str) -> dict[str, Any]:
    """A compact answer that lets pi's own compaction run."""
    return {"status": "fallback", "reason": reason}


def compact_answer(payload: dict[str, Any] | None) -> dict[str, Any]:
    """The compact route's answer for the last pass payload (None: no pass ran)."""
    if payload is None or payload.get("record") is None:
        return fallback("nothing-to-compact")
    if payload["record"]["trigger"] != "compact-request":
        return fallback("nothing-to-compact")
    if payload.get("fallback") is not None:
        return fallback(str(payload["fallback"]))
    compaction, span_record = compaction_entries(payload)
    return {
        "status": "summary",
        "summary": compaction["summary"],
        "details": compaction["details"],
        "span_record": span_record,
    }


def status_answer(
    session_id: str,
    store: Store,
    document: dict[str, Any],
    reclaim: dict[str, int] | None,
) -> dict[str, Any]:
    """The status route's answer from the session document and its pruning head."""
    head = pruning.load_head(store, session_id)
    attempts = document["flush_attempts"]
    pending = document["pending_batches"]
    return {
        "session_id": session_id,
        "known": True,
        "epoch": int(head["attempts"]),
        "pending": pending,
        "rearmed": bool(head["rearmed"]),
        "metrics": document["metrics"],
        "last_flush": attempts[-1] if attempts else None,
        "footer": footer(pending, document["metrics"], reclaim),
    }


def unknown_status(session_id: str) -> dict[str, Any]:
    """The status of a session the server has not seen."""
    return {"session_id": session_id, "known": False, "footer": "prune: ON"}


def plan_json(session_id: str, view: ContextView, epoch: int) -> bytes:
    """The plan route's answer for a rendered `view`, encoded (docs/live.md, "The gateway"):
    the results the render took out, by tool call id, and its compressed chains
    (views/rewrite.py)."""
    plan = {"session": session_id, "known": True, "epoch": epoch}
    return orjson.dumps({**plan, "results": rewrite_plan(view), "chains": chain_plan(view)})


def unknown_plan(session_id: str) -> bytes:
    """The plan route's answer for a session the server holds nothing of."""
    return orjson.dumps({"session": session_id, "known": False, "results": {}, "chains": []})


def plan_tag(encoded: bytes) -> str:
    """The entity tag of an encoded plan (its `ETag`, quoted): a digest of its bytes, so a
    client computes it from the body it got, even through a proxy that drops headers."""
    return '"' + hashlib.blake2b(encoded, digest_size=12).hexdigest() + '"'


def not_modified(if_none_match: str | None, encoded: bytes) -> bool:
    """Whether a plan request's `If-None-Match` names this plan (then: 304, no body)."""
    if not if_none_match:
        return False
    tag = plan_tag(encoded)
    return any(part.strip() in (tag, "W/" + tag) for part in if_none_match.split(","))
