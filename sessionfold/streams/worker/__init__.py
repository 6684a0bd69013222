"""The Kafka runtime: the Faust app, its agents and their Prometheus metrics.

No module is private to it.
"""

__all__ = ["agents", "app", "prometheus"]
