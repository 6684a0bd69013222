"""The Kafka runtime: the Faust app, its agents, the summarizer's answer pool (`answers`) and
their Prometheus metrics; the integration tests' fault injection (`fault_injection`, off unless
its variables are set).

No module is private to it.
"""

__all__ = ["agents", "answers", "app", "fault_injection", "prometheus"]
