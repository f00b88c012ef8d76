"""The scaling benchmarks run end to end at a tiny size (each checks its own outputs: one hash
for every merge, the Ray ingestion scan's rows equal to the local scan's) and report ratios."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _run(module: str, root: Path, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-m", f"mergepipe_bench.{module}", "--root",
                           str(root), *args], capture_output=True, text=True, env=env,
                          timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads((root / f"{module}.json").read_text())


@pytest.mark.slow  # a PostgreSQL server and four worker processes
def test_worker_scaling_benchmark_reports_both_worker_counts(tmp_path: Path,
                                                            postgres_url: str) -> None:
    """The benchmark takes its catalog's URL (the tests' server: it measures that server's CPU
    too, as it runs on this machine)."""
    out = _run("worker_scaling", tmp_path / "w", "--catalog", postgres_url, "--size-mb", "2",
               "--jobs", "2", "--repeats", "1")
    rows = {r["workers"]: r for r in out["rows"]}
    assert set(rows) == {1, 2} and rows[1]["ratio_vs_first"] == 1.0
    for r in rows.values():
        assert r["jobs_per_s"] == pytest.approx(2 / r["median_s"], rel=1e-2)
        assert r["cores_busy"] > 0
        assert r["catalog_cores_busy"] > 0


@pytest.mark.slow  # two fresh Ray runtimes
def test_ray_scaling_benchmark_times_merges_and_ingestion_scans(tmp_path: Path) -> None:
    out = _run("ray_scaling", tmp_path / "r", "--size-mb", "4", "--experts", "2",
               "--shards", "2", "--repeats", "1")
    assert [(r["engine"], r["workers"]) for r in out["rows"]] == [("local", None), ("ray", 1),
                                                                   ("ray", 2)]
    assert all(r["ingest_median_s"] > 0 and r["median_s"] > 0 for r in out["rows"])
