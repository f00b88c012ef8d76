"""Our merge in a timed worker: `python -m benchmarks.ours_run CATALOG REQUEST_JSON OUT`.

The worker imports the engine, then times `executor.run.merge` (plan, execute, publish, record)
in process and prints its summary, so that imports are reported apart from the merge.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.proc import Timed, child_env, emit, python_cmd, run_timed

OUTPUT_NAME = "bench-output"


def run_ours(catalog: Path, request: dict[str, Any], out: Path, *,
             timeout: float = 1800.0) -> Timed:
    """Run one merge of `request` (build_request keywords) against `catalog` in a child."""
    cmd = python_cmd("benchmarks.ours_run", str(catalog.absolute()), json.dumps(request),
                     str(out.absolute()))
    return run_timed(cmd, env=child_env(), timeout=timeout).check()


def dir_bytes(path: Path) -> int:
    """Total bytes of the regular files under `path`."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def main() -> None:
    """Worker: import the engine, time one merge in process, print the summary."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("catalog")
    ap.add_argument("request", help="JSON object of build_request keywords")
    ap.add_argument("out")
    args = ap.parse_args()
    t0 = time.perf_counter()
    from catalog.db import Catalog
    from executor.run import merge
    from mergepipe.request import build_request
    t1 = time.perf_counter()
    request = build_request(**json.loads(args.request))
    with Catalog(args.catalog) as cat:
        summary = merge(cat, request, Path(args.out), output_name=OUTPUT_NAME)
    t2 = time.perf_counter()
    out = Path(args.out)
    manifest = out / "manifest.json"
    emit({"import_s": t1 - t0, "merge_s": t2 - t1, "summary": summary,
          "manifest_bytes": manifest.stat().st_size if manifest.exists() else None,
          "output_bytes": dir_bytes(out), "catalog_bytes": os.path.getsize(args.catalog)})


if __name__ == "__main__":
    main()
