"""Run as a script: peak RSS of ingesting and merging a checkpoint with one large 1-D tensor.

`python -m tests.memory_probe MIB BLOCK_BYTES DIR [--merges]` prints one JSON object: for each
step (base and expert ingestion; with --merges, a linear and a TIES merge), the peak resident memory of the process during
the step (VmHWM, reset before each step through /proc/self/clear_refs) and its growth over the
resident memory just before it.
"""

from __future__ import annotations

import functools
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.core.request import build_request
from mergepipe.jobs.merge import merge


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def write_family(root: Path, mib: int, names: tuple[str, ...]) -> None:
    """base, e0, e1: one F32 1-D tensor of `mib` MiB (plus a small matrix) each."""
    n = mib * (1 << 20) // 4
    for seed, name in enumerate(names):
        if (root / name / "model.safetensors").exists():
            continue
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        t = torch.randn(n, generator=torch.Generator().manual_seed(0))
        if name != "base":
            t += 0.02 * torch.randn(n, generator=torch.Generator().manual_seed(seed))
        save_file({"big.bias": t, "small.weight": torch.ones(4, 4)}, str(d / "model.safetensors"))
        del t


def main(mib: int, block_bytes: int, root: Path, merges: bool) -> dict[str, object]:
    write_family(root, mib, ("base", "e0", "e1") if merges else ("base", "e0"))
    gc.collect()
    out: dict[str, object] = {"tensor_mib": mib, "block_bytes": block_bytes}

    def step(label: str, fn: Callable[[], object]) -> None:
        gc.collect()
        before = _status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        t0 = time.perf_counter()
        fn()
        peak = _status("VmHWM")
        out[label] = {"peak_mib": round(peak / 2**20, 1),
                      "growth_mib": round((peak - before) / 2**20, 1),
                      "seconds": round(time.perf_counter() - t0, 2)}

    with Catalog(root / "catalog.duckdb") as cat:
        step("ingest_base", lambda: ingest_model(cat, root / "base", "base",
                                                 block_bytes=block_bytes))
        step("ingest_expert", lambda: ingest_model(cat, root / "e0", "e0", base="base"))
        if not merges:
            return out
        ingest_model(cat, root / "e1", "e1", base="base")
        for op, params in (("linear", {}), ("ties", {"density": 0.5})):
            req = build_request(base="base", experts="e0,e1", operator=op, budget=1.0,
                                params=params)
            step(f"merge_{op}", functools.partial(merge, cat, req, root / f"out-{op}"))
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]),
                          "--merges" in sys.argv[4:])))
