"""What the event contracts say when they refuse a value: never the value's text."""

from __future__ import annotations

from pydantic import ValidationError


class NewerFormatError(ValueError):
    """A value written by a newer sessionfold: refused by name, never misread."""

    def __init__(self, found: int, subject: str, current: int) -> None:
        self.found = found
        super().__init__(
            f"{subject} newer than this sessionfold reads ({current}); "
            "upgrade sessionfold to read it"
        )


def error_locations(exc: ValidationError, most: int = 5) -> str:
    """The first `most` errors as `loc.path: type`: field locations and types, never the input."""
    return ", ".join(
        f"{'.'.join(str(p) for p in e['loc'])}: {e['type']}" for e in exc.errors()[:most]
    )
