"""sessionfold: an event-sourced context engine for fleets of coding agents.

No subpackage is private to it.
"""

__all__ = ["events", "ports", "projections", "streams"]

__version__ = "0.1.0"
