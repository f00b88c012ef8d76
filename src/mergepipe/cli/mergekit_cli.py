"""`mergepipe merge|plan CONFIG.yml`: the request of a mergekit config, registering local paths."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from mergepipe.cli.main import progress_bars
from mergepipe.core.errors import InvalidRequest

if TYPE_CHECKING:
    from mergepipe.api import Catalog
    from mergepipe.core.request import MergeRequest

EXCLUSIVE = (("base", "--base"), ("experts", "--experts"), ("op", "--op"), ("param", "--param"))


def config_request(cat: Catalog, args: argparse.Namespace) -> MergeRequest:
    """Read args.config, match its models or register them (with statistics), and build the
    request (--budget/--seed/--dtype apply on top). Errors name the file and the YAML key."""
    given = [flag for attr, flag in EXCLUSIVE if getattr(args, attr, None)]
    if given:
        raise InvalidRequest(f"{', '.join(given)} cannot be combined with a config file: the "
                             "config says what to merge (--budget, --seed and --dtype still "
                             "apply)", field="config")
    quiet = bool(getattr(args, "json", False))
    return cat.config(args.config, budget=args.budget, seed=args.seed, dtype=args.dtype,
                      progress=progress_bars(args), cwd=getattr(args, "cwd", None),  # relayed
                      report=None if quiet else lambda line: print(line, file=sys.stderr))
