"""Which values the offline pass names when an answer can hold only a few: each signal the span
itself shows (a command, a definition, an error line, a user message, repetition, the last
turns, code's own reading) ranks a value over one without it; what is named still stands
verbatim in its turn, and the summary spends only the room left under its size on each value's
line of output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ledger_verify import Scripted, Session

from sessionfold.events.envelope import EntryEnvelope
from sessionfold.ports.ledger.answer import Answer
from sessionfold.ports.ledger.context import PassContext
from sessionfold.ports.ledger.model import VALUES_PER_ANSWER, OfflineModel
from sessionfold.ports.ledger.pass_ import run_pass
from sessionfold.projections.ledger.facts import facts
from sessionfold.projections.ledger.render import render, value_lines
from sessionfold.projections.ledger.values import (
    command_values,
    shapes,
    span_values,
    value_signals,
)
from sessionfold.streams.publishing.session_file import read_session_file
from sessionfold.streams.runtime.ledger_loop import fold_records

SESSIONS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "sessions"


def _command(n: int, output: str, command: str = "cat notes.txt") -> dict[str, Any]:
    """A prompt's command row: no values read by code unless its output has their shape."""
    return {"id": f"C{n}", "command": command, "output": output, "values": []}


def _one(commands: list[dict[str, Any]], **signals: Any) -> str:
    """The single value kept when the span may name only one."""
    [item] = span_values(commands, per_span=1, **signals)
    return item["value"]


# --- each signal ranks a value over one without it ------------------------------------------
#
# In every case the value without the signal is the newer one, so with the signal gone the
# tie would go to it: each test fails if its signal is removed.


def test_a_value_the_assistant_wrote_in_a_command_is_kept_over_one_it_did_not() -> None:
    """It searched for it: a name in a command the span ran, that an output shows."""
    commands = [
        _command(1, "alphaValue: 3 hits", command="grep -c alphaValue src/a.ts"),
        _command(2, "betaValue"),
    ]
    assert _one(commands) == "alphaValue"
    assert "command" in value_signals(commands)["alphaValue"][0]


def test_a_value_code_shown_defines_is_kept_over_one_it_only_uses() -> None:
    """`function alphaValue(` in an output defines it; `betaValue` is only called."""
    commands = [_command(1, "export function alphaValue(x) {"), _command(2, "call betaValue()")]
    assert _one(commands) == "alphaValue"


@pytest.mark.parametrize("where", ["output line", "error head"])
def test_a_value_on_an_error_line_is_kept_over_one_on_a_plain_line(where: str) -> None:
    """A line that reports a failure, in an output or as the span's error head."""
    if where == "output line":
        commands = [_command(1, "error: alphaValue is not set"), _command(2, "betaValue ok")]
        errors: list[dict[str, Any]] = []
    else:  # the error is a turn too: the other value shows in two turns as well
        commands = [_command(1, "alphaValue"), _command(2, "betaValue"), _command(3, "betaValue")]
        errors = [{"id": "E1", "head": "alphaValue: cannot be read"}]
    assert _one(commands, errors=errors) == "alphaValue"


def test_a_value_the_user_named_is_kept_over_one_seen_as_often() -> None:
    """The user's message names `alphaValue`; `betaValue` shows in two outputs instead."""
    commands = [_command(1, "alphaValue"), _command(2, "betaValue"), _command(3, "betaValue")]
    messages = [{"id": "u1", "text": "why is alphaValue empty?"}]
    assert _one(commands, messages=messages) == "alphaValue"
    assert _one(commands) == "betaValue"  # without the message: seen twice, and newer


def test_a_value_several_turns_show_is_kept_over_one_shown_once() -> None:
    """Shown by two commands' outputs beats shown by one newer output."""
    commands = [_command(1, "alphaValue"), _command(2, "alphaValue"), _command(3, "betaValue")]
    assert _one(commands) == "alphaValue"


