"""Our side of a benchmark job: one `executor.run.merge` (plan, execute, publish, record), timed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

OUTPUT_NAME = "bench-output"


def warm_up() -> None:
    """Import the engine (paid once per worker)."""
    import mergepipe.jobs.merge  # noqa: F401
    import mergepipe.planner.plan  # noqa: F401


def dir_bytes(path: Path) -> int:
    """Total bytes of the regular files under `path`."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """job: catalog, request (build_request keywords), out. Returns timings and the summary."""
    from mergepipe.catalog.db import Catalog
    from mergepipe.core.request import build_request
    from mergepipe.jobs.merge import merge

    t0 = time.perf_counter()
    request = build_request(**job["request"])
    with Catalog(job["catalog"]) as cat:
        summary = merge(cat, request, Path(job["out"]), output_name=OUTPUT_NAME).to_dict()
    merge_s = time.perf_counter() - t0
    out = Path(job["out"])
    manifest = out / "manifest.json"
    return {"merge_s": merge_s, "summary": summary,
            "manifest_bytes": manifest.stat().st_size if manifest.exists() else None,
            "output_bytes": dir_bytes(out)}
