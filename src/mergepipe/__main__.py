"""`python -m mergepipe` runs the CLI."""

from mergepipe.cli.main import entry

entry()
