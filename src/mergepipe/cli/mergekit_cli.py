"""`mergepipe merge|plan CONFIG.yml`: a mergekit config merged (any method, passthrough
included) or made a budgeted request, registering local paths."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from mergepipe.cli.main import progress_bars
from mergepipe.core.errors import InvalidRequest

if TYPE_CHECKING:
    from mergepipe.api import Catalog
    from mergepipe.core.request import MergeRequest
    from mergepipe.jobs.report import MergeSummary
    from mergepipe.planner.plan import Plan

EXCLUSIVE = (("base", "--base"), ("experts", "--experts"), ("op", "--op"), ("param", "--param"))


def config_request(cat: Catalog, args: argparse.Namespace) -> MergeRequest:
    """The budgeted request of args.config (--target-deviation chooses its budget), its models
    matched or registered (with statistics); --seed/--dtype apply on top. Errors name the file
    and the YAML key."""
    _check_exclusive(args)
    return cat.config(args.config, budget=args.budget, seed=args.seed, dtype=args.dtype,
                      progress=progress_bars(args), cwd=getattr(args, "cwd", None),  # relayed
                      report=_reporter(args))


def config_merge(cat: Catalog, args: argparse.Namespace) -> MergeSummary:
    """Merge args.config, whatever its method (passthrough included: layers copied, the
    budget does not apply); --budget/--seed/--dtype/--strategy apply on top."""
    _check_exclusive(args)
    return cat.merge(args.config, out=args.out, name=args.name, overwrite=args.overwrite,
                     threads=args.threads, progress=progress_bars(args),
                     cwd=getattr(args, "cwd", None), report=_reporter(args),
                     budget=args.budget, seed=args.seed, dtype=args.dtype,
                     strategy=args.strategy)


def config_plan(cat: Catalog, args: argparse.Namespace, target: float | None) -> Plan:
    """The plan of args.config (--budget/--target-deviation/--seed/--dtype/--strategy on
    top)."""
    _check_exclusive(args)
    return cat.plan(args.config, target_deviation=target, progress=progress_bars(args),
                    cwd=getattr(args, "cwd", None), report=_reporter(args),
                    budget=args.budget, seed=args.seed, dtype=args.dtype,
                    strategy=args.strategy)


def _reporter(args: argparse.Namespace) -> Callable[[str], None] | None:
    """Notes and registrations on stderr, except with --json."""
    if getattr(args, "json", False):
        return None
    return lambda line: print(line, file=sys.stderr)


def _check_exclusive(args: argparse.Namespace) -> None:
    given = [flag for attr, flag in EXCLUSIVE if getattr(args, attr, None)]
    if given:
        raise InvalidRequest(f"{', '.join(given)} cannot be combined with a config file: the "
                             "config says what to merge (--budget, --seed and --dtype still "
                             "apply)", field="config")
