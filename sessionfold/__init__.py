"""sessionfold: an event-sourced context engine for fleets of coding agents."""

__version__ = "0.1.0"
