"""`sessionfold install`'s pure edits: for any settings document already there, install then
uninstall gives the document back byte for byte, a second install changes nothing, and
uninstall removes only what install wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tomlkit
from hypothesis import given
from hypothesis import strategies as st

from sessionfold.streams.tools.install.changes import AddItem, EditConflict, SetKey
from sessionfold.streams.tools.install.json_edits import (
    UnreadableDocument,
    install_json,
    uninstall_json,
)
from sessionfold.streams.tools.install.plans import plan
from sessionfold.streams.tools.install.text_patch import diff
from sessionfold.streams.tools.install.toml_edits import install_toml, uninstall_toml

COMMAND = ["/opt/sf venv/bin/sessionfold"]  # a space: the hook command must quote it
ENV = {"HOME": "/home/u"}


def _edits(agent: str, gateway: bool) -> dict[str, list[Any]]:
    """Each file kind's edits of the real plan, keyed by file name."""
    made = plan(
        agent, "user", COMMAND, ENV, Path("/p"), "http://127.0.0.1:6068" if gateway else None
    )
    return {f.path.name: list(f.edits) for f in made.files}


JSON_EDITS = [
    *_edits("claude-code", True).values(),
    _edits("codex", False)["hooks.json"],
]
TRUST = SetKey(
    ("hooks", "state", "/h/.codex/hooks.json:session_start:0:0", "trusted_hash"), "sha256:0a"
)
TOML_EDITS = [
    _edits("codex", True)["config.toml"],
    _edits("codex", False)["config.toml"],
    [*_edits("codex", False)["config.toml"], TRUST],
]

keys = st.sampled_from(["hooks", "env", "mcpServers", "SessionStart", "matcher", "a", "é", "x y"])
scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=12,
)
hook_groups = st.lists(
    st.fixed_dictionaries(
        {
            "matcher": st.sampled_from(["compact", "startup", "*"]),
            "hooks": st.just([{"type": "command", "command": "x"}]),
        }
    ),
    max_size=2,
)
# Documents shaped like the agents' own: other hooks, other env keys, other MCP servers.
documents = st.fixed_dictionaries(
    {},
    optional={
        "hooks": st.fixed_dictionaries(
            {}, optional={"SessionStart": hook_groups, "Stop": hook_groups}
        ),
        "env": st.dictionaries(st.sampled_from(["A", "ANTHROPIC_MODEL"]), st.text(max_size=5)),
        "mcpServers": st.dictionaries(st.sampled_from(["other", "db"]), values, max_size=2),
        # Claude Code's own shape; the user may have allowed one of our tools already.
        "permissions": st.fixed_dictionaries(
            {},
            optional={
                "allow": st.lists(
                    st.sampled_from(["Bash(ls:*)", "Read", "mcp__sessionfold__ledger"]),
                    unique=True,
                ),
                "deny": st.lists(st.sampled_from(["WebFetch"]), max_size=1),
                "defaultMode": st.sampled_from(["default", "plan"]),
            },
        ),
        "model": st.text(max_size=6),
    },
)
layouts = st.tuples(st.sampled_from([None, 2, 4, "\t"]), st.sampled_from(["", "\n"]))


def _dumped(doc: dict[str, Any], layout: tuple[Any, str]) -> str:
    indent, newline = layout
    return json.dumps(doc, indent=indent, ensure_ascii=False) + newline


@given(documents, layouts, st.sampled_from(JSON_EDITS))
def test_json_install_then_uninstall_gives_the_document_back_byte_for_byte(
    doc: dict[str, Any], layout: tuple[Any, str], edits: list[Any]
) -> None:
    original = _dumped(doc, layout)
    installed, changes = install_json(original, edits)
    assert changes and installed != original
    again, more = install_json(installed, edits)
    assert (again, more) == (installed, [])  # a second install changes nothing
    assert uninstall_json(installed, changes) == original


@given(documents, st.sampled_from(JSON_EDITS), st.text(min_size=1, max_size=6))
def test_json_uninstall_keeps_the_users_edits_made_since(
    doc: dict[str, Any], edits: list[Any], word: str
) -> None:
    installed, changes = install_json(json.dumps(doc, indent=2), edits)
    edited = json.loads(installed)
    edited["added later"] = word
    for group in edited.get("hooks", {}).get("SessionStart", []):
        group["touched"] = True  # the user's own groups (and ours: then ours is theirs)
    after = json.loads(uninstall_json(json.dumps(edited, indent=2), changes))
    assert after["added later"] == word
    expected = {**doc, "added later": word}
    for group in expected.get("hooks", {}).get("SessionStart", []):
        group["touched"] = True
    # Our hook group was edited by the user: it is theirs now and stays; all else is undone.
    ours = [g for g in after.get("hooks", {}).get("SessionStart", []) if "sessionfold" in str(g)]
    if ours:
        expected.setdefault("hooks", {}).setdefault("SessionStart", []).extend(ours)
    assert after == expected or json.dumps(after, sort_keys=True) == json.dumps(
        expected, sort_keys=True
    )


