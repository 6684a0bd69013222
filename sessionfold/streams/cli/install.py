"""`sessionfold install claude-code|codex`: write the agent's SessionStart hook, MCP server and
(with `--gateway`) its base URL into its settings; `--uninstall` undoes exactly that.

The edits are pure (streams/tools/install); this module reads and writes the files. Every file
is read and every edit computed before anything is written, so a file that does not parse (or
holds a key of the wrong type where an entry goes) stops it with exit code 2 and nothing
written. The record goes first, then the backups, then each file (written whole to a temporary
file and renamed), so an interrupted install leaves a record uninstall can still use.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sessionfold.streams.tools.install.changes import Change, Edit
    from sessionfold.streams.tools.install.plans import Plan
    from sessionfold.streams.tools.install.record import Record

DEFAULT_SERVE_URL = "http://127.0.0.1:6068"


@dataclass
class _Write:
    """One file's new text (None: remove the file), what the change is (for the user), and for
    an install what the record notes: the text before, whether the file existed, its backup."""

    path: Path
    text: str | None
    lines: list[str]
    before: str = ""
    existed: bool = False
    backup: Path | None = None
    changes: list[Change] = field(default_factory=list)


def sessionfold_command() -> list[str]:
    """The absolute command that runs this sessionfold: the console script when that is what
    runs, else this Python with `-m sessionfold.streams.cli` (a venv's python is kept as it is:
    resolving its link would lose the venv)."""
    script = Path(sys.argv[0])
    if script.name == "sessionfold":
        found = script if script.parent != Path() else Path(shutil.which("sessionfold") or script)
        return [os.path.abspath(found)]
    return [os.path.abspath(sys.executable), "-m", "sessionfold.streams.cli"]


def _read(path: Path) -> tuple[str, bool]:
    """The file's text ("" when missing) and whether it exists."""
    try:
        return path.read_text(encoding="utf-8"), True
    except FileNotFoundError:
        return "", False


def _write_atomic(path: Path, text: str) -> None:
    """`text` into `path`, whole or not at all, keeping an existing file's mode. A link is
    followed (settings kept in a dotfiles repository stay a link to it)."""
    path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.sessionfold-tmp")
    temp.write_text(text, encoding="utf-8")
    if path.exists():
        shutil.copymode(path, temp)
    os.replace(temp, path)


class _Refused(Exception):
    """A file install will not touch; the message names the file and why, not its text."""


def _install_writes(plan: Plan, record: Record) -> list[_Write]:
    """Each file's text after the install (files it would not change are left out)."""
    from sessionfold.streams.tools.install.changes import EditConflict
    from sessionfold.streams.tools.install.json_edits import UnreadableDocument, install_json
    from sessionfold.streams.tools.install.toml_edits import install_toml

    writes: list[_Write] = []
    for file in plan.files:
        before, existed = _read(file.path)
        edit = install_json if file.kind == "json" else install_toml
        try:
            after, changes = edit(before, list(file.edits))
        except (UnreadableDocument, EditConflict) as error:
            raise _Refused(f"cannot edit {file.path}: {error}") from None
        if not changes:
            continue
        # Only the first install's backup: the file as it was before sessionfold.
        first = str(file.path) not in record.files
        backup = plan.record.parent / f"{file.path.name}.sessionfold-backup"
        lines = [f"{file.path}: {c.describe()}" for c in changes]
        keep = backup if existed and first else None
        writes.append(_Write(file.path, after, lines, before, existed, keep, changes))
    return writes


def _uninstall_writes(record: Record) -> list[_Write]:
    """Each recorded file's text with install's changes undone (None: remove the file)."""
    from sessionfold.streams.tools.install.json_edits import (
        UnreadableDocument,
        parse_json,
        uninstall_json,
    )
    from sessionfold.streams.tools.install.record import digest
    from sessionfold.streams.tools.install.toml_edits import parse_toml, uninstall_toml

    writes: list[_Write] = []
    for name, entry in record.files.items():
        path = Path(name)
        text, exists = _read(path)
        if not exists:
            continue
        lines = [f"{path}: undo {c.describe()}" for c in reversed(entry.changes)]
        backup, has_backup = _read(Path(entry.backup)) if entry.backup else ("", False)
        if digest(text) == entry.installed_sha256 and has_backup == entry.existed:
            # Untouched since: the file as it was, byte for byte (or no file, as before).
            writes.append(_Write(path, backup if has_backup else None, lines))
            continue
        try:
            if path.suffix == ".toml":
                after = uninstall_toml(text, entry.changes, entry.patches)
                empty = not parse_toml(after)
            else:
                after = uninstall_json(text, entry.changes, entry.patches)
                empty = not parse_json(after)
        except UnreadableDocument as error:
            raise _Refused(f"cannot edit {path}: {error}") from None
        writes.append(_Write(path, None if empty and not entry.existed else after, lines))
    return writes


