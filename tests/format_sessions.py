"""Other agents' session files for tests: the generators' output on disk, and reads of it as a
tail would do them (stopped anywhere, the position saved through JSON, resumed by a new reader).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sessionfold.events.envelope import encode
from sessionfold.streams.publishing.session_file import (
    DeadLetter,
    ReadPosition,
    SessionFileReader,
)
from sessionfold.streams.tools.synthetic_claude import generate_claude_session, write_claude_session
from sessionfold.streams.tools.synthetic_codex import generate_codex_session, write_codex_session

#: The formats read through a translator.
TRANSLATED = ("claude-code", "codex")


def write_format_session(folder: Path, file_format: str, seed: int, turns: int) -> Path:
    """The main file of one generated session of `file_format`, written under `folder`."""
    if file_format == "codex":
        return write_codex_session(folder, generate_codex_session(seed, turns))
    return write_claude_session(folder, generate_claude_session(seed, turns))[0].path


def wire(records: Iterable[Any]) -> list[bytes]:
    """What each record puts on its topic: an envelope's JSON, a dead letter's bytes."""
    return [r.raw if isinstance(r, DeadLetter) else encode(r) for r in records]


def saved(position: ReadPosition) -> ReadPosition:
    """`position` after a trip through JSON, as the publish checkpoint file stores it."""
    return ReadPosition.from_dict(json.loads(json.dumps(position.to_dict())))


def tail_in_pieces(path: Path, data: bytes, cuts: Iterable[int]) -> list[Any]:
    """The records of `data` read as a tail would: the file grown to each byte cut in turn (a
    line half written included), a tailing read by a new reader from the saved position each
    time (no ids handed over), then a final read of the whole file."""
    records: list[Any] = []
    position: ReadPosition | None = None
    for cut in sorted(cuts):
        path.write_bytes(data[:cut])
        reader = SessionFileReader(path, position)
        records += [r for batch in reader.lines(final=False) for r in batch]
        position = saved(reader.position)
    path.write_bytes(data)
    return records + list(SessionFileReader(path, position).records(final=True))
