"""The Kafka runtime: the Faust app, its agents and their Prometheus metrics."""
