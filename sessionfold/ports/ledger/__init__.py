"""The ledger's model-calling compaction pass: context, prompt, verification, turns."""
