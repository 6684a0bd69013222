"""`sessionfold ledger FILE` and `sessionfold ledger compact FILE`: the rule ledger of a pi
session file.

The file is folded through the embedded ledger: a pass at each pi compaction that is not ours,
and, when the file has no compaction of ours, one more pass at its end, so the state covers the
whole file. `ledger compact FILE` runs the pass a compact request at the end of the file would,
and prints the compaction it produces. The diff model is the offline one unless `--model
provider/model-id` (or `SESSIONFOLD_MODEL`) names an OpenAI-compatible one. Transcript bytes
are untrusted: everything printed goes through the sanitizer (human output) or JSON escaping
that leaves no control character raw.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from sessionfold.events.envelope import EntryEnvelope
from sessionfold.ports.ledger.model import DiffModel, OfflineModel
from sessionfold.projections.ledger.config import LedgerConfig
from sessionfold.projections.ledger.fold import is_ours
from sessionfold.projections.ledger.render import render
from sessionfold.projections.ledger.state import snapshot
from sessionfold.projections.ledger.text import sanitize
from sessionfold.projections.ledger.view import ledger_view
from sessionfold.streams.cli.inputs import session_inputs
from sessionfold.streams.cli.json_output import safe_json
from sessionfold.streams.cli.options import Format
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.runtime.ledger_log import LedgerLog, LogObserver
from sessionfold.streams.runtime.ledger_loop import LedgerRun, compaction_entries, fold_records


def _span_lines(spans: list[dict[str, Any]]) -> list[str]:
    lines = []
    for record in spans:
        counts = record.get("counts", {})

        def ids(letter: str, bounds: dict[str, int]) -> str:
            if bounds["last"] < bounds["first"]:
                return "none"
            return f"{letter}{bounds['first']}-{letter}{bounds['last']}"

        chunks = record.get("chunks", 1)
        lines.append(
            f"span {record['span']}: {record['trigger']}"
            + (f" at entry {record['entry']}" if record.get("entry") else "")
            + f", model {record['model']} ({record['narrativeKind']}, {record['calls']} calls"
            + (f", {chunks} chunks" if chunks > 1 else "")
            + ")"
        )
        if record.get("takeover"):
            lines.append(
                f"  took over from entry {record['takeover']}: {counts.get('earlier', 0)} "
                f"earlier messages, {counts.get('recorded', 0)} standing rules recorded by "
                f"code, {counts.get('oneOffs', 0)} one-offs"
            )
        if record.get("missing"):
            lines.append(f"  chunks missing: {', '.join(map(str, record['missing']))}")
        lines.append(
            f"  messages {counts.get('messages', 0)}; commands {ids('C', record['commands'])}; "
            f"errors {ids('E', record['errors'])}; rules +{counts.get('rules', 0)}; "
            f"lifts {counts.get('lifts', 0)}; decisions {counts.get('decisions', 0)}; "
            f"dead ends {counts.get('deadEnds', 0)}; summary {record.get('summaryChars', 0)} chars"
        )
        if record.get("dropped"):
            dropped = ", ".join(f"{k} {v}" for k, v in record["dropped"].items())
            lines.append(f"  dropped: {dropped}")
        if record.get("carried"):
            lines.append(f"  carried to the next pass: {', '.join(record['carried'])}")
        lines.append(f"  narrative: {record.get('narrative', '')}")
    return [sanitize(line, newlines=False) for line in lines]


#: `--model` values that mean the offline model.
OFFLINE_NAMES = frozenset({"", "offline"})


def diff_model_for(spec: str | None) -> DiffModel:
    """The diff model a `--model` value names: offline by default, else HTTP (`provider/id`).

    Raises ValueError when an HTTP model cannot be configured (no base URL, say).
    """
    if spec is None or spec.strip().lower() in OFFLINE_NAMES:
        return OfflineModel()
    # Imported here: the offline path needs no HTTP client.
    from sessionfold.ports.ledger_http import HttpDiffModel

    return HttpDiffModel.from_env(spec.strip())


def session_of(records: list[Any], file: Path, model: DiffModel) -> dict[str, Any]:
    """What names a session in the log: its id, working directory, file and diff model."""
    session: dict[str, Any] = {"id": None, "cwd": None, "file": str(file.resolve())}
    session["model"] = model.name
    for record in records:
        if isinstance(record, EntryEnvelope):
            session["id"] = record.session_id
            entry = record.payload.entry
            if entry.get("type") == "session" and isinstance(entry.get("cwd"), str):
                session["cwd"] = entry["cwd"]
            break
    return session


def logged_compactions(records: Iterable[Any], observer: LogObserver) -> Iterator[Any]:
    """The records, writing a `compacted` record for each compaction entry as it is folded."""
    for record in records:
        if isinstance(record, EntryEnvelope) and record.payload.entry.get("type") == "compaction":
            observer.compacted(record.payload.entry, is_ours(record.payload.entry))
        yield record


def _parse_target(args: list[str]) -> tuple[bool, Path]:
    """(compact?, file) from `FILE` or `compact FILE`; exits 2 on anything else."""
    if len(args) == 2 and args[0] == "compact":
        compact, name = True, args[1]
    elif len(args) == 1:
        compact, name = False, args[0]
    else:
        typer.echo("usage: sessionfold ledger [compact] FILE [OPTIONS]", err=True)
        raise typer.Exit(2)
    path = Path(name)
    session_inputs([path], directories=False)
    return compact, path


def _print_compaction(run: LedgerRun, as_json: bool) -> None:
    """`ledger compact`: the compaction the last pass produced, or exit 1 when none ran."""
    last = run.payloads[-1] if run.payloads else None
    if last is None or last.get("record") is None or last["record"]["trigger"] != "compact-request":
        typer.echo("nothing to compact: the open span holds no message or command", err=True)
        raise typer.Exit(1)
    record = last["record"]
    typer.echo(
        sanitize(
            f"span {record['span']}: model {record['model']}, {record['calls']} calls, "
            f"{record['narrativeKind']}, summary {record['summaryChars']} chars",
            newlines=False,
        ),
        err=True,
    )
    if as_json:
        typer.echo(safe_json({"payload": last, "entries": compaction_entries(last)}))
        return
    typer.echo(sanitize(last["summary"]), nl=False)


def _check_views(compact: bool, spans: bool, anomalies: bool, span: int | None) -> None:
    """At most one of --spans, --anomalies, --span N, and none of them with `compact`."""
    if sum((spans, anomalies, span is not None)) > 1 or (
        compact and (spans or anomalies or span is not None)
    ):
        typer.echo("use one of --spans, --anomalies, --span N (none with compact)", err=True)
        raise typer.Exit(2)


def _print_anomalies(
    found: list[dict[str, Any]], unread: list[dict[str, Any]], as_json: bool
) -> None:
    """What the fold could not use (its anomalies) and the file's unreadable lines."""
    if as_json:
        typer.echo(safe_json({"anomalies": found, "deadLetters": unread}))
        return
    for row in found:
        detail = ", ".join(
            f"{k} {v}" for k, v in row.items() if k not in ("id", "code", "seq", "entry")
        )
        line = f"{row['id']} {row['code']} at seq {row['seq']}"
        line += f", entry {row['entry']}" if row.get("entry") else ""
        typer.echo(sanitize(line + (f" ({detail})" if detail else ""), newlines=False))
    for letter in unread:
        line = (
            f"{letter['source']}:{letter['line']} unreadable: {letter['error']}: "
            f"{letter['reason']} ({letter['size']} bytes)"
        )
        typer.echo(sanitize(line, newlines=False))
    if not found and not unread:
        typer.echo("no anomalies")


