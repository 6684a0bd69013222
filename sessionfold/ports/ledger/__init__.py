"""The ledger's model-calling compaction pass: context, prompt, verification, turns.

Private to it: `verify` (checking the model's answers; `pass_`, `turns` and `prompt` use it).
"""

__all__ = ["answer", "context", "model", "pass_", "prompt", "turns"]
