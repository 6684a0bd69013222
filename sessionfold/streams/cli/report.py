"""`sessionfold report`: a digest of the ledger log's newest eight records, safe to paste into an
issue.

The log already holds no message text; the digest goes further. It keeps only the fields it
knows, each as a number, a flag or a short code; ids and paths are replaced by a short hash
(the same value gives the same hash, so records of one session still group), a path keeps
only whether it was under the home directory (`~/…#hash`), and an error message shows the
home directory as `~` with every path in it hashed. A line that is not a record is counted and
skipped. Nothing is read through a symlink or from anything but a regular file.

The log is one file per session (with `SESSIONFOLD_LEDGER_LOG` unset; the report merges the
most recently written ones and the single file older versions wrote, by time) or the one file
that variable names; either way it can mix projects: the digest counts the projects
(working directories) among the records it read, `--cwd PATH` (or `--project PATH`) keeps the
records of sessions run in PATH or below it, and the path of the log read goes to stderr (home
as `~`), out of what is pasted.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from sessionfold.projections.ledger.text import sanitize
from sessionfold.streams.cli.json_output import safe_json
from sessionfold.streams.runtime.ledger_log import _home, read_path, scrub_home

#: How many records the digest shows.
NEWEST = 8
#: Most per-session log files read, the most recently written first.
MAX_FILES = 64
#: How much of the end of a file is read for them (records are a few hundred bytes).
TAIL_BYTES = 256 * 1024

_CODE = re.compile(r"^[A-Za-z0-9_.:/@+-]{1,80}$")
_PATH = re.compile(r"(?:~|(?<![\w.])/)[\w.@+-]*(?:/[\w.@+-]+)+")
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def short_hash(value: str) -> str:
    """A 10-hex-digit digest of a value: the same value always gives the same hash."""
    return hashlib.sha256(value.encode()).hexdigest()[:10]


def hashed_path(value: object, home: str) -> str | None:
    """`~/…#hash` for a path under the home directory, `/…#hash` for another, None if absent."""
    if not isinstance(value, str) or not value:
        return None
    under_home = bool(home) and (value == home or value.startswith(home.rstrip("/") + "/"))
    return f"{'~' if under_home or value.startswith('~') else ''}/…#{short_hash(value)}"


def _code(value: object) -> str | None:
    if value is None:
        return None
    text = str(value)
    return text if _CODE.match(text) else "?"


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _counts(value: object) -> dict[str, int]:
    if not isinstance(value, dict):
        return {}
    return {
        k: v
        for k, v in value.items()
        if isinstance(k, str) and _CODE.match(k) and _count(v) is not None
    }


def _error(value: object, home: str) -> str | None:
    """An error message with the home directory as ~ and every path in it hashed."""
    if not isinstance(value, str):
        return None
    text = scrub_home(value[:200], home)

    def hashed(match: re.Match[str]) -> str:
        path = match.group(0)
        return f"{'~' if path.startswith('~') else ''}/…#{short_hash(path)}"

    return sanitize(_PATH.sub(hashed, text), newlines=False)


def digest_record(raw: dict[str, Any], home: str) -> dict[str, Any]:
    """One record as the digest shows it: known fields only, ids and paths hashed."""
    session = raw.get("session") if isinstance(raw.get("session"), dict) else {}
    narrative = raw.get("narrative") if isinstance(raw.get("narrative"), dict) else None
    out: dict[str, Any] = {
        "event": _code(raw.get("event")),
        "time": _code(raw.get("time")),
        "session": short_hash(str(session.get("id"))) if session.get("id") else None,
        "cwd": hashed_path(session.get("cwd"), home),
        "file": hashed_path(session.get("file"), home),
        "model": _code(raw.get("model") or session.get("model")),
    }
    for name in ("span", "summaryChars", "carried", "durationMs", "world", "tokensBefore"):
        if _count(raw.get(name)) is not None:
            out[name] = raw[name]
    for name in ("trigger", "reason", "errorClass", "command", "version"):
        if raw.get(name) is not None:
            out[name] = _code(raw.get(name))
    for name in ("takeover", "fromExtension"):
        if isinstance(raw.get(name), bool):
            out[name] = raw[name]
    if raw.get("error") is not None:
        out["error"] = _error(raw.get("error"), home)
    if narrative is not None:
        out["narrative"] = {
            "kind": _code(narrative.get("kind")),
            "calls": _count(narrative.get("calls")),
            "accepted": _count(narrative.get("accepted")),
            "chunks": _count(narrative.get("chunks")),
            "missing": [n for n in narrative.get("missing") or [] if _count(n) is not None],
            "reason": _code(narrative.get("reason")),
            "dropped": _counts(narrative.get("dropped")),
        }
    for name in ("counts", "capFit"):
        if isinstance(raw.get(name), dict):
            out[name] = _counts(raw[name])
    return {k: v for k, v in out.items() if v is not None}


def _tail_lines(path: Path) -> list[bytes]:
    """The complete lines at the end of a regular file (not through a symlink); [] if absent."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return []
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EPERM, f"{path.name} is not a regular file")
        start = max(0, info.st_size - TAIL_BYTES)
        os.lseek(fd, start, os.SEEK_SET)
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
    finally:
        os.close(fd)
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first line was cut by the tail read
    return [line for line in lines if line.strip()]