def test_a_value_the_last_commands_show_is_kept_over_an_older_one_seen_as_often() -> None:
    """Of twelve commands, the last eight are the span's last turns."""
    commands = [_command(1, "betaValue"), _command(2, "betaValue")]
    commands += [_command(n, "nothing here") for n in range(3, 12)]
    commands.append(_command(12, "alphaValue"))
    assert _one(commands) == "alphaValue"
    commands[-1] = _command(12, "nothing here either")
    commands[2] = _command(3, "alphaValue")  # shown once, and not among the last turns
    assert _one(commands) == "betaValue"


def test_a_value_code_read_by_its_shape_is_kept_over_one_read_by_shape_alone() -> None:
    """A commit made (`command_values`) over a newer identifier nothing else says more of."""
    commands = [
        _command(1, "[main 3f9a2c1] fix the parser", command="git commit -am fix"),
        _command(2, "betaValue"),
    ]
    assert _one(commands) == "3f9a2c1"


def test_a_path_the_assistant_wrote_weighs_less_than_a_name_it_wrote() -> None:
    """A path in a command is the file it works on (the command line records it); a name is
    what it searched for. Both still outrank a value nothing else says more of."""
    commands = [
        _command(1, "alphaValue", command="grep -l alphaValue src"),
        _command(2, "create mode 100644 src/b.ts", command="git add src/b.ts && git commit"),
        _command(3, "betaValue"),
    ]
    assert [i["value"] for i in span_values(commands, per_span=2)] == ["src/b.ts", "alphaValue"]
    assert value_signals(commands)["src/b.ts"][0] >= {"operand"}


def test_items_come_weakest_first_and_a_held_value_is_not_named_again() -> None:
    """The strongest last (the summary leaves out its oldest value lines first); a value a
    kept value holds verbatim is not named twice."""
    commands = [
        _command(1, "  885 src/core/agent-session.ts", command="wc -l src/core/agent-session.ts"),
        _command(2, "alphaValue", command="grep -c alphaValue src"),
        _command(3, "plainValue"),
    ]
    items = span_values(commands, per_span=5)
    assert [i["value"] for i in items] == [
        "plainValue",
        "885 src/core/agent-session.ts",
        "alphaValue",
    ]
    assert items[1]["what"] == "lines, wc -l" and items[2]["what"] == "in a command"


# --- what is named stands verbatim in its turn ----------------------------------------------


def test_only_what_an_output_shows_is_named_never_a_command_or_a_cut_fragment() -> None:
    """A name only the command holds, or one in the partial lines at the excerpt's cut, is
    not a value of the span; the rest is kept by verification, verbatim in its turn."""
    session = Session()
    session.users("look at the parser")
    # The excerpt keeps 240 characters of each end: both names straddle a cut.
    head = "start\n" + "x" * 220 + " partialNameAtTheCut"
    tail = "tailNameCutToo" + "y" * 170 + "\nparseConfig returned wholeName"
    session.bash("npx tsgo --noEmit && grep -rn parseConfig src", head + "\n" + tail)
    request = session.request()
    payload = run_pass(request, OfflineModel())
    session.fold.apply_pass(payload)
    [command] = session.state()["commands"]
    assert " … " in command["excerpt"] and "partialNameAt" in command["excerpt"]
    assert "NameCutToo" in command["excerpt"]
    named = [v["value"] for v in session.state()["values"]]
    assert "parseConfig" in named and "wholeName" in named
    assert not {"noEmit", "partialNameAtTheCut", "tailNameCutToo"} & set(named)
    context = PassContext.from_request(request)
    for row in session.state()["values"]:
        assert row["value"] in context.turns[row["turn"]]
    assert "value-not-verbatim" not in payload["record"]["dropped"]


