"""`python -m sessionfold.streams.cli`, the same as the console script."""

from sessionfold.streams.cli import main

main()
