"""Values a later turn may need, and the files pi's tools read or modified: what the offline
model names from command output (verbatim, with its turn) and what the fold records, so the
rendered state keeps the paths and values the work used again."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_ledger_verify import Session

from sessionfold.events.envelope import EntryEnvelope
from sessionfold.ports.ledger.model import OfflineModel
from sessionfold.projections.ledger import values as ledger_values
from sessionfold.projections.ledger.facts import facts
from sessionfold.projections.ledger.render import render
from sessionfold.projections.ledger.values import command_values
from sessionfold.streams.publishing.session_file import read_session_file
from sessionfold.streams.runtime.ledger_loop import fold_records

SESSIONS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "sessions"


@pytest.mark.parametrize(
    ("command", "output", "expected"),
    [
        (
            "wc -l src/a.ts src/b.ts",
            "  885 src/a.ts\n   12 src/b.ts\n  897 total",
            [
                ("885 src/a.ts", "lines, wc -l"),
                ("12 src/b.ts", "lines, wc -l"),
                ("897 total", "lines, wc -l"),
            ],
        ),
        (
            "npx tsc",
            "src/x.ts(1110,8): error TS2339: nope",
            [("src/x.ts(1110,8)", "error location")],
        ),
        ("ruff check", "app/y.py:12:5: error E501", [("app/y.py:12:5", "error location")]),
        ("git commit -m x", "[main 3f9a2c1] x\n 1 file changed", [("3f9a2c1", "commit made")]),
        (
            "git log --oneline | head",
            "e9f6de7 WP14\n934c2bc WP13",
            [("e9f6de7", "newest commit logged")],
        ),
        (
            "npm start",
            "listening on http://localhost:8080 (port 8080)",
            [
                ("localhost:8080", "address"),
                ("port 8080", "port"),
            ],
        ),
        (
            "pytest",
            "12 passed, 1 failed\nDuration 3.2s",
            [
                ("3.2s", "timing"),
                ("12 passed", "test total"),
                ("1 failed", "test total"),
            ],
        ),
    ],
)
def test_command_values_reads_values_by_their_shape(
    command: str, output: str, expected: list[tuple[str, str]]
) -> None:
    """Each kind is read where its shape says what it is."""
    assert command_values(command, output) == expected


def test_command_values_skips_bare_numbers_linter_timings_and_cut_lines() -> None:
    """No 'any number': grep line numbers, "in 122ms" and lines cut by the excerpt are left."""
    assert command_values("grep -n foo x.ts", "128: foo()\n1020: foo(1)") == []
    assert command_values("npm run check", "Checked 50 files in 122ms. No fixes applied.") == []
    excerpt = "head line\nsrc/long/pa … h.ts(8,49): error TS1\nlast line"
    assert command_values("tsc", excerpt) == []


def test_the_offline_model_names_values_verbatim_with_their_turn() -> None:
    """A wc count and a port from the span's commands become V rows naming their command."""
    session = Session()
    session.users("count the lines")
    session.bash("wc -l src/core/agent-session.ts", "  885 src/core/agent-session.ts")
    session.bash("npm start", "listening on port 8080")
    payload = session.run(OfflineModel())
    values = [(v["value"], v["turn"], v["what"]) for v in session.state()["values"]]
    assert values == [
        ("885 src/core/agent-session.ts", "C1", "lines, wc -l"),
        ("port 8080", "C2", "port"),
    ]
    assert "V1 885 src/core/agent-session.ts (lines, wc -l) [C1]" in payload["summary"]


def test_the_offline_model_keeps_the_newest_values_of_a_span() -> None:
    """At most `values_per_span`, the newest; a value seen again counts from its newest turn."""
    model = OfflineModel(values_per_span=2)
    commands = [
        {"id": f"C{n}", "command": "git commit", "output": f"[main {n:07x}a] x"} for n in range(4)
    ]
    commands.append({"id": "C9", "command": "git commit", "output": "[main 0000000a] again"})
    answer = model.diff({"messages": [], "rules": [], "commands": commands, "errors": []})
    assert [(v["value"], v["turn"]) for v in answer["values"]] == [
        ("0000003a", "C3"),
        ("0000000a", "C9"),
    ]