def register(app: typer.Typer) -> None:
    """Attach the `ledger` command to the root app."""

    @app.command("ledger")
    def ledger(
        target: Annotated[
            list[str],
            typer.Argument(
                metavar="[compact] FILE",
                help="A pi session file; `compact FILE` runs a pass at its end and prints it.",
                show_default=False,
            ),
        ],
        spans: Annotated[
            bool, typer.Option("--spans", help="Every span: entry, events, ids, narrative.")
        ] = False,
        anomalies: Annotated[
            bool, typer.Option("--anomalies", help="What the fold could not use, and why.")
        ] = False,
        span: Annotated[
            int | None, typer.Option("--span", min=1, help="The state as it was at span N.")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON (stable).")] = False,
        summary_chars: Annotated[
            int,
            typer.Option(
                "--summary-chars",
                envvar="SESSIONFOLD_SUMMARY_CHARS",
                min=500,
                help="Size bound of the rendered summary.",
            ),
        ] = LedgerConfig().summary_chars,
        model: Annotated[
            str | None,
            typer.Option(
                "--model",
                envvar="SESSIONFOLD_MODEL",
                help="The diff model: offline (default) or provider/model-id over HTTP "
                "(SESSIONFOLD_MODEL_BASE_URL, _API_KEY, _FALLBACK ... apply).",
            ),
        ] = None,
        narrative_mode: Annotated[
            str,
            typer.Option(
                "--narrative-mode",
                envvar="SESSIONFOLD_LEDGER_NARRATIVE_MODE",
                help="single: one diff call per chunk; turns: one conversation, a section per "
                "turn (opt-in, for small models).",
            ),
        ] = "single",
        file_format: Format = None,
    ) -> None:
        """Show the rule ledger of a session file, or (`compact FILE`) compact it."""
        if narrative_mode not in ("single", "turns"):
            typer.echo("--narrative-mode: single or turns", err=True)
            raise typer.Exit(2)
        compact, file = _parse_target(target)
        _check_views(compact, spans, anomalies, span)
        config = LedgerConfig(
            summary_chars=summary_chars,
            narrative_mode="turns" if narrative_mode == "turns" else "single",
        )
        try:
            diff_model = diff_model_for(model)
        except ValueError as exc:
            typer.echo(f"--model: {exc}", err=True)
            raise typer.Exit(2) from None
        records = list(read_session_file(file))
        letters = [r for r in records if isinstance(r, DeadLetter)]
        session = session_of(records, file, diff_model)
        observer = LogObserver(LedgerLog.from_env(session_id=session["id"]), session)
        observer.run("ledger compact" if compact else "ledger")
        try:
            run = fold_records(
                logged_compactions(records, observer),
                diff_model,
                config=config,
                compact=compact,
                observer=observer,
                clock=time.monotonic,  # turns mode's time budget
            )
        except KeyboardInterrupt as exc:
            observer.aborted(exc)
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None
        finally:
            close = getattr(diff_model, "close", None)
            if callable(close):
                close()
        if run.session_id is None:
            typer.echo(f"no pi session in {sanitize(str(file), newlines=False)}", err=True)
            raise typer.Exit(1)
        typer.echo(
            f"folded {run.envelopes} entries, {len(run.payloads)} passes, "
            f"{len(letters)} unreadable lines",
            err=True,
        )
        if compact:
            _print_compaction(run, as_json)
            return
        state = snapshot(run.store, run.session_id)
        if span is not None and span > state["span"]:
            typer.echo(f"the file has {state['span']} spans; no span {span}", err=True)
            raise typer.Exit(2)
        if anomalies:
            _print_anomalies(state["anomalies"], [letter.describe() for letter in letters], as_json)
        elif spans:
            if as_json:
                typer.echo(safe_json({"spans": state["spans"]}))
            else:
                typer.echo("\n".join(_span_lines(state["spans"])) or "no spans")
        elif as_json:
            typer.echo(safe_json(ledger_view(run.store, run.session_id, config, span)))
        else:
            shown = snapshot(run.store, run.session_id, at_span=span) if span else state
            text, _ = render(shown, config.summary_chars, config.render_command_chars)
            typer.echo(sanitize(text), nl=False)
