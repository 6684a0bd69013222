"""`sessionfold ledger FILE`: the rule ledger of a pi session file, with no model call.

The file is folded through the embedded ledger with the offline model: a pass at each pi
compaction that is not ours, and, when the file has no compaction of ours, one more pass at its
end, so the state covers the whole file. Transcript bytes are untrusted: everything printed goes
through the sanitizer (human output) or JSON escaping that leaves no control character raw.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from sessionfold.projections.ledger.config import LedgerConfig
from sessionfold.projections.ledger.driver import LedgerRun, fold_records
from sessionfold.projections.ledger.model import OfflineModel
from sessionfold.projections.ledger.render import render
from sessionfold.projections.ledger.state import snapshot
from sessionfold.projections.ledger.text import sanitize
from sessionfold.streams.session_file import DeadLetter, read_session_file

# JSON escapes C0 controls itself; C1 controls, DEL, bidi controls and line separators it
# leaves raw inside strings, where a \u escape means the same and a terminal sees nothing.
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def safe_json(value: Any) -> str:
    """Stable JSON (sorted keys, indented) with no raw control character in it."""
    text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2).decode()
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


def state_json(run: LedgerRun, at_span: int | None, config: LedgerConfig) -> dict[str, Any]:
    """The documented `--json` form of a state: rules as {id, words, entry, lifted}, and more."""
    assert run.session_id is not None
    state = snapshot(run.store, run.session_id, at_span=at_span)
    summary, cap_fit = render(state, config.summary_chars, config.render_command_chars)
    rules = state.pop("rules")
    return {
        **state,
        "rules": [
            {"id": r["id"], "words": r["words"], "entry": r["entry"], "lifted": bool(r["lifted"])}
            for r in rules
        ],
        "lifts": [{"rule": r["id"], "u": r["u"], **r["lifted"]} for r in rules if r.get("lifted")],
        "ruleSources": [
            {"id": r["id"], "u": r["u"], "start": r["start"], "end": r["end"]} for r in rules
        ],
        "summary": summary,
        "summaryChars": len(summary),
        "capFit": cap_fit,
    }


def _span_lines(spans: list[dict[str, Any]]) -> list[str]:
    lines = []
    for record in spans:
        counts = record.get("counts", {})

        def ids(letter: str, bounds: dict[str, int]) -> str:
            if bounds["last"] < bounds["first"]:
                return "none"
            return f"{letter}{bounds['first']}-{letter}{bounds['last']}"

        lines.append(
            f"span {record['span']}: {record['trigger']}"
            + (f" at entry {record['entry']}" if record.get("entry") else "")
            + f", model {record['model']} ({record['narrativeKind']}, {record['calls']} calls)"
        )
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


def register(app: typer.Typer) -> None:
    """Attach the `ledger` command, and `facts` which reads the same folds, to the root app."""
    # Imported here: facts.py reuses safe_json from this module.
    from sessionfold.streams.cli import facts

    facts.register(app)

    @app.command("ledger")
    def ledger(
        file: Annotated[
            Path,
            typer.Argument(exists=True, dir_okay=False, readable=True, help="A pi session file."),
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
    ) -> None:
        """Show the rule ledger of a session file (offline model; no network)."""
        if sum((spans, anomalies, span is not None)) > 1:
            typer.echo("use one of --spans, --anomalies, --span N", err=True)
            raise typer.Exit(2)
        config = LedgerConfig(summary_chars=summary_chars)
        records = list(read_session_file(file))
        letters = [r for r in records if isinstance(r, DeadLetter)]
        run = fold_records(records, OfflineModel(), config=config)
        if run.session_id is None:
            typer.echo(f"no pi session in {sanitize(str(file), newlines=False)}", err=True)
            raise typer.Exit(1)
        state = snapshot(run.store, run.session_id)
        if span is not None and span > state["span"]:
            typer.echo(f"the file has {state['span']} spans; no span {span}", err=True)
            raise typer.Exit(2)
        typer.echo(
            f"folded {run.envelopes} entries, {len(run.payloads)} passes, "
            f"{len(letters)} unreadable lines",
            err=True,
        )
        if anomalies:
            found = state["anomalies"]
            unread = [letter.describe() for letter in letters]
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
                line = f"line {letter['line']} unreadable: {letter['error']}: {letter['reason']}"
                typer.echo(sanitize(line, newlines=False))
            if not found and not unread:
                typer.echo("no anomalies")
            return
        if spans:
            if as_json:
                typer.echo(safe_json({"spans": state["spans"]}))
            else:
                typer.echo("\n".join(_span_lines(state["spans"])) or "no spans")
            return
        if as_json:
            typer.echo(safe_json(state_json(run, span, config)))
            return
        shown = snapshot(run.store, run.session_id, at_span=span) if span else state
        text, _ = render(shown, config.summary_chars, config.render_command_chars)
        typer.echo(sanitize(text), nl=False)