def _tool(session: Session, name: str, path: str, error: bool = False) -> None:
    """A file tool call and its result."""
    call = f"f{session.seq}"
    block = {"type": "toolCall", "id": call, "name": name, "arguments": {"path": path}}
    session.feed({"type": "message", "message": {"role": "assistant", "content": [block]}})
    result = {
        "role": "toolResult",
        "toolCallId": call,
        "toolName": name,
        "content": [{"type": "text", "text": "Could not find the text" if error else "done"}],
        "isError": error,
    }
    session.feed({"type": "message", "message": result})


def test_files_read_and_modified_are_recorded_once_and_rendered() -> None:
    """Successful file tool calls become F rows, once per path and kind; a failed edit is an
    error, not a modification; a modified file is not listed again as read."""
    session = Session()
    session.users("look around")
    _tool(session, "read", "/w/src/a.ts")
    _tool(session, "read", "/w/src/a.ts")
    _tool(session, "read", "/w/src/b.ts")
    _tool(session, "edit", "/w/src/a.ts")
    _tool(session, "edit", "/w/src/c.ts", error=True)
    _tool(session, "write", "/w/src/d.ts")
    session.run(OfflineModel())
    state = session.state()
    assert [(f["id"], f["path"], f["op"]) for f in state["files"]] == [
        ("F1", "/w/src/a.ts", "read"),
        ("F2", "/w/src/b.ts", "read"),
        ("F3", "/w/src/a.ts", "modified"),
        ("F4", "/w/src/d.ts", "modified"),
    ]
    assert [e["tool"] for e in state["errors"]] == ["edit"]
    summary, _ = render(state)
    modified = summary.split("## Files modified\n", 1)[1].split("\n\n", 1)[0]
    read = summary.split("## Files read\n", 1)[1].split("\n\n", 1)[0]
    assert modified == "- /w/src/a.ts\n- /w/src/d.ts" and read == "- /w/src/b.ts"
    assert not [k for k in session.store if "/call/" in k]  # call rows are cleaned up


def test_files_read_give_way_before_errors_and_modified_files_late() -> None:
    """Over the size, files read go right after the oldest commands; files modified stay."""
    state = {
        "rules": [],
        "commands": [{"id": f"C{n}", "command": "x" * 80, "exit": 0} for n in range(40)],
        "errors": [{"id": "E1", "tool": "bash", "head": "boom"}],
        "files": [{"path": f"/w/read{n}.ts", "op": "read"} for n in range(40)]
        + [{"path": "/w/changed.ts", "op": "modified"}],
    }
    summary, fit = render(state, limit=500)
    assert len(summary) <= 500 and fit["commands"] == 40 and fit["read"] > 0
    assert "errors" not in fit
    assert "/w/changed.ts" in summary and "E1 (bash)" in summary


def test_facts_on_the_real_session_keep_more_than_before() -> None:
    """before-compaction.jsonl: our state kept 12 of the values used again before the files
    and command values; it keeps at least 17 now (pi's summaries: 20)."""
    path = SESSIONS / "before-compaction.jsonl"
    if not path.is_file():
        pytest.skip(f"real session not found in {SESSIONS} (../shared is absent)")
    records = list(read_session_file(path))
    entries = [r.payload.entry for r in records if isinstance(r, EntryEnvelope)]
    run = fold_records(records, OfflineModel(), final_pass=False)
    rows = facts(entries, run.payloads)
    assert sum(r.ours or 0 for r in rows) >= 17
    assert sum(r.pi or 0 for r in rows) == 20
    assert all(r.oursChars is not None and r.oursChars <= 12_000 for r in rows)


def test_a_value_in_the_middle_of_a_long_output_is_kept() -> None:
    """The fold reads values from the whole output, so an error location past the excerpt's
    head and tail is still named, and verification finds it in what the turn holds."""
    session = Session()
    session.users("type check")
    middle = "src/x.ts(1110,8): error TS2339: Property 'settingsManager' does not exist"
    output = "\n".join(["noise " * 20] * 5 + [middle] + ["noise " * 20] * 5)
    session.bash("npx tsgo --noEmit", output, code=2)
    session.run(OfflineModel())
    [command] = session.state()["commands"]
    assert middle not in command["excerpt"]
    assert command["values"] == [["src/x.ts(1110,8)", "error location"]]
    assert [v["value"] for v in session.state()["values"]] == ["src/x.ts(1110,8)"]


