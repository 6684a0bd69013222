"""`sessionfold install` as a user runs it: the files it writes in a home, its record and
backups, `--dry-run`, `--uninstall`, and the files it refuses to touch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomlkit

REPO = Path(__file__).resolve().parents[2]
SECRET = "do-not-print-me"


def _run(
    home: Path, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "sessionfold.streams.cli", "install", *args],
        env=env,
        cwd=cwd or home,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _home(tmp_path: Path) -> Path:
    """A home with settings of the user's own, in layouts install does not write itself."""
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    (home / ".codex").mkdir()
    (home / ".claude" / "settings.json").write_text(
        '{"model":"opus",  "hooks":{"Stop":[{"hooks":[{"type":"command","command":"x"}]}]}}'
    )
    (home / ".claude.json").write_text('{\n    "numStartups": 3,\n    "mcpServers": {}\n}\n')
    (home / ".codex" / "config.toml").write_text(
        '# mine\nmodel = "gpt"   # the model\nmodel_provider = "openai"\n'
        "\n[features]\nplugins = false\n"
    )
    return home


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_install_then_uninstall_gives_every_file_back_byte_for_byte(
    tmp_path: Path, agent: str
) -> None:
    home = _home(tmp_path)
    before = _files(home)
    first = _run(home, agent, "--gateway")
    assert first.returncode == 0, first.stderr
    installed = _files(home)
    assert installed != before
    # A second install changes nothing at all (record and backups included).
    again = _run(home, agent, "--gateway")
    assert again.returncode == 0 and "nothing to change" in again.stdout
    assert _files(home) == installed
    done = _run(home, agent, "--uninstall")
    assert done.returncode == 0, done.stderr
    assert _files(home) == before


def test_claude_code_install_writes_the_hook_the_server_and_the_base_url(tmp_path: Path) -> None:
    home = _home(tmp_path)
    assert (
        _run(home, "claude-code", "--gateway", "--serve-url", "http://127.0.0.1:7001").returncode
        == 0
    )
    settings = json.loads((home / ".claude" / "settings.json").read_text())
    # the user's keys first, in their order
    assert list(settings) == ["model", "hooks", "permissions", "env"]
    assert settings["permissions"]["allow"] == [
        "mcp__sessionfold__context_tree_query",
        "mcp__sessionfold__ledger",
    ]
    (group,) = settings["hooks"]["SessionStart"]
    command = group["hooks"][0]["command"]
    assert group["matcher"] == "compact"
    assert command.startswith(f"{sys.executable} -m sessionfold.streams.cli hook claude-code")
    assert settings["env"] == {"ANTHROPIC_BASE_URL": "http://127.0.0.1:7001"}
    server = json.loads((home / ".claude.json").read_text())["mcpServers"]["sessionfold"]
    assert server["command"] == sys.executable and server["args"][-2:] == ["mcp", "claude-code"]


def test_codex_install_writes_its_config_keeping_comments_and_says_how_to_trust(
    tmp_path: Path,
) -> None:
    home = _home(tmp_path)
    done = _run(home, "codex", "--gateway")
    assert done.returncode == 0 and "trust" in done.stdout
    text = (home / ".codex" / "config.toml").read_text()
    assert text.startswith('# mine\nmodel = "gpt"   # the model\n')
    config = tomlkit.parse(text)
    assert config["model_provider"] == "sessionfold" and config["features"]["hooks"] is True
    assert config["model_providers"]["sessionfold"]["base_url"] == "http://127.0.0.1:6068/v1"
    assert config["mcp_servers"]["sessionfold"]["args"][-2:] == ["mcp", "codex"]
    hooks = json.loads((home / ".codex" / "hooks.json").read_text())
    assert hooks["hooks"]["SessionStart"][0]["matcher"] == "compact|resume"