def _commit_install(writes: list[_Write], record: Record, record_path: Path) -> None:
    """The record first (an interrupted install leaves one uninstall can use), then the
    backups, then the files."""
    for write in writes:
        assert write.text is not None
        backup = str(write.backup) if write.backup else None
        record.add(str(write.path), write.before, write.existed, backup, write.text, write.changes)
    _write_atomic(record_path, record.to_text())
    for write in writes:
        if write.backup is not None:
            _write_atomic(write.backup, write.before)
    for write in writes:
        assert write.text is not None
        _write_atomic(write.path, write.text)


def _commit_uninstall(writes: list[_Write], record: Record, record_path: Path) -> None:
    """The files, then the backups and the record go."""
    for write in writes:
        if write.text is None:
            write.path.unlink(missing_ok=True)
        else:
            _write_atomic(write.path, write.text)
    for entry in record.files.values():
        if entry.backup:
            Path(entry.backup).unlink(missing_ok=True)
    record_path.unlink(missing_ok=True)


def _trust_plan(plan: Plan, edits: Sequence[Edit]) -> Plan:
    """The plan that writes `edits` (the hook's trust) into the config that keeps it."""
    from sessionfold.streams.tools.install.plans import FilePlan, Plan

    assert plan.trusted_hook is not None
    config = plan.trusted_hook[2]
    return Plan(plan.agent, plan.scope, plan.record, (FilePlan(config, "toml", tuple(edits)),))


def _record_trust(plan: Plan, record: Record, codex: str | None, cwd: Path) -> bool:
    """Ask Codex for the hook's key and hash and record its trust in the user's config.toml
    (recorded like every other change); whether Codex trusts the hook now."""
    from sessionfold.streams.tools.install.codex_trust import (
        CodexUnavailable,
        hook_list,
        trust_edits,
    )

    assert plan.trusted_hook is not None
    if codex is None:
        return False
    hooks_file, command, _config = plan.trusted_hook
    try:
        listing = hook_list(codex, os.environ, cwd)
    except CodexUnavailable as error:
        print(f"sessionfold install: could not ask Codex for the hook's hash ({error})")
        return False
    writes = _install_writes(_trust_plan(plan, trust_edits(listing, hooks_file, command)), record)
    for write in writes:
        for line in write.lines:
            print(f"{line} (Codex's trust of the hook, its hash from Codex)")
    if writes:
        _commit_install(writes, record, plan.record)
    # Codex lists the hook as trusted now, or already did.
    return bool(writes) or any(
        h.get("sourcePath") == str(hooks_file) and h.get("trustStatus") == "trusted"
        for entry in listing.get("data") or []
        for h in entry.get("hooks") or []
    )


def run_install(
    agent: str,
    scope: str,
    uninstall: bool,
    dry_run: bool,
    gateway_url: str | None,
    cwd: Path,
    codex: str | None = None,
    gateway_token: str | None = None,
) -> int:
    """Install (or uninstall) for `agent` in `scope`; prints what it changes; the exit code.
    `codex`: the Codex executable asked for the hook's hash (None: the user is told how to
    trust the hook instead); `gateway_token`: serve's API token, for the gateway's calls."""
    from sessionfold.streams.tools.install.json_edits import UnreadableDocument
    from sessionfold.streams.tools.install.plans import CODEX_TRUST_NOTE
    from sessionfold.streams.tools.install.plans import plan as make_plan
    from sessionfold.streams.tools.install.record import Record, parse_record

    plan = make_plan(
        agent, scope, sessionfold_command(), os.environ, cwd, gateway_url, gateway_token
    )
    try:
        record_text, has_record = _read(plan.record)
        try:
            record = parse_record(record_text) if has_record else Record(agent, scope)
        except UnreadableDocument as error:
            raise _Refused(f"cannot read {plan.record}: {error}") from None
        if uninstall:
            if not has_record:
                print(f"sessionfold install: nothing to remove ({plan.record} does not exist)")
                return 0
            writes = _uninstall_writes(record)
        else:
            writes = _install_writes(plan, record)
            if codex is not None and plan.trusted_hook is not None:
                # The config that will keep the trust must parse too, before anything is written.
                _install_writes(_trust_plan(plan, ()), record)
    except _Refused as refused:
        print(f"sessionfold install: {refused}; nothing written", file=sys.stderr)
        return 2
    prefix = "would " if dry_run else ""
    for write in writes:
        for line in write.lines:
            print(f"{prefix}{line}")
    if not writes:
        print("sessionfold install: nothing to change")
    if dry_run:
        if plan.trusted_hook is not None and codex is not None and not uninstall:
            print(f"would ask Codex ({codex} app-server) for the hook's hash, to record its trust")
        return 0
    if uninstall:
        _commit_uninstall(writes, record, plan.record)
        return 0
    if writes:
        _commit_install(writes, record, plan.record)
    trusted = plan.trusted_hook is not None and _record_trust(plan, record, codex, cwd)
    for note in plan.notes:
        if not (trusted and note == CODEX_TRUST_NOTE):
            print(f"note: {note}")
    return 0


