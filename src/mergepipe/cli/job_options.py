"""The options of the commands that run jobs: threads, roots, log level; engine and Ray address."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from mergepipe.core import logs
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.settings import Settings


def add_job_arguments(p: argparse.ArgumentParser, *, data_root_help: str,
                      output_root_help: str) -> None:
    p.add_argument("--workers", type=int, help="job worker threads ($MERGEPIPE_WORKERS, 2)")
    p.add_argument("--data-root", action="append", metavar="DIR", help=data_root_help)
    p.add_argument("--output-root", metavar="DIR", help=output_root_help)
    p.add_argument("--log-level", default="info",
                   choices=("critical", "error", "warning", "info", "debug"))


def job_settings(args: argparse.Namespace) -> Settings:
    """The settings with the options applied (roots checked and resolved); logging configured."""
    s: Settings = args.settings
    if args.workers is not None:
        if args.workers < 1:
            raise InvalidRequest("--workers must be >= 1", field="workers")
        s = dataclasses.replace(s, workers=args.workers)
    if args.data_root:
        s = dataclasses.replace(s, data_roots=tuple(Path(d).resolve() for d in args.data_root))
    elif not s.data_roots:
        s = dataclasses.replace(s, data_roots=(Path.cwd().resolve(),))
    for root in s.data_roots:
        if not root.is_dir():
            raise InvalidRequest(f"data root {root} is not a directory", field="data_root")
    s = dataclasses.replace(s, output_root=Path(args.output_root or s.output_root).resolve(),
                            catalog=s.catalog if isinstance(s.catalog, str)
                            else s.catalog.resolve())
    logs.configure(args.log_level, s.log_format)
    return s


def add_engine_arguments(p: argparse.ArgumentParser, *, ray_help: str, job: str) -> None:
    """--engine and --ray-address (`ray_help`: what runs as Ray tasks; `job`: for what)."""
    p.add_argument("--engine", choices=("local", "ray"),
                   help=f"{ray_help} (pip install mergepipe[cluster]); same result "
                        "($MERGEPIPE_ENGINE, default local)")
    p.add_argument("--ray-address", metavar="HOST:PORT",
                   help="an existing Ray cluster for --engine ray ($MERGEPIPE_RAY_ADDRESS; "
                        f"default: a local Ray runtime started for the {job})")


def with_engine(args: argparse.Namespace) -> None:
    """--engine and --ray-address applied to the command's settings (else the settings')."""
    s: Settings = args.settings
    args.settings = dataclasses.replace(s, engine=args.engine or s.engine,
                                        ray_address=args.ray_address or s.ray_address)
