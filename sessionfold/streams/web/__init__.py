"""The state API and its authentication, served by fold workers.

No module is private to it.
"""

__all__ = ["auth", "live_api", "state_api"]
