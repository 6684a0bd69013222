"""`sessionfold state SESSION`: one session's state from a running fold worker's state API.

Any fold worker of the app can be asked (`--url`, env `SESSIONFOLD_STATE_URL`): the one owning
the session's partition answers. `--json` prints the API's document with sorted keys: the same
shape as one session of `sessionfold fold --json`. `--flushes` shows the flush attempts,
`--ref tN` the original tool output a summary ref stands for. The API token (`--api-token`,
env `SESSIONFOLD_API_TOKEN`, or `--api-token-file`) is sent as `Authorization: Bearer`. Exit 1
for an unknown session or ref, a refused token, or a worker that cannot answer; 2 for a usage
error.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import httpx
import orjson
import typer
from rich.console import Console
from rich.table import Table

from sessionfold.streams.cli.options import ApiToken, ApiTokenFile, api_token_or_exit
from sessionfold.streams.cli.session_table import session_table

DEFAULT_URL = "http://127.0.0.1:6066"


def register(app: typer.Typer) -> None:
    """Attach the `state` command to the root app."""

    @app.command("state")
    def state(
        session: Annotated[str, typer.Argument(help="Session id.")],
        url: Annotated[
            str,
            typer.Option(
                "--url", envvar="SESSIONFOLD_STATE_URL", help="Base URL of any fold worker."
            ),
        ] = DEFAULT_URL,
        flushes: Annotated[
            bool, typer.Option("--flushes", help="Show the flush attempts instead.")
        ] = False,
        ref: Annotated[
            str | None,
            typer.Option("--ref", help="Show the original tool output behind a ref (e.g. t3)."),
        ] = None,
        as_json: Annotated[
            bool, typer.Option("--json", help="Print the API's JSON document.")
        ] = False,
        timeout: Annotated[
            float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the worker.")
        ] = 30.0,
        api_token: ApiToken = None,
        api_token_file: ApiTokenFile = None,
    ) -> None:
        """Print one session's projections (or flushes, or a ref's original) from a worker."""
        err = Console(stderr=True)
        if flushes and ref is not None:
            err.print("[red]--flushes and --ref exclude each other[/]")
            raise typer.Exit(2)
        token = api_token_or_exit(err, api_token, api_token_file)
        path = f"/sessions/{quote(session, safe='')}"
        if flushes:
            path += "/flushes"
        elif ref is not None:
            path += f"/refs/{quote(ref, safe='')}"
        document = _fetch(err, url.rstrip("/") + path, timeout, token)
        if as_json:
            typer.echo(orjson.dumps(document, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2))
            return
        out = Console()
        if flushes:
            out.print(_flushes_table(session, document))
        elif ref is not None:
            typer.echo(_content_text(document.get("content")))
        else:
            out.print(session_table(session, document))


def auth_headers(token: str | None) -> dict[str, str]:
    """The request headers that carry the API token (none without one)."""
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def _fetch(err: Console, url: str, timeout: float, token: str | None) -> dict[str, Any]:
    try:
        response = httpx.get(url, timeout=timeout, headers=auth_headers(token))
    except httpx.HTTPError as exc:
        err.print(f"[red]cannot reach the worker:[/] {type(exc).__name__}", highlight=False)
        raise typer.Exit(1) from None
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        body = {}
    if response.status_code != 200:
        reason = body.get("error", response.reason_phrase) if isinstance(body, dict) else ""
        err.print(f"[red]{response.status_code}:[/] {reason}", highlight=False)
        if response.status_code == 401:
            hint = "a wrong token" if token else "no token: set SESSIONFOLD_API_TOKEN"
            err.print(f"the worker asks for an API token ({hint})", highlight=False)
        raise typer.Exit(1)
    return body


def _flushes_table(session_id: str, document: dict[str, Any]) -> Table:
    table = Table(title=f"flushes of {session_id}", title_justify="left")
    for column in ("request", "trigger", "outcome", "batches", "gap tokens"):
        table.add_column(column)
    for attempt in document["flush_attempts"]:
        table.add_row(
            attempt["request_id"],
            attempt["trigger"],
            attempt["outcome"],
            f"{attempt['processed_batches']}/{attempt['captured_batches']}",
            f"{attempt['metrics']['frontier_gap_tokens']:,}",
        )
    table.caption = (
        f"outstanding: {document['outstanding'] or 'none'}; held events: {document['held_events']}"
    )
    return table


def _content_text(content: Any) -> str:  # noqa: ANN401 - a result's content, raw JSON
    """A tool result's text blocks, joined; other blocks named by type."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content or ():
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif isinstance(block, dict):
            parts.append(f"[{block.get('type', 'block')}]")
    return "\n".join(parts)
