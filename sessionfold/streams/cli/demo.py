"""`sessionfold demo`: the main job for a new user (placeholder until the embedded runtime)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach the `demo` command to the root app."""

    @app.command("demo")
    def demo() -> None:
        """Fold a session through the embedded runtime and report (not built yet)."""
        typer.echo("sessionfold demo: the embedded runtime is not built yet", err=True)
        raise typer.Exit(1)