_VALUE_TEXTS = (
    "src/a.ts:12:5 - ERROR TS2304: nope\nWarning: b.py:3:1 warning x",
    "[main 1a2b3c4] msg\nlistening on LOCALHOST:8080 and http://127.0.0.1:3000, PORT 5432",
    "Took 3.2s\nDURATION: 1.4 s\nDone in 12s\nFinished in 3m\n3 passed, 1 failed, 2 errors",
    "Elapsed: 7ms time: 9s 4 tests 1 test 2 skipped",
    "nothing here at all",
    "ſrc/a.ts:1:2 warnıng and 5 passed",  # not ASCII: always scanned
)


@pytest.mark.parametrize("text", _VALUE_TEXTS)
def test_skipping_outputs_without_a_patterns_words_finds_what_a_full_scan_finds(
    text: str,
) -> None:
    """The word check before each output pattern never hides a match the pattern has."""
    lowered = text.lower() if text.isascii() else None
    for pattern in ledger_values._NEEDS:
        scanned = [m.group(0) for m in ledger_values._scanned(pattern, text, lowered)]
        assert scanned == [m.group(0) for m in pattern.finditer(text)]
        for line in text.splitlines():  # each line alone, so most patterns miss some
            low = line.lower() if line.isascii() else None
            assert [m.group(0) for m in ledger_values._scanned(pattern, line, low)] == [
                m.group(0) for m in pattern.finditer(line)
            ]


#: Pieces of outputs near the output patterns' words: the words (in the case a pattern takes
#: and in others), separators (every ASCII character \\s matches among them), numbers and
#: units, and non-ASCII letters that re.I equates with ASCII ones.
_WORDS = (
    "error",
    "ERROR",
    "errors",
    "warning",
    "Warning",
    "port",
    "PORT",
    "Port",
    "took",
    "Took",
    "TOOK",
    "duration",
    "Duration:",
    "elapsed",
    "Elapsed:",
    "time:",
    "Time:",
    "TIME:",
    "Done in",
    "done in",
    "Finished in",
    "Completed in",
    "passed",
    "failed",
    "skipped",
    "test",
    "Tests",
    "[main",
    "[a/b (root-commit)",
    "]",
    "localhost",
    "127.0.0.1",
    "0.0.0.0",
    "[::1]",
    "[::]",
    "a.ts",
    "b.ts(3,4)",
    "c.py:12:5",
    "x[::]",
    "ſ",
    "ı",
    "K",
)
_SEPARATORS = (" ", " ", " ", ":", " - ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1f", "x")
_NUMBERS = ("3", "42", "8080", "1a2b3c4", "1.5", "ms", "s", "min", "é", "3ms", "1.5 s")
_PIECE = st.sampled_from((*_WORDS, *_SEPARATORS, *_NUMBERS))


def _grid() -> list[str]:
    """Every word between every separator and number, at a line's start and after text."""
    return [
        f"{before}{number}{gap}{word}{gap}{number}{after}"
        for word in _WORDS
        for gap in _SEPARATORS
        for number in _NUMBERS
        for before, after in (("", ""), ("x ", "."), ("\n", "s"), ("x", ")"))
    ]


def test_the_word_check_finds_every_match_of_the_grid() -> None:
    """Each pattern's word check keeps every output of the grid that the pattern matches."""
    for text in _grid():
        lowered = text.lower() if text.isascii() else None
        for pattern in ledger_values._NEEDS:
            scanned = ledger_values._scanned(pattern, text, lowered)
            assert [m.span() for m in scanned] == [m.span() for m in pattern.finditer(text)]


@settings(max_examples=1000)
@given(st.lists(_PIECE, max_size=40).map("".join))
def test_the_word_check_never_hides_a_match(text: str) -> None:
    """Property: for any output made of pieces near the patterns' words, the word check
    before each pattern finds exactly what the pattern's full scan finds."""
    lowered = text.lower() if text.isascii() else None
    for pattern in ledger_values._NEEDS:
        scanned = [(m.start(), m.group(0)) for m in ledger_values._scanned(pattern, text, lowered)]
        assert scanned == [(m.start(), m.group(0)) for m in pattern.finditer(text)]


