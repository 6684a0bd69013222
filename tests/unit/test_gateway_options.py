"""The gateway's options are one set, on `sessionfold serve` and `sessionfold worker` alike
(cli/options.py): the same flags, variables, help and defaults, and the same refusal of an
upstream that is not an http(s) URL, before anything starts."""

from __future__ import annotations

import gc
import logging
from typing import Any

import pytest
from typer.testing import CliRunner

from sessionfold.streams.cli import app, load_command

FLAGS = ("--anthropic-upstream", "--openai-upstream", "--min-freed-tokens", "--cache-ttl")


def _options(command: Any) -> dict[str, tuple[object, ...]]:
    found = {}
    for param in command.params:
        if param.param_type_name == "option" and param.opts[0] in FLAGS:
            found[param.opts[0]] = (param.envvar, param.help, param.default)
    return found


def test_serve_and_worker_share_the_gateways_options() -> None:
    serve, worker = _options(load_command("serve")), _options(load_command("worker"))
    assert set(serve) == set(FLAGS)
    assert worker == serve


@pytest.mark.parametrize("command", ["serve", "worker"])
@pytest.mark.parametrize("flag", ["--anthropic-upstream", "--openai-upstream"])
def test_an_upstream_that_is_no_http_url_is_refused(command: str, flag: str) -> None:
    callbacks, filters = list(gc.callbacks), list(logging.getLogger("aiohttp.server").filters)
    result = CliRunner().invoke(app, [command, flag, "ftp://example.com"])
    assert result.exit_code == 2
    assert "upstream wants an http(s) URL" in result.output
    # Refused before anything changed in the process: serve's gc policy and log filter made
    # later tests in the same process fail (test_heap, test_web_auth).
    assert gc.callbacks == callbacks
    assert logging.getLogger("aiohttp.server").filters == filters
