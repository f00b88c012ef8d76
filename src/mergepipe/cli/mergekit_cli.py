"""`mergepipe merge|plan CONFIG.yml`: the request of a mergekit config, registering local paths."""

from __future__ import annotations

import argparse
import functools
import sys
from dataclasses import replace

from mergepipe.catalog.db import Catalog
from mergepipe.cli.progress import IngestBar
from mergepipe.core.errors import InvalidRequest, MergePipeError
from mergepipe.core.request import MergeRequest
from mergepipe.core.vocab import normalize_dtype
from mergepipe.jobs.config import load_config, local_path

EXCLUSIVE = (("base", "--base"), ("experts", "--experts"), ("op", "--op"), ("param", "--param"))


def config_request(cat: Catalog, args: argparse.Namespace) -> MergeRequest:
    """Read args.config, match its models or register them (with statistics), and build the
    request (--budget/--seed/--dtype apply on top). Errors name the file and the YAML key."""
    given = [flag for attr, flag in EXCLUSIVE if getattr(args, attr, None)]
    if given:
        raise InvalidRequest(f"{', '.join(given)} cannot be combined with a config file: the "
                             "config says what to merge (--budget, --seed and --dtype still "
                             "apply)", field="config")
    path = args.config
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise InvalidRequest(f"{path}: cannot read the config ({why})", field="config") from None
    quiet = bool(getattr(args, "json", False))
    try:
        cwd = getattr(args, "cwd", None)  # run beside a server: the caller's directory
        locate = None if cwd is None else functools.partial(local_path, cwd=cwd)
        request, resolved = load_config(cat, text, budget=args.budget, seed=args.seed,
                                        locate=locate)
        if resolved.to_ingest:
            from mergepipe.jobs.ingest import run_ingestion  # torch: only when it runs
            with IngestBar(enabled=not quiet) as bar:
                for job in resolved.to_ingest:
                    try:
                        run_ingestion(cat, job, progress=bar.update_for(job.model))
                    except MergePipeError as e:
                        raise type(e)(f"{job.field}: {e.message}", field=job.field) from None
                    if not quiet:
                        role = ("as the base" if job.base is None else
                                f"as an expert of {job.base!r}, with delta statistics")
                        print(f"registered {job.model!r} in the catalog {role}", file=sys.stderr)
    except MergePipeError as e:
        raise type(e)(f"{path}: {e.message}", field=e.field) from None
    if not quiet:
        for note in resolved.config.notes:
            print(f"note: {note}", file=sys.stderr)
    if getattr(args, "dtype", None):
        request = replace(request, output_dtype=normalize_dtype(args.dtype, "output_dtype"))
    return request
