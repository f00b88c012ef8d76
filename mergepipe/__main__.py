"""`python -m mergepipe` runs the CLI."""

import sys

from mergepipe.cli.main import main

sys.exit(main())
