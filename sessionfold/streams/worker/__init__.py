"""The Kafka runtime: the Faust app, its agents and their Prometheus metrics; the integration
tests' fault injection (`fault_injection`, off unless its variables are set).

No module is private to it.
"""

__all__ = ["agents", "app", "fault_injection", "prometheus"]
