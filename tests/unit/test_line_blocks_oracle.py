"""The reader's lines cut from blocks (`_line_tuples`) against the `readline` loop it replaced:
the same (data, length, size, too_long) for every line of drawn files, from any offset, under
any line limit and block size, final or not (the old loop is kept here as the oracle)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import IO, Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfold.streams.publishing import session_file
from sessionfold.streams.publishing.session_file import (
    BOM,
    _line_tuples,
    _read_rest,
    _skipped_line,
)


def readline_tuples(
    handle: IO[bytes], offset: int, limit: int, final: bool
) -> Iterator[tuple[bytes, int, int, bool]]:
    """The reader's loop before blocks: a `readline` per line."""
    handle.seek(offset)
    readline = handle.readline
    first_size = min(limit + 1, session_file._SKIP_CHUNK)
    while True:
        chunk = readline(first_size)
        if len(chunk) >= session_file._SKIP_CHUNK and not chunk.endswith(b"\n"):
            chunk = _read_rest(handle, chunk, limit + 1)
        if len(chunk) > limit and not chunk.endswith(b"\n"):
            line = _skipped_line(handle, chunk, final)
            if line is None:
                return
            data, length, size, too_long = line.data, line.length, line.size, True
        elif not chunk or (not chunk.endswith(b"\n") and not final):
            return
        else:
            data = chunk.rstrip(b"\r\n")
            length, size, too_long = len(chunk), len(data), False
        if offset == 0 and data.startswith(BOM):
            data = data[len(BOM) :]
        offset += length
        yield data, length, size, too_long


_PIECES = st.sampled_from(
    [b"\n", b"\r\n", b"\r", b"\r\r\n", b"{}", b"x", b"abc", BOM, b"\xef", b" ", b"0123456789"]
)
_FILES = st.lists(_PIECES, max_size=60).map(b"".join)


@settings(max_examples=1500)
@given(
    _FILES,
    st.integers(0, 80),
    st.integers(1, 40),
    st.booleans(),
    st.sampled_from([1, 2, 3, 5, 8, 64, 256 * 1024]),
    st.sampled_from([2, 7, 16, 1024 * 1024]),
)
def test_block_lines_are_the_readline_lines(
    data: bytes, offset: int, limit: int, final: bool, block: int, skip: int
) -> None:
    """Property: every line, its length, size and too-long flag are the readline loop's, and so
    is where the lines stop (a last line without its newline, when not final)."""
    offset = min(offset, len(data))
    old_block, old_skip = session_file._BLOCK, session_file._SKIP_CHUNK
    session_file._BLOCK, session_file._SKIP_CHUNK = block, skip
    try:
        expected = list(readline_tuples(io.BytesIO(data), offset, limit, final))
        assert list(_line_tuples(io.BytesIO(data), offset, limit, final)) == expected
    finally:
        session_file._BLOCK, session_file._SKIP_CHUNK = old_block, old_skip


def test_a_file_growing_between_reads_gives_its_new_lines(tmp_path: Any) -> None:
    """A tailing read (not final) stops before a line without its newline, and a later read from
    the offset reached gives it whole once it is."""
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":')
    with path.open("rb") as handle:
        first = list(_line_tuples(handle, 0, 100, final=False))
    assert first == [(b'{"a":1}', 8, 7, False)]
    path.write_bytes(b'{"a":1}\n{"b":2}\r\n')
    with path.open("rb") as handle:
        assert list(_line_tuples(handle, 8, 100, final=False)) == [(b'{"b":2}', 9, 7, False)]
