"""What the event contracts say when they refuse a value: never the value's text."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError


class NewerFormatError(ValueError):
    """A value written by a newer sessionfold: refused by name, never misread."""

    def __init__(self, found: int, subject: str, current: int) -> None:
        self.found = found
        super().__init__(
            f"{subject} newer than this sessionfold reads ({current}); "
            "upgrade sessionfold to read it"
        )


def error_locations(
    exc: ValidationError, most: int = 5, tags: Mapping[str, str] | None = None
) -> str:
    """The first `most` errors as `loc.path: type`: field locations and types, never the input.

    `tags` names a union's internal tags as the wire does (a tag at the head of a path).
    """
    return ", ".join(f"{_where(e['loc'], tags or {})}: {e['type']}" for e in exc.errors()[:most])


def _where(loc: tuple[int | str, ...], tags: Mapping[str, str]) -> str:
    head = [tags.get(str(loc[0]), loc[0])] if loc else []
    return ".".join(str(p) for p in head + list(loc[1:]))
