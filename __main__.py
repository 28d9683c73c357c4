"""`python -m tfkit` runs the command-line interface."""

from tfkit.cli.main import main

main()