def test_a_value_named_in_a_turn_that_does_not_show_it_is_still_dropped() -> None:
    """The verbatim rule is verification's, for any model: the ranking changes nothing."""
    session = Session()
    session.users("start it")
    session.bash("npm start", "listening on port 8080")
    answer = {
        "labels": [{"message": "u1", "label": "not a rule"}],
        "values": [{"value": "9090", "turn": "C1"}, {"value": "8080", "turn": "C1"}],
        "narrative": "n",
    }
    payload = session.run(Scripted(answer))
    assert [v["value"] for v in session.state()["values"]] == ["8080"]
    assert payload["record"]["dropped"]["value-not-verbatim"] == 1


def test_shapes_read_paths_hashes_and_identifiers_but_no_bare_number() -> None:
    """The shapes a value is read by; a bare number says nothing of what it is."""
    text = "see src/lib/x.ts and /etc/hosts at 3f9a2c1 in getThemesDir via first_kept_id: 1234"
    assert shapes(text) == [
        "src/lib/x.ts",
        "/etc/hosts",
        "3f9a2c1",
        "getThemesDir",
        "first_kept_id",
    ]


# --- the caps hold ---------------------------------------------------------------------------


def test_the_offline_model_names_no_more_values_than_an_answer_may_hold() -> None:
    """Fifty candidates: the answer names the schema's bound and still verifies whole."""
    assert Answer.model_fields["values"].metadata[0].max_length == VALUES_PER_ANSWER
    session = Session()
    session.users("list them")
    for n in range(50):
        name = f"item{chr(65 + n // 26)}{chr(97 + n % 26)}Value"
        session.bash(f"grep -n {name} src", f"1: const {name} = {n}")
    payload = session.run(OfflineModel(values_per_span=100))
    assert payload["record"]["narrativeKind"] == "model"
    assert len(session.state()["values"]) == VALUES_PER_ANSWER


def test_span_values_keeps_at_most_per_span() -> None:
    """However many candidates, `per_span` at most; none when it is zero."""
    commands = [_command(n, f"value{chr(64 + n)}Name") for n in range(1, 30)]
    assert len(span_values(commands, per_span=3)) == 3
    assert span_values(commands, per_span=0) == []


# --- the summary spends only its spare room on the values' lines ----------------------------


def _state(commands: int = 0) -> dict[str, Any]:
    return {
        "rules": [],
        "values": [
            {"id": "V1", "value": "alphaValue", "turn": "C1", "what": "in a command"},
            {"id": "V2", "value": "betaValue", "turn": "C2", "what": "defined"},
        ],
        "commands": [
            {
                "id": "C1",
                "command": "grep -rn alphaValue src",
                "exit": 0,
                "excerpt": "src/a.ts:3: const x = alphaValue(y);\nsrc/b.ts:9: alphaValue()",
            },
            {"id": "C2", "command": "cat b.ts", "exit": 0, "excerpt": "function betaValue() {"},
        ]
        + [{"id": f"C{n}", "command": f"echo {n}" * 4, "exit": 0} for n in range(3, commands + 3)],
        "errors": [],
        "files": [],
        "spans": [],
    }


def test_room_left_gives_each_value_its_lines_of_output_verbatim() -> None:
    """With room, each value gets the line it stands in (the one showing most other values
    first), then another; the lines are the turn's own text."""
    summary, dropped = render(_state())
    assert dropped == {}
    assert (
        "- V1 alphaValue (in a command) [C1]: `src/a.ts:3: const x = alphaValue(y);`"
        " | `src/b.ts:9: alphaValue()`" in summary
    )
    assert "- V2 betaValue (defined) [C2]: `function betaValue() {`" in summary


def test_value_lines_skip_the_cut_and_lines_that_are_the_value_alone() -> None:
    """Not the partial lines around the excerpt's cut, not a bare repeat of the value; a long
    line is cut around the value."""
    excerpt = "alphaValue\nhead alphaValue part … tail\n" + "z " * 100 + "alphaValue " + "w " * 100
    [line] = value_lines("alphaValue", excerpt, limit=40)
    assert "alphaValue" in line and len(line) <= 42 and line.startswith("…")


