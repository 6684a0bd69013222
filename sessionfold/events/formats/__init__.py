"""Other agents' transcripts (Claude Code, Codex) mapped onto pi v3 entries at read time."""

__all__ = ["base", "codex"]
