"""Runtimes, adapters and the command line: everything that does I/O."""
