"""Checking the session files a command is given, before anything reads them.

A path that does not exist is a usage error (exit 2). One that exists but is no session file
exits 1 with one line naming it and why: a directory where a file is wanted, or one holding no
`*.jsonl`; a FIFO, a device or a socket (never opened: reading one would hang or never end);
a file that cannot be read; an empty file; a file that holds no pi session header (binary, or
not a session). Files found under a directory that fail these checks are skipped with a note,
so one stray file does not stop a whole tree; a tree with none left exits 1 (but for publish,
which may wait for files to appear).
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from sessionfold.projections.ledger.text import sanitize
from sessionfold.streams.publishing.session_file import (
    FileKindError,
    file_kind,
    file_lines,
    header_of,
    max_line_bytes,
    open_session_file,
    session_files,
)


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(sanitize(message, newlines=False), err=True)
    return typer.Exit(code)


def file_problem(path: Path, need_session: bool = True) -> str | None:
    """Why `path` is no session file a command can read, or None when it is one.

    Without `need_session` only the kind and readability are checked (publish takes an empty
    file it may see grow, and sends unreadable lines to the dead-letter topic).
    """
    try:
        kind = file_kind(path.stat().st_mode)
    except OSError as exc:
        return f"cannot read {path}: {type(exc).__name__}"
    if kind != "regular file":
        return f"{path} is a {kind}, not a session file"
    try:
        open_session_file(path).close()
        if not need_session:
            return None
        if header_of(path) is not None:
            return None
        if not any(line.too_long or line.data.strip() for line in file_lines(path)):
            return f"{path} is empty"
        return f"{path} holds no pi session (no session header: binary or not a session file)"
    except FileKindError as exc:
        return f"{exc.path} is a {exc.kind}, not a session file"
    except OSError as exc:
        return f"cannot read {path}: {type(exc).__name__}"


def session_inputs(
    paths: list[Path], directories: bool = True, need_session: bool = True
) -> list[Path]:
    """The session files the arguments name, checked; exits as the module docstring says.

    With `directories`, a directory stands for the `*.jsonl` files under it.
    """
    try:
        max_line_bytes()
    except ValueError as exc:
        raise _fail(str(exc), 2) from None
    files: list[Path] = []
    for path in paths:
        if not os.path.lexists(path) or (path.is_symlink() and not path.exists()):
            raise _fail(f"no such file or directory: {path}", 2)
        if path.is_dir():
            if not directories:
                raise _fail(f"{path} is a directory, not a session file")
            files += _tree_files(path, need_session)
            continue
        problem = file_problem(path, need_session)
        if problem is not None:
            raise _fail(problem)
        files.append(path)
    return files


def _tree_files(root: Path, need_session: bool) -> list[Path]:
    """The usable session files under a directory; exit 1 when there is none."""
    found = list(session_files([root]))
    usable = []
    for path in found:
        problem = file_problem(path, need_session)
        if problem is None:
            usable.append(path)
        else:
            typer.echo(sanitize(f"skipped: {problem}", newlines=False), err=True)
    if not usable and need_session:  # publish --follow may wait for files to appear
        what = "no session files (*.jsonl)" if not found else "no readable session files"
        raise _fail(f"{what} under {root}")
    return usable
