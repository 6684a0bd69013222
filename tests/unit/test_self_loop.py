"""serve refuses, at start, a model whose URL is its own address: every summary call would come
back through its gateway (a Claude Code user's `ANTHROPIC_BASE_URL` often points there)."""

from __future__ import annotations

import os
import subprocess

from hypothesis import given
from hypothesis import strategies as st
from serve_process import CLI

from sessionfold.streams.cli.self_loop import calls_itself
from sessionfold.streams.tools.broker import free_port_pair

LOOPBACKS = ("127.0.0.1", "localhost", "127.0.0.2", "[::1]")


@given(
    host=st.sampled_from(LOOPBACKS),
    bind=st.sampled_from(("127.0.0.1", "0.0.0.0", "::1", "localhost")),
    port=st.integers(min_value=1, max_value=65535),
    other=st.integers(min_value=1, max_value=65535),
)
def test_a_loopback_url_on_serves_port_calls_itself(
    host: str, bind: str, port: int, other: int
) -> None:
    """Any loopback name on serve's port is serve when it listens on loopback or everywhere;
    another port never is."""
    assert calls_itself(f"http://{host}:{port}/v1", bind, port)
    assert calls_itself(f"http://{host}:{other}", bind, port) == (other == port)


def test_urls_elsewhere_or_on_port_zero_are_not_serve() -> None:
    """Another host, a scheme's default port, or a port not yet chosen (0) is not a loop."""
    assert not calls_itself("https://api.anthropic.com", "127.0.0.1", 6068)
    assert calls_itself("http://localhost", "127.0.0.1", 80)
    assert not calls_itself("http://10.1.2.3:6068", "127.0.0.1", 6068)
    assert calls_itself("http://10.1.2.3:6068", "10.1.2.3", 6068)
    assert not calls_itself("http://127.0.0.1:6068", "10.1.2.3", 6068)
    assert not calls_itself("http://127.0.0.1:0", "127.0.0.1", 0)


def _serve(port: int, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "SESSIONFOLD_"))
    }
    return subprocess.run(
        [*CLI, "serve", "--port", str(port), *args],
        env={**environ, **env},
        capture_output=True,
        timeout=60,
    )


def test_serve_refuses_a_summarizer_pointed_at_itself(tmp_path: object) -> None:
    """ANTHROPIC_BASE_URL at serve's own port: exit 2 naming the loop, before anything starts
    (and the key is not printed)."""
    port = free_port_pair()
    env = {"ANTHROPIC_BASE_URL": f"http://localhost:{port}", "ANTHROPIC_API_KEY": "sk-SECRET"}
    done = _serve(port, env, "--set", "summarizerModel=anthropic/claude-haiku-4-5", str(tmp_path))
    assert done.returncode == 2, done.stderr
    err = done.stderr.decode()
    assert "summarizerModel anthropic/claude-haiku-4-5 would call" in err
    assert "which is this serve" in err and "sk-SECRET" not in err
    ledger = _serve(port, env, "--ledger-model", "anthropic/claude-haiku-4-5", str(tmp_path))
    assert ledger.returncode == 2 and b"--ledger-model" in ledger.stderr
    fallback = {
        **env,
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
        "SESSIONFOLD_MODEL_FALLBACK": "x",
    }
    fallback["SESSIONFOLD_MODEL_FALLBACK_BASE_URL"] = f"http://127.0.0.1:{port}"
    looped = _serve(
        port, fallback, "--set", "summarizerModel=anthropic/claude-haiku-4-5", str(tmp_path)
    )
    assert looped.returncode == 2 and b"which is this serve" in looped.stderr
