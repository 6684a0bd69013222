"""Pure, deterministic folds over session events."""