#: `shapes` as it read every text whole with the one alternation (before it read only the
#: runs that can hold a match): the reference the faster reading must equal.
_SHAPE_WHOLE = re.compile(
    r"(?<![\w.@/~-])(?:~|\.{1,2})?/(?:[\w.@+-]+/)*[\w.@+-]+"
    r"|(?<![\w.@/-])[\w.@-]+(?:/[\w.@-]+)+\.\w+\b"
    r"|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"
    r"|\b[a-z]+(?:[A-Z][a-z0-9]*)+\b"
    r"|\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b"
    r"|\b[A-Za-z][a-z0-9]*(?:_[A-Za-z0-9]+)+\b"
)


def _shapes_whole(text: str) -> list[str]:
    found: dict[str, None] = {}
    for match in _SHAPE_WHOLE.finditer(text):
        value = match.group(0).rstrip(".:,")
        if len(value) >= 4 and value not in ("/", "./", "../"):
            found[value] = None
    return list(found)


#: Pieces near every alternative's edges: the characters a run is made of and its
#: neighbours, words with and without a hint (camel and Pascal case, snake case, hex runs one
#: short of a hash and long enough, with and without a digit or a letter), the three-character
#: values the length bound drops, and non-ASCII word characters (a digit \d takes but
#: [0-9a-f] does not, letters re's \w takes).
_SHAPE_PIECES = st.sampled_from(
    (
        *"/~.@+-_:,;()[]'\"` \t\n",
        "..",
        "./",
        "../",
        "~/",
        "abc",
        "ab",
        "x",
        "Ab",
        "ABC",
        "fooBar",
        "FooBar",
        "Foo",
        "a9Z",
        "snake_case",
        "_x",
        "deadbee",
        "deadbe",
        "abcdefa",
        "1234567",
        "1a2b3c4",
        "0123456789abcdef0123456789abcdef0123456789",
        "src/a.ts",
        "a.b",
        "é",
        "\u0663",
        "\u017f",
        "\u212a",
        "\u0130",
        "x\u0663",
    )
)


@settings(max_examples=3000)
@given(st.one_of(st.lists(_SHAPE_PIECES, max_size=50).map("".join), st.text(max_size=200)))
def test_shapes_reads_only_runs_that_can_match_and_finds_what_the_whole_scan_finds(
    text: str,
) -> None:
    """Property: `shapes`, which reads only the runs of a text that can hold a value, finds
    the values one scan of the whole text with the one alternation found, in the same order."""
    assert ledger_values.shapes(text) == _shapes_whole(text)


@pytest.mark.parametrize("name", ["before-compaction.jsonl", "large-session.jsonl"])
def test_shapes_equals_the_whole_scan_on_the_real_sessions_outputs(name: str) -> None:
    """On every tool output of a real session, whole and line by line, `shapes` finds what
    the whole scan finds."""
    path = SESSIONS / name
    if not path.is_file():
        pytest.skip(f"real session not found in {SESSIONS} (../shared is absent)")
    outputs = 0
    for record in read_session_file(path):
        if not isinstance(record, EntryEnvelope):
            continue
        message = record.payload.entry.get("message")
        if not isinstance(message, dict) or message.get("role") != "toolResult":
            continue
        for block in message.get("content") or ():
            text = block.get("text") if isinstance(block, dict) else None
            if isinstance(text, str):
                outputs += 1
                assert ledger_values.shapes(text) == _shapes_whole(text)
                for line in text.splitlines():
                    assert ledger_values.shapes(line) == _shapes_whole(line)
    assert outputs > 100