def register(app: typer.Typer) -> None:
    """Attach the `install` command to the root app."""

    @app.command("install")
    def install(
        agent: Annotated[
            str, typer.Argument(metavar="claude-code|codex", help="The agent to set up.")
        ],
        uninstall: Annotated[
            bool, typer.Option("--uninstall", help="Undo what install wrote, and only that.")
        ] = False,
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="Print what would change; write nothing.")
        ] = False,
        gateway: Annotated[
            bool,
            typer.Option("--gateway", help="Also point the agent's model calls at serve."),
        ] = False,
        serve_url: Annotated[
            str,
            typer.Option(
                "--serve-url", envvar="SESSIONFOLD_SERVE_URL", help="serve's URL, for --gateway."
            ),
        ] = DEFAULT_SERVE_URL,
        scope: Annotated[
            str,
            typer.Option(
                "--scope",
                help="user: the agent's settings in your home; project: this directory's.",
            ),
        ] = "user",
        codex: Annotated[
            str | None,
            typer.Option(
                "--codex",
                help="The Codex executable asked for the hook's hash, to record its trust "
                "(default: `codex` on PATH).",
            ),
        ] = None,
        no_trust: Annotated[
            bool,
            typer.Option("--no-trust", help="Codex: leave the hook for you to trust."),
        ] = False,
        api_token: Annotated[
            str | None,
            typer.Option(
                "--api-token",
                envvar="SESSIONFOLD_API_TOKEN",
                help="serve's API token, which the gateway's calls must carry (with --gateway; "
                "prefer the variable or --api-token-file: a command-line value shows in the "
                "process list).",
                show_default=False,
            ),
        ] = None,
        api_token_file: Annotated[
            Path | None,
            typer.Option(
                "--api-token-file",
                envvar="SESSIONFOLD_API_TOKEN_FILE",
                help="File holding serve's API token (with --gateway).",
            ),
        ] = None,
    ) -> None:
        """Write an agent's SessionStart hook, MCP server and (--gateway) base URL; --uninstall."""
        from sessionfold.streams.tools.install.plans import AGENTS, SCOPES

        if agent not in AGENTS:
            raise typer.BadParameter(f"the agent is one of {', '.join(AGENTS)}", param_hint="AGENT")
        if scope not in SCOPES:
            raise typer.BadParameter(f"one of {', '.join(SCOPES)}", param_hint="--scope")
        url = serve_url if gateway else None
        token = _gateway_token(api_token, api_token_file, scope) if gateway else None
        asked = None if no_trust or agent != "codex" else (codex or shutil.which("codex"))
        code = run_install(agent, scope, uninstall, dry_run, url, Path.cwd(), asked, token)
        raise typer.Exit(code)


def _gateway_token(token: str | None, path: Path | None, scope: str) -> str | None:
    """serve's API token for the gateway's calls, None for none; exit 2 when it cannot be
    read, or would be written into a project's files (which a repository may share)."""
    from sessionfold.streams.web.auth import TokenProblem, read_token

    try:
        found = read_token(token, path)
    except TokenProblem as problem:
        print(f"sessionfold install: {problem}; nothing written", file=sys.stderr)
        raise typer.Exit(2) from None
    if found is not None and scope != "user":
        print(
            "sessionfold install: serve's API token would be written into the project's "
            "settings; install the gateway with --scope user; nothing written",
            file=sys.stderr,
        )
        raise typer.Exit(2)
    return found
