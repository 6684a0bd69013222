"""`sessionfold facts FILE...`: how many needed values each compactor's summary kept.

At each compaction point of a session: the values first seen in that span's tool output and
used again afterwards (paths, numbers, hashes, ports, identifiers), and how many of them pi's
own summary and our rendered ledger state at the same point hold. No model call: our state
comes from the offline model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sessionfold.events.envelope import EntryEnvelope
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.projections.ledger.config import LedgerConfig
from sessionfold.projections.ledger.facts import FactsRow, facts
from sessionfold.projections.ledger.text import sanitize
from sessionfold.streams.cli.inputs import session_inputs
from sessionfold.streams.cli.json_output import safe_json
from sessionfold.streams.cli.options import Format
from sessionfold.streams.publishing.session_file import read_session_file
from sessionfold.streams.runtime.ledger_loop import fold_records

_HEAD = f"{'point':>5}  {'entry':<10}{'values':>7}{'pi kept':>9}{'ours kept':>11}"
_HEAD += f"{'pi chars':>10}{'our chars':>11}"


def _cell(value: int | None) -> str:
    return "-" if value is None else str(value)


def _table(rows: list[FactsRow]) -> list[str]:
    lines = [_HEAD]
    for row in rows:
        lines.append(
            f"{row.point:>5}  {sanitize(str(row.entry), newlines=False)[:10]:<10}"
            f"{row.values:>7}{_cell(row.pi):>9}{_cell(row.ours):>11}"
            f"{_cell(row.piChars):>10}{_cell(row.oursChars):>11}"
        )
    return lines


def _sum(rows: list[FactsRow], name: str) -> int:
    return sum(getattr(row, name) or 0 for row in rows)


def register(app: typer.Typer) -> None:
    """Attach the `facts` command to the root app."""

    @app.command("facts")
    def facts_command(
        paths: Annotated[list[Path], typer.Argument(help="Session files or directory trees.")],
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON (stable).")] = False,
        summary_chars: Annotated[
            int,
            typer.Option(
                "--summary-chars",
                envvar="SESSIONFOLD_SUMMARY_CHARS",
                min=500,
                help="Size bound of our rendered summary.",
            ),
        ] = LedgerConfig().summary_chars,
        file_format: Format = None,
    ) -> None:
        """Count, per compaction point, the needed values each compactor's summary kept."""
        config = LedgerConfig(summary_chars=summary_chars)
        report = []
        everything: list[FactsRow] = []
        for path in session_inputs(paths):
            records = list(read_session_file(path))
            entries = [r.payload.entry for r in records if isinstance(r, EntryEnvelope)]
            run = fold_records(records, OfflineModel(), config=config, final_pass=False)
            rows = facts(entries, run.payloads)
            everything += rows
            report.append((path, run.session_id, rows))
        if as_json:
            sessions = [
                {"file": str(path), "session": sid, "points": [r.to_dict() for r in rows]}
                for path, sid, rows in report
            ]
            totals = {k: _sum(everything, k) for k in ("values", "pi", "ours")}
            typer.echo(safe_json({"sessions": sessions, "total": totals}))
            return
        for path, sid, rows in report:
            typer.echo(sanitize(f"{path.name} (session {sid})", newlines=False))
            if not rows:
                typer.echo("  no compaction points")
                continue
            typer.echo("\n".join("  " + line for line in _table(rows)))
            typer.echo(
                f"  {'total':>5}  {'':<10}{_sum(rows, 'values'):>7}{_sum(rows, 'pi'):>9}"
                f"{_sum(rows, 'ours'):>11}"
            )
        typer.echo(
            f"all sessions: {len(everything)} compaction points, {_sum(everything, 'values')} "
            f"values needed, pi kept {_sum(everything, 'pi')}, ours kept {_sum(everything, 'ours')}"
        )