def test_codex_home_is_respected(tmp_path: Path) -> None:
    home, elsewhere = _home(tmp_path), tmp_path / "codex-home"
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(REPO)}
    env["CODEX_HOME"] = str(elsewhere)
    subprocess.run(
        [sys.executable, "-m", "sessionfold.streams.cli", "install", "codex"],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert (elsewhere / "config.toml").exists() and (elsewhere / "hooks.json").exists()
    assert "sessionfold" not in (home / ".codex" / "config.toml").read_text()
    # Codex passes its MCP servers no CODEX_HOME: the entry names it, and waits for the server.
    server = tomlkit.parse((elsewhere / "config.toml").read_text())["mcp_servers"]["sessionfold"]
    assert server["env"] == {"CODEX_HOME": str(elsewhere)} and server["required"] is True


def test_uninstall_keeps_what_the_user_and_the_agent_wrote_since(tmp_path: Path) -> None:
    home = _home(tmp_path)
    assert _run(home, "claude-code", "--gateway").returncode == 0
    state = home / ".claude.json"
    # Claude Code rewrites its state file in its own layout, with keys of its own.
    doc = json.loads(state.read_text())
    doc["numStartups"] = 4
    doc["mcpServers"]["mine"] = {"command": "x"}
    state.write_text(json.dumps(doc, indent=2))
    settings = home / ".claude" / "settings.json"
    edited = json.loads(settings.read_text())
    edited["env"]["MINE"] = "1"
    settings.write_text(json.dumps(edited))
    assert _run(home, "claude-code", "--uninstall").returncode == 0
    assert json.loads(state.read_text()) == {
        "numStartups": 4,
        "mcpServers": {"mine": {"command": "x"}},
    }
    after = json.loads(settings.read_text())
    assert after["env"] == {"MINE": "1"} and "SessionStart" not in after["hooks"]
    assert not list((home / ".claude").glob("sessionfold-*")) and not list(
        home.glob("*.sessionfold-backup")
    )


@pytest.mark.parametrize(
    ("agent", "name", "text", "why"),
    [
        ("claude-code", ".claude/settings.json", '{"model": "' + SECRET + '",', "not valid JSON"),
        ("claude-code", ".claude.json", "[1]", "not an object"),
        (
            "claude-code",
            ".claude/settings.json",
            '{"hooks": ["' + SECRET + '"]}',
            "not a table or object",
        ),
        ("codex", ".codex/config.toml", f'model = "{SECRET}"\n[features\n', "not valid TOML"),
        ("codex", ".codex/config.toml", f'mcp_servers = "{SECRET}"\n', "not a table"),
        ("codex", ".codex/hooks.json", "{" + SECRET, "not valid JSON"),
    ],
)
def test_a_file_it_cannot_edit_is_left_alone_with_exit_code_2(
    tmp_path: Path, agent: str, name: str, text: str, why: str
) -> None:
    home = _home(tmp_path)
    (home / name).write_text(text)
    before = _files(home)
    for args in ((agent,), (agent, "--gateway"), (agent, "--dry-run")):
        done = _run(home, *args)
        assert done.returncode == 2
        assert str(home / name) in done.stderr and why in done.stderr
        assert "nothing written" in done.stderr
        assert SECRET not in done.stderr + done.stdout
        assert _files(home) == before


def test_dry_run_prints_the_changes_and_writes_nothing(tmp_path: Path) -> None:
    home = _home(tmp_path)
    before = _files(home)
    done = _run(home, "codex", "--gateway", "--dry-run")
    assert done.returncode == 0
    assert "would " in done.stdout and "mcp_servers.sessionfold" in done.stdout
    assert _files(home) == before
    assert _run(home, "codex").returncode == 0
    installed = _files(home)
    assert "would " in _run(home, "codex", "--uninstall", "--dry-run").stdout
    assert _files(home) == installed


def test_project_scope_writes_the_projects_files(tmp_path: Path) -> None:
    home, project = _home(tmp_path), tmp_path / "project"
    project.mkdir()
    before = _files(home)
    done = _run(home, "claude-code", "--scope", "project", cwd=project)
    assert done.returncode == 0 and "approve" in done.stdout
    assert json.loads((project / ".mcp.json").read_text())["mcpServers"]["sessionfold"]
    assert json.loads((project / ".claude" / "settings.json").read_text())["hooks"]
    assert _files(home) == before
    assert (
        _run(home, "claude-code", "--scope", "project", "--uninstall", cwd=project).returncode == 0
    )
    assert _files(project) == {}


def test_uninstall_with_nothing_installed_changes_nothing(tmp_path: Path) -> None:
    home = _home(tmp_path)
    before = _files(home)
    done = _run(home, "codex", "--uninstall")
    assert done.returncode == 0 and "nothing to remove" in done.stdout
    assert _files(home) == before


def test_a_linked_settings_file_stays_a_link_to_its_target(tmp_path: Path) -> None:
    home = _home(tmp_path)
    dotfiles = tmp_path / "dotfiles" / "settings.json"
    dotfiles.parent.mkdir()
    link = home / ".claude" / "settings.json"
    dotfiles.write_bytes(link.read_bytes())
    link.unlink()
    link.symlink_to(dotfiles)
    original = dotfiles.read_bytes()
    assert _run(home, "claude-code").returncode == 0
    assert link.is_symlink() and "SessionStart" in dotfiles.read_text()
    assert _run(home, "claude-code", "--uninstall").returncode == 0
    assert link.is_symlink() and dotfiles.read_bytes() == original


def test_uninstall_of_a_file_broken_since_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    home = _home(tmp_path)
    assert _run(home, "codex").returncode == 0
    (home / ".codex" / "config.toml").write_text(f'model = "{SECRET}"\n[features\n')
    before = _files(home)
    done = _run(home, "codex", "--uninstall")
    assert done.returncode == 2 and "not valid TOML" in done.stderr
    assert SECRET not in done.stderr and _files(home) == before


def test_uninstall_without_its_backup_still_takes_out_only_its_entries(tmp_path: Path) -> None:
    home = _home(tmp_path)
    original = json.loads((home / ".claude" / "settings.json").read_text())
    assert _run(home, "claude-code").returncode == 0
    (home / ".claude" / "settings.json.sessionfold-backup").unlink()
    assert _run(home, "claude-code", "--uninstall").returncode == 0
    after = json.loads((home / ".claude" / "settings.json").read_text())
    assert after == original


@pytest.mark.parametrize(
    ("argv0", "which", "expected"),
    [
        ("/opt/venv/bin/sessionfold", None, ["/opt/venv/bin/sessionfold"]),
        ("sessionfold", "/usr/local/bin/sessionfold", ["/usr/local/bin/sessionfold"]),
        ("/x/sessionfold/streams/cli/__main__.py", None, None),
    ],
)
def test_the_command_written_is_the_absolute_running_sessionfold(
    monkeypatch: pytest.MonkeyPatch, argv0: str, which: str | None, expected: list[str] | None
) -> None:
    from sessionfold.streams.cli import install

    monkeypatch.setattr(sys, "argv", [argv0, "install"])
    monkeypatch.setattr(install.shutil, "which", lambda _name: which)
    command = install.sessionfold_command()
    if expected is None:  # `python -m sessionfold.streams.cli`
        expected = [os.path.abspath(sys.executable), "-m", "sessionfold.streams.cli"]
    assert command == expected


def test_codex_that_cannot_be_asked_leaves_the_trust_to_the_user(tmp_path: Path) -> None:
    home = _home(tmp_path)
    done = _run(home, "codex", "--codex", str(tmp_path / "no-codex"))
    assert done.returncode == 0
    assert "could not ask Codex for the hook's hash (FileNotFoundError)" in done.stdout
    assert "note: Codex runs a new hook only once you have trusted it" in done.stdout
    assert "hooks.state" not in (home / ".codex" / "config.toml").read_text()
    dry = _run(home, "codex", "--gateway", "--dry-run", "--codex", "/x/codex")
    assert "would ask Codex (/x/codex app-server) for the hook's hash" in dry.stdout


def test_a_user_config_that_cannot_keep_the_trust_stops_a_project_install(tmp_path: Path) -> None:
    home, project = _home(tmp_path), tmp_path / "project"
    project.mkdir()
    (home / ".codex" / "config.toml").write_text(f'model = "{SECRET}"\n[features\n')
    before, nothing = _files(home), _files(project)
    done = _run(home, "codex", "--scope", "project", "--codex", "/x/codex", cwd=project)
    assert done.returncode == 2 and "not valid TOML" in done.stderr
    assert str(home / ".codex" / "config.toml") in done.stderr and SECRET not in done.stderr
    assert _files(home) == before and _files(project) == nothing


TOKEN = "serve-token-0123456789"


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_the_gateway_calls_carry_serves_token_and_uninstall_takes_it_out(
    tmp_path: Path, agent: str
) -> None:
    """With serve's token in the environment (as serve reads it) or a file, `--gateway` writes
    the header the gateway asks for; without `--gateway` no token is read or written."""
    home = _home(tmp_path)
    before = _files(home)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    ignored = _run(home, agent, env={"SESSIONFOLD_API_TOKEN_FILE": str(tmp_path / "missing")})
    assert ignored.returncode == 0, ignored.stderr  # no --gateway: the token is not read
    assert not any(TOKEN in text.decode() for text in _files(home).values())
    assert _run(home, agent, "--uninstall").returncode == 0
    done = _run(home, agent, "--gateway", env={"SESSIONFOLD_API_TOKEN_FILE": str(token_file)})
    assert done.returncode == 0, done.stderr
    assert TOKEN not in done.stdout + done.stderr
    if agent == "claude-code":
        env = json.loads((home / ".claude" / "settings.json").read_text())["env"]
        assert env["ANTHROPIC_CUSTOM_HEADERS"] == f"X-Sessionfold-Token: {TOKEN}"
    else:
        config = tomlkit.parse((home / ".codex" / "config.toml").read_text())
        provider = config["model_providers"]["sessionfold"]
        assert provider["http_headers"] == {"X-Sessionfold-Token": TOKEN}
    again = _run(home, agent, "--gateway", env={"SESSIONFOLD_API_TOKEN_FILE": str(token_file)})
    assert "nothing to change" in again.stdout
    assert _run(home, agent, "--uninstall").returncode == 0
    assert _files(home) == before


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_a_token_for_a_projects_settings_or_unreadable_is_refused(
    tmp_path: Path, agent: str
) -> None:
    """A project's settings may be shared (a repository): the token goes only into the
    user's; a token file that cannot be read stops install. Nothing is written either way,
    and the token is never printed."""
    home = _home(tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    before = _files(tmp_path)
    shared = _run(
        home,
        agent,
        "--gateway",
        "--scope",
        "project",
        cwd=project,
        env={"SESSIONFOLD_API_TOKEN": TOKEN},
    )
    assert shared.returncode == 2 and "--scope user" in shared.stderr
    unreadable = _run(
        home, agent, "--gateway", env={"SESSIONFOLD_API_TOKEN_FILE": str(tmp_path / "missing")}
    )
    assert unreadable.returncode == 2 and "FileNotFoundError" in unreadable.stderr
    short = _run(home, agent, "--gateway", env={"SESSIONFOLD_API_TOKEN": "short"})
    assert short.returncode == 2 and "at least 16 characters" in short.stderr
    for run in (shared, unreadable, short):
        assert TOKEN not in run.stdout + run.stderr and "short" not in run.stdout
    assert _files(tmp_path) == before
