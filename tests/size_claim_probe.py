"""Child process of tests/test_size_claims.py: ingest a sparse checkpoint whose header claims a
huge tensor under an address-space limit; print what happened and the resident-memory growth.

usage: python -m tests.size_claim_probe DIR ROWS COLS [MAX_FILE_BYTES MAX_TENSOR_ELEMENTS]
"""

from __future__ import annotations

import json
import resource
import struct
import sys
from pathlib import Path

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.core import checkpoint_limits
from mergepipe.core.errors import MergePipeError

HEADROOM = 1 << 30  # address space allowed beyond what the process has mapped at the start


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def sparse_checkpoint(d: Path, rows: int, cols: int) -> Path:
    """model.safetensors declaring one BF16 tensor [rows, cols] that exactly fills the file: a
    header and a hole of rows * cols * 2 bytes (nothing allocated)."""
    d.mkdir(parents=True, exist_ok=True)
    nbytes = rows * cols * 2
    header = json.dumps({"w": {"dtype": "BF16", "shape": [rows, cols],
                               "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    p = d / "model.safetensors"
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + nbytes)
    return d


def main() -> None:
    d, rows, cols = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    if len(sys.argv) > 4:
        checkpoint_limits.install(checkpoint_limits.CheckpointLimits(
            max_file_bytes=int(sys.argv[4]), max_tensor_elements=int(sys.argv[5])))
    ckpt = sparse_checkpoint(d / "ckpt", rows, cols)
    cat = Catalog(d / "cat.duckdb")
    rss0 = _status("VmRSS")
    resource.setrlimit(resource.RLIMIT_AS, (_status("VmSize") + HEADROOM, resource.RLIM_INFINITY))
    out: dict[str, object] = {}
    try:
        ingest_model(cat, ckpt, "bomb")
        out["outcome"] = "ingested"
    except MergePipeError as e:
        out.update(outcome="refused", status=e.status, message=e.message)
    except MemoryError:
        out["outcome"] = "MemoryError"
    out["rss_growth"] = _status("VmHWM") - rss0
    print(json.dumps(out))


if __name__ == "__main__":
    main()
