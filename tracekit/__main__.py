"""`python3 -m tracekit` runs the CLI (boards without an installed console script)."""

from tracekit.cli import main

main()