def test_value_lines_come_only_with_room_to_spare_and_newest_first() -> None:
    """Each line is added only if the whole still fits, the newest value's first; a summary
    that had to leave anything out gets none."""
    bare = _state()
    for command in bare["commands"]:
        command["excerpt"] = ""  # no output: no value lines
    plain, _ = render(bare, limit=100_000)
    # Room for V1's first line, or for V2's (shorter) one: the newest, V2, goes first.
    one_more = len(plain) + len(": `src/a.ts:3: const x = alphaValue(y);`")
    summary, _ = render(_state(), limit=one_more)
    assert len(summary) <= one_more
    assert "`function betaValue() {`" in summary and "const x = alphaValue" not in summary
    tight, dropped = render(_state(40), limit=len(plain) + 200)
    assert dropped["commands"] > 0 and "`" not in tight.split("## Values", 1)[1].split("##")[0]


@pytest.mark.parametrize("limit", [600, 1_000, 2_000, 4_000, 12_000])
def test_the_size_holds_with_value_lines(limit: int) -> None:
    """Whatever the size, the summary never exceeds it."""
    state = _state(60)
    state["values"] += [
        {"id": f"V{n}", "value": "alphaValue", "turn": "C1", "what": "x"} for n in range(3, 40)
    ]
    summary, _ = render(state, limit=limit)
    assert len(summary) <= limit


# --- the real sessions ------------------------------------------------------------------------


def _real(name: str) -> tuple[list[Any], list[dict[str, Any]]]:
    path = SESSIONS / name
    if not path.is_file():
        pytest.skip(f"real session not found in {SESSIONS} (../shared is absent)")
    records = list(read_session_file(path))
    return records, [r.payload.entry for r in records if isinstance(r, EntryEnvelope)]


def test_facts_on_the_real_session_keep_more_than_pis_summaries() -> None:
    """before-compaction.jsonl: ours keeps clearly more of the values used again than pi's
    summaries (20), within the size."""
    records, entries = _real("before-compaction.jsonl")
    run = fold_records(records, OfflineModel(), final_pass=False)
    rows = facts(entries, run.payloads)
    ours, pi = sum(r.ours or 0 for r in rows), sum(r.pi or 0 for r in rows)
    assert pi == 20 and ours >= pi + 3
    assert all(r.oursChars is not None and r.oursChars <= 12_000 for r in rows)


def test_the_large_session_summary_stays_within_the_size() -> None:
    """large-session.jsonl has no compaction: its one pass at the end stays within 12,000."""
    records, _ = _real("large-session.jsonl")
    run = fold_records(records, OfflineModel())
    assert run.payloads and all(len(p["summary"]) <= 12_000 for p in run.payloads)
    assert all(p["record"]["narrativeKind"] == "model" for p in run.payloads)


#: Output pieces: values code reads (an error location, a commit, a timing, a port), shapes,
#: and the excerpt's cut mark, which may stand twice (an output that shows " … " itself).
_OUTPUT_PIECES = st.sampled_from(
    (
        "src/a.ts(3,4): error TS1",
        "[main 1a2b3c4] fix",
        "took 3s",
        "port 8080",
        "fooBar",
        " … ",
        "\n",
        " ",
        "x_y",
        "12 passed",
    )
)


@settings(max_examples=500)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(("ls", "npm test", "git log -1", "wc -l a")),
            st.lists(_OUTPUT_PIECES, max_size=12).map("".join),
        ),
        max_size=5,
    )
)
def test_values_read_from_each_cut_output_once_are_command_values_of_the_output(
    rows: list[tuple[str, str]],
) -> None:
    """Property: a span whose commands carry no values gets the signals it gets when each
    carries `command_values` of its output (what the pass read before it cut each output
    once for both its values and its shapes)."""
    bare = [{"id": f"C{i}", "command": c, "output": o} for i, (c, o) in enumerate(rows)]
    read = [{**row, "values": command_values(row["command"], row["output"])} for row in bare]
    assert value_signals(bare) == value_signals(read)