def project_roots(path: Path) -> tuple[str, ...]:
    """The spellings of a project directory a record's cwd may use: as given and resolved."""
    given = os.path.abspath(os.path.expanduser(str(path)))
    return tuple(dict.fromkeys((given, os.path.realpath(given))))


def in_project(record: dict[str, Any], roots: tuple[str, ...]) -> bool:
    """Whether the record's session ran in one of `roots` or below it."""
    session = record.get("session")
    cwd = session.get("cwd") if isinstance(session, dict) else None
    if not isinstance(cwd, str):
        return False
    return any(cwd == root or cwd.startswith(root.rstrip("/") + "/") for root in roots)


def _records(lines: list[bytes]) -> tuple[list[dict[str, Any]], int]:
    records, skipped = [], 0
    for line in lines:
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            skipped += 1
            continue
        if isinstance(value, dict):
            records.append(value)
        else:
            skipped += 1
    return records, skipped


def _file_records(
    path: Path, count: int, roots: tuple[str, ...] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """One log file's newest `count` records wanted (its `.1` backup first), every record
    read, and the lines skipped."""
    records, skipped = _records(_tail_lines(path))
    wanted = [r for r in records if roots is None or in_project(r, roots)]
    if len(wanted) < count:
        older, skipped_older = _records(_tail_lines(path.with_name(path.name + ".1")))
        records, skipped = older + records, skipped + skipped_older
        wanted = [r for r in records if roots is None or in_project(r, roots)]
    return wanted[-count:], records, skipped


def _session_logs(directory: Path) -> list[Path]:
    """The per-session logs of a log directory (regular files, no symlink), the most recently
    written first, at most `MAX_FILES`; [] when there is no such directory."""
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(errno.ENOTDIR, f"{directory.name} is not a directory")
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.endswith(".jsonl") and entry.is_file(follow_symlinks=False):
                found.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.name))
    found.sort(reverse=True)
    return [directory / name for _, name in found[:MAX_FILES]]


def newest_records(
    path: Path, count: int = NEWEST, roots: tuple[str, ...] | None = None
) -> tuple[list[dict[str, Any]], int, int]:
    """The newest `count` records of the log, of the projects at `roots` only when given; the
    lines skipped; and how many projects the records read span.

    `path` is one log file, or the directory of per-session logs: then its most recently
    written files and the single file older versions wrote beside it (`ledger.jsonl`) are
    read, and their records merged by time.
    """
    if not os.path.isdir(path) or os.path.islink(path):
        wanted, records, skipped = _file_records(path, count, roots)
        return wanted, skipped, len(_projects(records))
    merged: list[dict[str, Any]] = []
    every: list[dict[str, Any]] = []
    skipped = 0
    for file in [*_session_logs(path), path.with_name("ledger.jsonl")]:
        wanted, records, skipped_here = _file_records(file, count, roots)
        merged += wanted
        every += records
        skipped += skipped_here
    merged.sort(key=lambda record: str(record.get("time") or ""))
    return merged[-count:], skipped, len(_projects(every))


