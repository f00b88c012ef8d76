"""`python -m mergepipe` runs the CLI."""

import sys

from mergepipe.cli import main

sys.exit(main())
