"""Directories only their owner can enter: where state, ledger logs and broker data are kept.

Each holds what sessions say (folded state, rule words, the topics' records), so a directory
this code creates is `0700` whatever the umask; one that exists already is left as it is.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def make_private_dirs(path: Path) -> None:
    """Create `path` and its missing parents, each `0700` whatever the umask."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
            os.chmod(directory, 0o700)  # mkdir's mode passes through the umask
