"""The ledger's model-calling compaction pass: context, prompt, verification, turns.

Private to it: `verify` (checking the model's answers; `pass_`, `turns` and `prompt` use it)
and `reading` (the standing-region memo `context` and `model` share).
"""

__all__ = ["answer", "context", "model", "pass_", "prompt", "turns"]
