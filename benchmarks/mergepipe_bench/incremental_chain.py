"""A chain of linear merges adding one expert at a time: incremental against scratch, per step.

    python -m mergepipe_bench.incremental_chain [--root /tmp/mergepipe-incr-bench]
                                                     [--size-mb 8] [--experts 16] [--dtype bf16]

Generates (once) a bf16 Llama-shaped base and `--experts` full experts (benchmarks.family) and
ingests them with statistics. Step k (k = 2..K) merges experts 1..k with `linear`: the request
with `--strategy scratch`, then the chain merge with `--strategy auto` (step 2 from scratch,
then incremental from step k - 1's chain output, the newest stored merge with one change). Prints expert bytes
read and wall time per step and writes results.json under --root.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.cli.family import generate_family, read_family
from mergepipe.core.request import build_request
from mergepipe.jobs.merge import merge


def _family(root: Path, experts: int, size_mb: float) -> list[str]:
    fam = root / "family"
    try:
        info = read_family(fam)
        if len(info["experts"]) == experts and info["size_mb"] == size_mb:
            return [e["name"] for e in info["experts"]]
    except (OSError, ValueError, KeyError):
        pass
    shutil.rmtree(fam, ignore_errors=True)
    generate_family(fam, experts=experts, size_mb=size_mb)
    return [e["name"] for e in read_family(fam)["experts"]]


def _step(cat: Catalog, names: list[str], out: Path, dtype: str, strategy: str
          ) -> dict[str, Any]:
    req = build_request(base="base", experts=",".join(names), operator="linear",
                        output_dtype=dtype, strategy=strategy)
    t0 = time.perf_counter()
    r = merge(cat, req, out)
    return {"strategy": r.strategy, "expert_bytes_read": r.expert_bytes_read,
            "wall_seconds": round(time.perf_counter() - t0, 3),
            "plan_seconds": round(r.plan_seconds or 0.0, 3)}


def run(root: Path, experts: int, size_mb: float, dtype: str) -> dict[str, Any]:
    """The chain; returns the results document (also written to root/results.json)."""
    names = _family(root, experts, size_mb)
    for d in ("catalog.duckdb", "chain", "scratch"):
        p = root / d
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    steps = []
    with Catalog(root / "catalog.duckdb") as cat:
        ingest_model(cat, root / "family" / "base", "base")
        for n in names:
            ingest_model(cat, root / "family" / n, n, base="base")
        checkpoint = sum(f.stat().st_size for f in (root / "family" / names[0]).glob(
            "*.safetensors"))
        for k in range(2, experts + 1):
            # scratch first: the chain's output is then the newest merge the next step finds
            scratch = _step(cat, names[:k], root / "scratch" / f"s{k:02d}", dtype, "scratch")
            chain = _step(cat, names[:k], root / "chain" / f"k{k:02d}", dtype, "auto")
            steps.append({"k": k, "chain": chain, "scratch": scratch})
            print(f"k={k:2d}  chain ({chain['strategy']:11s}) "
                  f"{chain['expert_bytes_read'] / checkpoint:5.2f} ckpt {chain['wall_seconds']:6.2f}"
                  f" s   scratch {scratch['expert_bytes_read'] / checkpoint:5.2f} ckpt "
                  f"{scratch['wall_seconds']:6.2f} s", flush=True)
    doc = {"experts": experts, "size_mb": size_mb, "dtype": dtype,
           "checkpoint_bytes": checkpoint, "steps": steps}
    (root / "results.json").write_text(json.dumps(doc, indent=2))
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path("/tmp/mergepipe-incr-bench"))
    ap.add_argument("--size-mb", type=float, default=8.0)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--dtype", default="bf16", help="output dtype of every merge")
    args = ap.parse_args(argv)
    args.root.mkdir(parents=True, exist_ok=True)
    run(args.root, args.experts, args.size_mb, args.dtype)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
