"""`mergepipe merge CONFIG.yml`: the merge request of a mergekit config, ingesting local paths."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mergepipe.core.errors import InvalidRequest, MergePipeError
from mergepipe.core.request import MergeRequest
from mergepipe.jobs.mergekit_resolve import load_config

EXCLUSIVE = (("base", "--base"), ("experts", "--experts"), ("op", "--op"), ("param", "--param"))


def config_request(cat: Any, args: argparse.Namespace) -> MergeRequest:
    """Read args.config, match or ingest its models, and build the request (--budget/--seed/--dtype
    apply on top). Errors name the file and the YAML key."""
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
    with IngestBar(enabled=not quiet) as bar:
        try:
            request, resolved = load_config(cat, text, budget=args.budget, seed=args.seed,
                                             progress=bar.update)
        except MergePipeError as e:
            raise type(e)(f"{path}: {e.message}", field=e.field) from None
    if not quiet:
        for name in resolved.ingested:
            role = ("as the base" if name == resolved.base else
                    f"as an expert of {resolved.base!r}, with delta statistics")
            print(f"registered {name!r} in the catalog {role}", file=sys.stderr)
        for note in resolved.config.notes:
            print(f"note: {note}", file=sys.stderr)
    if getattr(args, "dtype", None):
        from dataclasses import replace

        from mergepipe.catalog.safetensors_format import normalize_dtype
        request = replace(request, output_dtype=normalize_dtype(args.dtype))
    return request


class IngestBar:
    """A byte progress bar per model ingested on the fly; only on a terminal."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self._bar: Any = None
        self._name: str | None = None

    def update(self, name: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self._name != name:
            self.close()
            from tqdm import tqdm
            self._bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                             desc=f"ingesting {name}", file=sys.stderr, leave=False)
            self._name = name
        self._bar.total = total
        self._bar.n = done
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> IngestBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