def _projects(records: list[dict[str, Any]]) -> set[str]:
    """The distinct working directories the records' sessions ran in."""
    found = set()
    for record in records:
        session = record.get("session")
        if isinstance(session, dict) and isinstance(session.get("cwd"), str):
            found.add(session["cwd"])
    return found


def _human(record: dict[str, Any]) -> str:
    parts = [str(record.get("time", "?")), str(record.get("event", "?"))]
    if "span" in record:
        parts.append(f"span {record['span']}")
    if record.get("session"):
        parts.append(f"session #{record['session']}")
    if record.get("model"):
        parts.append(f"model {record['model']}")
    narrative = record.get("narrative")
    if narrative:
        parts.append(
            f"{narrative.get('kind')}, {narrative.get('calls')} calls, "
            f"{narrative.get('accepted')} accepted"
        )
        if narrative.get("dropped"):
            parts.append(
                "dropped " + ", ".join(f"{k} {v}" for k, v in narrative["dropped"].items())
            )
        if narrative.get("reason"):
            parts.append(f"reason {narrative['reason']}")
    for name, label in (
        ("summaryChars", "summary chars"),
        ("carried", "carried"),
        ("durationMs", "ms"),
    ):
        if name in record:
            parts.append(f"{record[name]} {label}")
    for name in ("reason", "errorClass", "error", "command", "fromExtension"):
        if name in record:
            parts.append(f"{name} {record[name]}")
    return sanitize("- " + "; ".join(parts), newlines=False)


def register(app: typer.Typer) -> None:
    """Attach the `report` command to the root app."""

    @app.command("report")
    def report(
        log: Annotated[
            Path | None,
            typer.Option(
                "--log",
                help="The log file, or a directory of per-session logs (default: "
                "SESSIONFOLD_LEDGER_LOG, else the per-session logs and the older single file).",
            ),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON (stable).")] = False,
        cwd: Annotated[
            Path | None,
            typer.Option(
                "--cwd",
                "--project",
                help="Only records of sessions run in this directory or below it.",
            ),
        ] = None,
    ) -> None:
        """A digest of the ledger log's newest eight records, safe to paste into an issue."""
        path = log if log is not None else read_path()
        if path is None:
            typer.echo("the ledger log is off (SESSIONFOLD_LEDGER_LOG); pass --log PATH", err=True)
            raise typer.Exit(1)
        home = _home()
        typer.echo(f"reading {scrub_home(str(path), home)}", err=True)
        roots = None if cwd is None else project_roots(cwd)
        try:
            raw, skipped, projects = newest_records(path, roots=roots)
        except OSError as exc:
            name = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
            typer.echo(f"cannot read the ledger log: {name}", err=True)
            raise typer.Exit(1) from None
        records = [digest_record(record, home) for record in raw]
        if as_json:
            document = {
                "records": records,
                "skipped": skipped,
                "newest": NEWEST,
                "projects": projects,
                "project": None if roots is None else hashed_path(roots[0], home),
            }
            typer.echo(safe_json(document))
            return
        scope = "" if roots is None else f" of project {hashed_path(roots[0], home)}"
        typer.echo(
            f"sessionfold ledger log: the {len(records)} newest records{scope} "
            f"(ids and paths hashed, home as ~); the records read span {projects} "
            "working directories" + (f"; {skipped} unreadable lines skipped" if skipped else "")
        )
        if roots is None and projects > 1:
            typer.echo("several projects share this log: --cwd PATH shows one", err=True)
        for record in records:
            typer.echo(_human(record))
