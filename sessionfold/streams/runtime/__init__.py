"""The runtimes' shared step and the embedded runtime."""
