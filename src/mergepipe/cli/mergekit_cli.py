"""`mergepipe merge|plan CONFIG.yml`: the request of a mergekit config, registering local paths;
passthrough configs (slices:) copied straight from their checkpoints."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mergepipe.cli.main import progress_bars
from mergepipe.core.errors import InvalidRequest, MergePipeError

if TYPE_CHECKING:
    from mergepipe.api import Catalog
    from mergepipe.core.request import MergeRequest
    from mergepipe.jobs.tokenizer import TokenizerPlan

EXCLUSIVE = (("base", "--base"), ("experts", "--experts"), ("op", "--op"), ("param", "--param"))


def config_request(cat: Catalog, args: argparse.Namespace
                   ) -> tuple[MergeRequest, TokenizerPlan | None]:
    """Read args.config, match its models or register them (with statistics), and build the
    request (--budget/--seed/--dtype apply on top), with the output's tokenizer files to write
    after the merge (None: the base's, which the merge copies). Errors name the file and the
    YAML key."""
    _check_exclusive(args)
    quiet = bool(getattr(args, "json", False))
    return cat.config_with_tokenizer(
        args.config, budget=args.budget, seed=args.seed, dtype=args.dtype,
        progress=progress_bars(args), cwd=getattr(args, "cwd", None),  # relayed
        report=None if quiet else lambda line: print(line, file=sys.stderr))


def passthrough_merge(cat: Catalog, args: argparse.Namespace) -> dict[str, Any] | None:
    """Run args.config when it is a passthrough config (layer stacking: it copies tensors and
    reads no expert deltas, so --budget does not apply); None for any other config."""
    from mergepipe.core.mergekit_config import load_document
    from mergepipe.core.mergekit_slices import PASSTHROUGH

    path = args.config
    try:
        doc = load_document(read_config(path))
    except MergePipeError as e:
        raise type(e)(f"{path}: {e.message}", field=e.field) from None
    if str(doc.get("merge_method", "")).strip().lower() != PASSTHROUGH:
        return None
    _check_exclusive(args)
    result, notes = cat.stack(path, out=args.out, overwrite=bool(getattr(args, "overwrite", False)),
                              cwd=getattr(args, "cwd", None))
    summary = result.to_dict()
    if getattr(args, "json", False):
        print(json.dumps(summary))
        return summary
    told = list(notes)
    if getattr(args, "budget", None) is not None:
        told.append("--budget: passthrough copies tensors and reads no expert delta; the budget "
                    "does not apply (the output is the full copy)")
    for note in told:
        print(f"note: {note}", file=sys.stderr)
    print(f"passthrough: {result.layers} layers, {result.tensors} tensors copied "
          f"({result.bytes_read} bytes read) -> {result.output}")
    return summary


def read_config(path: Path) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise InvalidRequest(f"{path}: cannot read the config ({why})", field="config") from None


def _check_exclusive(args: argparse.Namespace) -> None:
    given = [flag for attr, flag in EXCLUSIVE if getattr(args, attr, None)]
    if given:
        raise InvalidRequest(f"{', '.join(given)} cannot be combined with a config file: the "
                             "config says what to merge (--budget, --seed and --dtype still "
                             "apply)", field="config")
