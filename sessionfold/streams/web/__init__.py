"""The state API and its authentication, served by fold workers.

No module is private to it.
"""

__all__ = [
    "anthropic_api",
    "auth",
    "cache_policy",
    "gateway",
    "handover",
    "live_api",
    "live_contract",
    "live_front",
    "live_worker",
    "model_api",
    "openai_api",
    "plan_cache",
    "state_api",
]
