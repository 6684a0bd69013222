"""Directories for what sessions say are created 0700 whatever the umask (private_dirs.py)."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessionfold.streams.private_dirs import make_private_dirs
from sessionfold.streams.worker.app import WorkerSettings, make_app


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most common umask, which leaves new directories readable by everyone."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_every_directory_created_is_the_owners_alone(tmp_path: Path, open_umask: None) -> None:
    """The path and each missing parent are 0700; one that existed keeps its mode."""
    existing = tmp_path / "shared"
    existing.mkdir(mode=0o755)
    make_private_dirs(existing / "a" / "b")
    assert [_mode(existing / "a"), _mode(existing / "a" / "b")] == [0o700, 0o700]
    assert _mode(existing) == 0o755
    make_private_dirs(existing / "a" / "b")  # there already: nothing changes, nothing raises


def test_a_fold_workers_state_directory_is_private(tmp_path: Path, open_umask: None) -> None:
    """The state table's directory (rocksdb:// stores live in it) is created 0700."""
    settings = WorkerSettings(data_dir=tmp_path / "data", role="fold", store="rocksdb://")
    server_log = logging.getLogger("aiohttp.server")
    filters = list(server_log.filters)
    try:
        make_app(settings)
    finally:
        server_log.filters[:] = filters  # building an app quiets aiohttp's log, process-wide
    assert _mode(tmp_path / "data") == 0o700
    assert _mode(tmp_path / "data" / settings.faust_id) == 0o700
