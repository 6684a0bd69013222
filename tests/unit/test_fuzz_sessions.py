"""A seeded fuzzer over real and generated session files: damaged lines never crash the reader
or the folds, every object of the input is accounted for, and the state is the one the file
with its bad lines repaired (or removed) gives, wherever the tree allows it.

Corpora: windows of the two real (v1) sessions in ../shared, and generated sessions written as
v3, v2 and (converted) v1 (corpora and mutations live in tests/damaged_sessions.py). Each test
case is one mutation of one corpus, drawn from `random.Random(seed/corpus/mutation/n)`.
`SESSIONFOLD_FUZZ_CASES` (default 1) sets how many cases each corpus and mutation gets,
`SESSIONFOLD_FUZZ_SEED` (default 0) the seed: e.g.
`SESSIONFOLD_FUZZ_CASES=50 pytest tests/unit/test_fuzz_sessions.py` for a long run.

Counts, precisely: the objects of a file are, over its non-blank lines (CR/LF stripped), the
JSON values `split_line` finds plus one for an unreadable remainder; the reader yields exactly
one entry envelope or one dead letter per object, plus a placeholder after a dead letter that
keeps its place (never before the header, never for a duplicate id); entry and placeholder
seqs run 1..N without a hole.

Oracles (what the damaged file must fold to, dead-letter counts aside):
- a dead object whose id can be read (schema-invalid; any dead line of a v1 file): the file with
  that line replaced by a neutral node, an entry of an unknown type with the same id and parent;
- an unreadable line of a v2/v3 file (a gap): the file without it, its children re-pointed at
  the entry before it; compared on the branch (rows without their seq) and the metrics, since
  the gap keeps its seq and the removed line does not; the last line: the whole state but the
  ledger's last accepted seq;
- a duplicate id: the file without the duplicate line;
- an unknown type: the neutral node; two objects on a line, CRLF, blank lines, a huge valid
  line: the intact file;
- a lone surrogate escape in a text: the file with U+FFFD there; a non-finite number (`NaN`,
  `Infinity`, `1e400`): a dead line, like any line that is not JSON;
- parent cycles: no oracle but no crash, no hang and the counts.
"""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from damaged_sessions import CORPORA, MUTATIONS, SHARED, Case, Corpus, write_case

from sessionfold.events.envelope import EntryEnvelope, PlaceholderEnvelope, decode, encode
from sessionfold.events.lines import split_line
from sessionfold.projections.pruning import context_metrics as metrics
from sessionfold.projections.pruning import digest
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.runtime.embedded import EmbeddedRuntime

SEED = int(os.environ.get("SESSIONFOLD_FUZZ_SEED", "0"))
CASES = int(os.environ.get("SESSIONFOLD_FUZZ_CASES", "1"))


# --- folding and counting --------------------------------------------------------------------


def objects_in(path: Path) -> int:
    """JSON values on the file's non-blank lines, plus one per unreadable remainder."""
    count = 0
    for line in path.read_bytes().split(b"\n"):
        line = line.rstrip(b"\r\n")
        if line.strip():
            values, remainder = split_line(line)
            count += len(values) + (remainder is not None)
    return count


def fold(path: Path) -> tuple[EmbeddedRuntime, list[Any]]:
    """The file's records, folded as they came off the wire (encoded and decoded)."""
    records = list(read_session_file(path))
    runtime = EmbeddedRuntime()
    for record in records:
        runtime.publish(record if isinstance(record, DeadLetter) else decode(encode(record)))
    return runtime, records


def check_counts(path: Path, records: list[Any]) -> None:
    entries = [r for r in records if isinstance(r, EntryEnvelope)]
    letters = [r for r in records if isinstance(r, DeadLetter)]
    places = [r for r in records if isinstance(r, PlaceholderEnvelope)]
    assert len(entries) + len(letters) == objects_in(path)
    assert len(entries) + len(letters) + len(places) == len(records)
    for n, record in enumerate(records):
        if isinstance(record, PlaceholderEnvelope):
            before = records[n - 1]
            assert isinstance(before, DeadLetter) and before.line == record.payload.line
            assert before.error != "DuplicateId"
    assert sorted(r.seq for r in entries + places) == list(range(1, len(entries + places) + 1))


def state_of(runtime: EmbeddedRuntime, session_id: str) -> dict[str, Any]:
    return runtime.session_state(session_id)


def unsequenced_state_of(runtime: EmbeddedRuntime, session_id: str) -> dict[str, Any]:
    """The state but for the last seq the ledger accepted (a gap at the end takes one)."""
    state = runtime.session_state(session_id)
    state["ledger"] = {k: v for k, v in state["ledger"].items() if k != "seq"}
    return state


def branch_of(runtime: EmbeddedRuntime, session_id: str) -> dict[str, Any]:
    rows = [
        {k: v for k, v in row.items() if k != "seq"}
        for row in digest.branch_rows(runtime.store, session_id)
    ]
    return {"rows": rows, "metrics": metrics.snapshot(runtime.store, session_id)}


def run_case(case: Case, session_id: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        damaged = write_case(Path(tmp), case.damaged, case)
        runtime, records = fold(damaged)
        check_counts(damaged, records)
        if case.repaired is None:
            return
        plain = Case(case.repaired)
        expected, _records = fold(write_case(Path(tmp), case.repaired, plain))
    views = {"state": state_of, "unsequenced": unsequenced_state_of, "branch": branch_of}
    view = views[case.compare]
    assert view(runtime, session_id) == view(expected, session_id)


def cases(names: dict[str, Any]) -> Iterator[Any]:
    for corpus in CORPORA:
        for mutation in names:
            yield pytest.param(corpus, mutation, id=f"{corpus}-{mutation}")


def _run(corpus_name: str, mutation: Callable[[random.Random, Corpus], Case], name: str) -> None:
    if corpus_name.startswith("real") and not SHARED.is_dir():
        pytest.skip(f"real sessions not found at {SHARED}")
    for n in range(CASES):
        rng = random.Random(f"{SEED}/{corpus_name}/{name}/{n}")
        corpus = CORPORA[corpus_name](rng)
        run_case(mutation(rng, corpus), corpus.session_id)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("corpus_name", "name"), list(cases(MUTATIONS)))
def test_damaged_session_folds_as_repaired(corpus_name: str, name: str) -> None:
    """One mutation of one corpus: no exception, no hang, counts hold, the oracle's state."""
    _run(corpus_name, MUTATIONS[name], name)