def test_json_a_value_the_user_changed_since_install_stays() -> None:
    edits = [SetKey(("env", "ANTHROPIC_BASE_URL"), "http://127.0.0.1:6068")]
    original = '{"env": {"ANTHROPIC_BASE_URL": "https://proxy"}}'
    installed, changes = install_json(original, edits)
    assert json.loads(installed)["env"]["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:6068"
    assert uninstall_json(installed, changes) == original  # the value it replaced comes back
    mine = installed.replace("http://127.0.0.1:6068", "http://elsewhere")
    assert (
        json.loads(uninstall_json(mine, changes))["env"]["ANTHROPIC_BASE_URL"] == "http://elsewhere"
    )


@pytest.mark.parametrize("text", ["{", "[1, 2]", '"x"', '{"a": 1,}', "nul"])
def test_json_that_does_not_parse_is_refused_without_its_text(text: str) -> None:
    with pytest.raises(UnreadableDocument) as raised:
        install_json(text, [AddItem(("hooks", "SessionStart"), {"m": 1})])
    assert text not in str(raised.value) or len(text) < 3


@pytest.mark.parametrize(
    "text", ['{"hooks": "none"}', '{"hooks": {"SessionStart": {"a": 1}}}', '{"hooks": [1]}']
)
def test_json_with_a_key_of_the_wrong_type_is_refused(text: str) -> None:
    with pytest.raises(EditConflict):
        install_json(text, [AddItem(("hooks", "SessionStart"), {"m": 1})])


# -- TOML ------------------------------------------------------------------------------------

names = st.sampled_from(["other", "db", "local", "openai-x"])
comments = st.sampled_from(["", "  # why", " #x"])
toml_scalars = st.sampled_from(['"a"', "1", "true", "[1, 2]", '{ x = "y" }', "'lit'", '"""m"""'])


@st.composite
def toml_documents(draw: st.DrawFn) -> str:
    """A config.toml as a person writes one: comments, blank lines, top-level keys (a
    model_provider among them), then tables (features, other MCP servers and providers)."""
    lines: list[str] = []
    if draw(st.booleans()):
        lines.append("# my codex config")
    for key in draw(
        st.lists(st.sampled_from(["model", "model_provider", "approval_policy"]), unique=True)
    ):
        lines.append(f"{key} = {draw(toml_scalars)}{draw(comments)}")
    tables = draw(
        st.lists(
            st.sampled_from(
                [
                    "features",
                    "analytics",
                    "mcp_servers.",
                    "model_providers.",
                    "projects.'/w'",
                    "hooks.state.",
                ]
            ),
            unique=True,
        )
    )
    for table in tables:
        if draw(st.booleans()):
            lines.append("")
        header = table + draw(names) if table.endswith(".") else table
        lines.append(f"[{header}]{draw(comments)}")
        for key in draw(
            st.lists(
                st.sampled_from(["enabled", "plugins", "command", "name"]), unique=True, max_size=3
            )
        ):
            lines.append(f"{key} = {draw(toml_scalars)}{draw(comments)}")
        if draw(st.booleans()):
            lines.append("# trailing comment")
    text = "\n".join(lines)
    return text + draw(st.sampled_from(["", "\n", "\n\n"])) if text else text


@given(toml_documents(), st.sampled_from(TOML_EDITS))
def test_toml_install_then_uninstall_gives_the_document_back_byte_for_byte(
    original: str, edits: list[Any]
) -> None:
    installed, changes = install_toml(original, edits)
    assert changes
    assert tomlkit.parse(installed)["mcp_servers"]["sessionfold"]["args"][-1] == "codex"
    again, more = install_toml(installed, edits)
    assert (again, more) == (installed, [])
    assert uninstall_toml(installed, changes, [diff(original, installed)]) == original


@given(toml_documents())
def test_toml_install_keeps_every_comment_and_key(original: str) -> None:
    installed, _ = install_toml(original, TOML_EDITS[0])
    for line in original.splitlines():
        # The gateway's edits replace the provider's value (and only that).
        if not line.startswith("model_provider ="):
            assert line in installed.splitlines()


def test_toml_gateway_replaces_the_provider_and_uninstall_puts_it_back() -> None:
    original = 'model_provider = "openai"  # mine\n\n[features]\nhooks = false\n'
    installed, changes = install_toml(original, TOML_EDITS[0])
    doc = tomlkit.parse(installed)
    assert doc["model_provider"] == "sessionfold" and doc["features"]["hooks"] is True
    assert doc["model_providers"]["sessionfold"]["base_url"] == "http://127.0.0.1:6068/v1"
    assert uninstall_toml(installed, changes, [diff(original, installed)]) == original


@pytest.mark.parametrize("text", ["[features\n", "a = \n", "a = 1\na = 2\n", "x = [1,\n"])
def test_toml_that_does_not_parse_is_refused(text: str) -> None:
    with pytest.raises(UnreadableDocument):
        install_toml(text, TOML_EDITS[1])


def test_toml_with_a_table_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(EditConflict):
        install_toml('mcp_servers = "none"\n', TOML_EDITS[1])


@given(toml_documents(), st.sampled_from(TOML_EDITS), st.booleans(), st.booleans())
def test_toml_uninstall_keeps_the_users_lines_added_since_in_their_bytes(
    original: str, edits: list[Any], above: bool, below: bool
) -> None:
    installed, changes = install_toml(original, edits)
    top, bottom = ("# added by hand\n" if above else ""), ("\n[user]\nk = 1\n" if below else "")
    edited = top + installed + bottom
    assert uninstall_toml(edited, changes, [diff(original, installed)]) == top + original + bottom


@given(toml_documents(), st.sampled_from(TOML_EDITS))
def test_toml_uninstall_without_its_patch_still_takes_out_only_its_entries(
    original: str, edits: list[Any]
) -> None:
    installed, changes = install_toml(original, edits)
    # A hunk that no longer applies (the user rewrote the file): the structural undo.
    assert (
        tomlkit.parse(uninstall_toml(installed, changes)).unwrap()
        == tomlkit.parse(original).unwrap()
    )


def test_trust_is_recorded_for_our_untrusted_hook_only() -> None:
    from sessionfold.streams.tools.install.codex_trust import trust_edits

    hooks_file, command = Path("/h/.codex/hooks.json"), "/x/sessionfold hook codex"

    def hook(key: str, source: Path, cmd: str, status: str) -> dict[str, Any]:
        return {
            "key": key,
            "sourcePath": str(source),
            "command": cmd,
            "trustStatus": status,
            "currentHash": f"sha256:{key}",
        }

    listing = {
        "data": [
            {
                "hooks": [
                    hook("ours", hooks_file, command, "untrusted"),
                    hook("changed", hooks_file, command, "modified"),
                    hook("trusted", hooks_file, command, "trusted"),
                    hook("theirs", hooks_file, "other", "untrusted"),
                    hook("elsewhere", Path("/p/.codex/hooks.json"), command, "untrusted"),
                ]
            }
        ]
    }
    edits = trust_edits(listing, hooks_file, command)
    assert [e.path[2] for e in edits] == ["ours", "changed"]
    assert edits[0] == SetKey(("hooks", "state", "ours", "trusted_hash"), "sha256:ours")
    assert trust_edits({"data": []}, hooks_file, command) == []


@pytest.mark.parametrize(
    ("agent", "scope", "env", "files", "record"),
    [
        (
            "claude-code",
            "user",
            {"HOME": "/u"},
            ["/u/.claude/settings.json", "/u/.claude.json"],
            "/u/.claude",
        ),
        (
            "claude-code",
            "user",
            {"HOME": "/u", "CLAUDE_CONFIG_DIR": "/c"},
            ["/c/settings.json", "/c/.claude.json"],
            "/c",
        ),
        (
            "claude-code",
            "project",
            {"HOME": "/u"},
            ["/p/.claude/settings.json", "/p/.mcp.json"],
            "/p/.claude",
        ),
        (
            "codex",
            "user",
            {"HOME": "/u"},
            ["/u/.codex/hooks.json", "/u/.codex/config.toml"],
            "/u/.codex",
        ),
        (
            "codex",
            "user",
            {"HOME": "/u", "CODEX_HOME": "/x"},
            ["/x/hooks.json", "/x/config.toml"],
            "/x",
        ),
        (
            "codex",
            "project",
            {"HOME": "/u"},
            ["/p/.codex/hooks.json", "/p/.codex/config.toml"],
            "/p/.codex",
        ),
    ],
)
def test_each_agent_and_scope_writes_where_the_agent_reads(
    agent: str, scope: str, env: dict[str, str], files: list[str], record: str
) -> None:
    made = plan(agent, scope, COMMAND, env, Path("/p"))
    assert [str(f.path) for f in made.files] == files
    assert str(made.record.parent) == record
    if agent == "codex":
        assert made.trusted_hook is not None
        user = env.get("CODEX_HOME", "/u/.codex")
        assert str(made.trusted_hook[2]) == f"{user}/config.toml"  # the trust: the user's
        assert made.trusted_hook[1] == "'/opt/sf venv/bin/sessionfold' hook codex"
