"""`python -m tfkit` runs the command-line interface."""

from tfkit.cli.entry import run

run()
