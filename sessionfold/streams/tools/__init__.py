"""Tools beside the runtimes: replay, compare, synthetic sessions, the Kafka broker."""
