"""`mergepipe merge|plan CONFIG.yml`: the options a mergekit config is read with."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mergepipe.core.errors import InvalidRequest

EXCLUSIVE = (("base", "--base"), ("experts", "--experts"), ("op", "--op"), ("param", "--param"))


def config_options(args: argparse.Namespace) -> dict[str, Any]:
    """Catalog.config's keywords for args.config: --budget/--seed/--dtype on top, paths relative
    to the caller's directory (relayed), notes and registrations on stderr except with --json.
    InvalidRequest when the options of a request are given too."""
    given = [flag for attr, flag in EXCLUSIVE if getattr(args, attr, None)]
    if given:
        raise InvalidRequest(f"{', '.join(given)} cannot be combined with a config file: the "
                             "config says what to merge (--budget, --seed and --dtype still "
                             "apply)", field="config")
    return {"cwd": getattr(args, "cwd", None), "budget": args.budget, "seed": args.seed,
            "dtype": args.dtype,
            "report": None if args.json else lambda line: print(line, file=sys.stderr)}