#: The error-line pattern as value_signals searched every output and line with it.
_ERROR_LINE_SCAN = re.compile(
    r"error|fail|not found|no such|cannot|can't|denied|invalid|refused|exception|×", re.I
)
#: Pieces of the error words in every case, cut short, and the non-ASCII letters re.I
#: equates with their ASCII letters (long s, dotless i, Kelvin sign, dotted capital I).
_ERROR_PIECES = st.sampled_from(
    (
        "error",
        "ERROR",
        "Err",
        "or",
        "fail",
        "FaIl",
        "not found",
        "not",
        " found",
        "No Such",
        "cannot",
        "can't",
        "CAN'T",
        "denied",
        "invalid",
        "refused",
        "exception",
        "×",
        "x",
        " ",
        "\n",
        "\u017f",
        "\u0131",
        "\u212a",
        "\u0130",
        "nvalid",
        "a",
    )
)


@settings(max_examples=2000)
@given(st.one_of(st.lists(_ERROR_PIECES, max_size=12).map("".join), st.text(max_size=60)))
def test_the_error_word_look_answers_as_the_case_insensitive_scan(text: str) -> None:
    """Property: the look for error words in the lower-cased ASCII text (the scan otherwise)
    says a text reports a failure exactly when the case-insensitive pattern finds one."""
    assert ledger_values._reports_failure(text) == (_ERROR_LINE_SCAN.search(text) is not None)


#: Pieces of error locations: names (with dots, slashes, '@', '-', non-ASCII word letters),
#: the characters of both suffixes apart and together, suffixes one part short, the words in
#: any case, and what may stand between a location and its word.
_LOCATION_PIECES = st.sampled_from(
    (
        "a",
        "b.ts",
        ".",
        "/",
        "@",
        "-",
        "é",
        "\u0345",
        "src/x.py",
        ":",
        "(",
        ")",
        ",",
        "12",
        "3",
        ":12:5",
        "(3,4)",
        ":7",
        "(3,",
        " ",
        "\n",
        " - ",
        ": ",
        "error",
        "ERROR",
        "Warning",
        "warnıng",
        "errors",
        "x",
    )
)


@settings(max_examples=2000)
@given(st.lists(_LOCATION_PIECES, max_size=30).map("".join))
def test_error_locations_tried_at_their_possible_starts_are_the_scans(text: str) -> None:
    """Property: trying the error location pattern only where a name ends at a location
    suffix finds the matches a scan of every position finds, and the port pattern tried
    where "port" stands finds the scan's ports."""
    lowered = text.lower() if text.isascii() else None
    for pattern in (ledger_values._ERROR_LOCATION, ledger_values._PORT):
        tried = [(m.start(), m.group(0)) for m in ledger_values._scanned(pattern, text, lowered)]
        assert tried == [(m.start(), m.group(0)) for m in pattern.finditer(text)]


#: Pieces of every output pattern's matches and near misses: its words in the case it takes
#: and in others, digits (ASCII and other decimal digits, which \d takes), word characters
#: before them, "[" at a line's start and elsewhere, hashes, addresses, and separators.
_OUTPUT_PIECES = st.sampled_from(
    (
        *_WORDS,
        " passed",
        " failed",
        " errors",
        " tests",
        "\u0663",
        "\u0661\u0662",
        "x3",
        "_",
        "[",
        "\n[",
        "[main 1a2b3c4]",
        "localhost:80",
        "127.0.0.1:3000",
        "[::1]:8080",
        "a[::]:9",
        "Took ",
        "took 3s",
        "Done in 12s",
        "port 8080",
        "Port\t42",
        "import 80",
        "3 ",
        "12",
        *_SEPARATORS,
    )
)


@settings(max_examples=3000)
@example("port 8080 x")  # a port at the text's start, and a word character at its end
@example("127.0.0.1:3000 [::1]:80 took 3s")
@given(st.lists(_OUTPUT_PIECES, max_size=40).map("".join))
def test_every_output_pattern_tried_at_its_possible_starts_finds_the_scans_matches(
    text: str,
) -> None:
    """Property: each output pattern, tried only where its words (or a line's "[", or the
    digits before a total's word) can start a match, finds the spans a scan of every position
    finds."""
    lowered = text.lower() if text.isascii() else None
    for pattern in ledger_values._NEEDS:
        tried = [m.span() for m in ledger_values._scanned(pattern, text, lowered)]
        assert tried == [m.span() for m in pattern.finditer(text)], pattern.pattern


