"""`mergepipe ingest PATH --name NAME`: register a checkpoint (a base, or an expert with statistics)."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

from mergepipe.cli import preload
from mergepipe.cli.job_options import add_engine_arguments, with_engine
from mergepipe.cli.main import print_json, progress_bars
from mergepipe.cli.table import human_bytes
from mergepipe.core.vocab import KINDS

if TYPE_CHECKING:
    from mergepipe.catalog.models import ModelRow

_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ingest", help="register a checkpoint (base, full expert, delta or LoRA adapter)",
        description="Register a safetensors checkpoint (file, sharded directory or PEFT adapter "
        "directory). Without --base it is a base model: files, tensors and content-hashed "
        "blocks. With --base it is an expert: also the statistics of its delta against the "
        "base per block and the TIES trim thresholds per tensor (unless --no-stats).")
    p.add_argument("path", help="safetensors file, checkpoint directory or LoRA adapter directory")
    p.add_argument("--name", required=True, help="name to register the model under")
    p.add_argument("--base", help="the registered base model this expert was fine-tuned from")
    p.add_argument("--kind", choices=KINDS, default="full",
                   help="full checkpoint (default), explicit delta checkpoint, or PEFT LoRA adapter")
    p.add_argument("--block-bytes", type=_block_bytes, default=None, metavar="N",
                   help="block size of a base's grid, e.g. 1048576 or 1MiB (default 1 MiB); "
                   "experts always use their base's grid")
    p.add_argument("--no-stats", action="store_true",
                   help="register an expert without delta statistics (merges then plan it "
                   "tensor by tensor)")
    p.add_argument("--force", action="store_true",
                   help="register an expert even when its delta to --base is far larger than a "
                   "fine-tune's (||E - B|| / ||B|| above 0.5; docs/catalog.md)")
    add_engine_arguments(p, job="ingestion", ray_help="ray: the statistics of a sharded "
                         "checkpoint as one Ray task per shard file")
    p.add_argument("--json", action="store_true", help="print the model as JSON")
    p.set_defaults(func=run, beside_server=True, local_paths=("path",))


def run(args: argparse.Namespace) -> int:
    if args.kind == "lora" and not args.no_stats:
        preload.start("torch")  # LoRA's product is torch's; full and delta scans never load it
    from mergepipe.cli.beside import open_catalog

    with_engine(args)
    with open_catalog(args) as cat:
        model = cat.ingest(args.path, args.name, base=args.base, kind=args.kind,
                           block_bytes=args.block_bytes, stats=not args.no_stats,
                           force=args.force, progress=progress_bars(args))
    if args.json:
        print_json(model)
    else:
        print(summary(model))
    return 0


def summary(m: ModelRow) -> str:
    """One line saying what was registered."""
    what = "base model" if m.base is None else f"{m.kind} expert of {m.base!r}"
    secs = float(m.ingest_seconds or 0.0)
    rate = f", {human_bytes(m.tensor_bytes / secs)}/s" if secs > 0 else ""
    stats = "" if m.base is None else (" with statistics" if m.has_stats
                                       else " without statistics")
    version = f" (version {m.version} of {m.display_name!r})" if m.version > 1 else ""
    return (f"registered {m.name!r}{version}: {what}{stats}, {m.n_tensors} tensors, "
            f"{human_bytes(m.tensor_bytes)} in {secs:.2f} s{rate}")


def _block_bytes(text: str) -> int:
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in bytes (e.g. 1048576, 1MiB)")
    unit = (m.group(2) or "").lower()
    if unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown unit")
    return int(m.group(1)) * _UNITS[unit]
