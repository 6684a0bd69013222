"""The state API and its authentication, served by fold workers.

No module is private to it.
"""

__all__ = ["auth", "live_api", "live_contract", "live_front", "live_worker", "state_api"]