@settings(max_examples=1000)
@given(
    st.lists(
        st.one_of(st.lists(_SHAPE_PIECES, max_size=30).map("".join), st.text(max_size=80)),
        max_size=6,
    )
)
def test_shapes_read_through_one_memo_of_runs_are_each_texts_shapes(texts: list[str]) -> None:
    """Property: texts read one after another through one memo of their runs' values (as
    `value_signals` reads a span) each get the values the whole scan finds in them alone."""
    memo: ledger_values.RunMemo = {}
    for text in texts:
        assert ledger_values._shapes(text, memo) == _shapes_whole(text)


def _run_values_whole(run: str) -> tuple[str, ...]:
    """`_run_values` as it read every hinted run with all six alternatives (the oracle)."""
    if ledger_values._SHAPE_HINT.search(run) is None:
        return ()
    values = (value.rstrip(".:,") for value in ledger_values._SHAPE_AT_START.findall(run))
    return tuple(value for value in values if len(value) >= 4)


#: The characters runs are made of, in the pieces the alternatives turn on: capitals after
#: lower case and digits, hex digits, a "_", a "/", dots, a titlecase letter (neither lower
#: nor upper case) and other non-ASCII word characters.
_RUN_PIECES = st.sampled_from(
    (
        *"aAfFgZ09_/.~@+-",
        *("deadbee", "abc1234", "Foo", "fooBar", "getX", "ABC", "x_y", "src/", ".ts", "a.b"),
        *("\u01c5", "\u00e9", "\u00c9", "\u0663"),
    )
)


@settings(max_examples=3000)
@example("deadbee")  # seven hex digits, no digit: a hint but no hash
@example("abc1234")
@example("fooBar")
@example("\u01c5fooBar")  # titlecase: `islower` is false
@example("src/fooBar.ts")
@example("x_yZ")
@given(
    st.one_of(
        st.lists(_RUN_PIECES, min_size=1, max_size=12).map("".join),
        st.from_regex(ledger_values._SHAPE_RUN, fullmatch=True),
    )
)
def test_a_runs_values_read_with_the_alternatives_it_allows_are_the_whole_reads(run: str) -> None:
    """Property: a run's values, read with only the alternatives its characters allow (no
    path without "/", no snake case without "_", no camel or Pascal case in a run
    `islower`), are the ones every alternative finds."""
    assert ledger_values._run_values(run) == _run_values_whole(run)


#: The code `_DEFINES` reads: its words, the same words inside others, what may follow them.
_DEFINE_PIECES = st.sampled_from(
    (
        *ledger_values._DEFINE_WORDS,
        "function*",
        "classy",
        "undef",
        "_let",
        "é",
        "x",
        "$a",
        "name",
        " ",
        "\n",
        "\t",
        "(",
        "=",
        "9",
    )
)


@settings(max_examples=2000)
@given(st.one_of(st.lists(_DEFINE_PIECES, max_size=30).map("".join), st.text(max_size=80)))
def test_defined_names_tried_where_a_word_stands_are_the_scans(text: str) -> None:
    """Property: the names `_DEFINES` finds tried only where its words start after no word
    character are the names its scan of every position finds, in order."""
    scanned = [m.group("name") for m in ledger_values._DEFINES.finditer(text)]
    assert ledger_values._defined_names(text) == scanned


_LINE_BREAKS = ("\n", "\r\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028")


@settings(max_examples=2000)
@given(
    st.lists(
        st.one_of(_ERROR_PIECES, st.sampled_from(_LINE_BREAKS), st.sampled_from(("x", " "))),
        max_size=30,
    ).map("".join)
    | st.text(max_size=80)
)
@example("x \u00d7\n\u0131nvalid\nerror \u00e9")  # dotless i: re.I reads "invalid"
@example("no \u017fuch file\n\u0130NVALID\n\u212a")
def test_error_lines_found_by_their_words_are_the_lines_the_scan_finds(text: str) -> None:
    """Property: the lines found where the error words stand in the lower-cased output are
    the lines that each report a failure, read one by one, in order."""
    expected = [line for line in text.splitlines() if _ERROR_LINE_SCAN.search(line) is not None]
    assert ledger_values._error_lines(text) == expected
