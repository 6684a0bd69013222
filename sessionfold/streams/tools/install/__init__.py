"""`sessionfold install`'s file edits, as pure functions: text in, text out, and a record of
what changed so `--uninstall` undoes exactly that (streams/cli/install.py does the I/O).

Public: `plans` (what each agent gets, where), `changes` (the edits and their undoing),
`json_edits`, `toml_edits` (text in, text out), `text_patch` (the lines an install changed),
`record`, `codex_trust` (Codex's trust of the hook, asked of Codex). No module is private to
it.
"""

__all__ = ["changes", "codex_trust", "json_edits", "plans", "record", "text_patch", "toml_edits"]
