"""`mergepipe bench --quick` produces every figure (not their values); slow (a quarter of
`make test`), so `make test-all` runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mergekit")


@pytest.mark.slow
def test_bench_quick_produces_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, "-m", "mergepipe", "bench", "--quick", "--out",
                           str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert [r["k"] for r in res["scaling"]] == [1, 2]
    assert {o["operator"] for o in res["operators"]} == {"linear", "task_arithmetic", "ties",
                                                         "dare_ties"}
    assert {r["operator"] for r in res["sweep"]} == {"ties", "linear"}
    assert res["overheads"]["planning"] and res["overheads"]["catalogs"]
    assert len({r["checkpoint_bytes"] for r in res["overheads"]["rss"]}) == 2
    assert {p["operator"] for p in res["physical"]} == {"linear", "ties"}
    assert [(b["operator"], b["k"]) for b in res["big_k"]] == [("linear", 2), ("ties", 2)]
    assert all(b["speedup"] > 0 for b in res["big_k"])
    assert {p["operator"] for p in res["phases"]} == {"linear", "task_arithmetic", "ties",
                                                      "dare_ties"}
    for p in res["phases"]:  # the parts add up to no more than the call
        assert p["plan_s"] + p["exec_s"] + p["register_s"] <= p["merge_s"] + 1e-6
    assert res["startup"]["--help"]["modules"] > 0
    assert set(res["startup"]) == {"--help", "models", "sql"}
    assert [(c["operator"], c["k"]) for c in res["commands"]] == [("linear", 2)]
    assert res["commands"][0]["cold_max"] < 0.05
    assert 0 < res["ingestion"]["ingest_s"] <= res["ingestion"]["process_s"]
    assert res["one_d"]["tensor_mib"] == 4 and res["one_d"]["expert_peak_rss"] > 0
    assert res["cold_max"] < 0.05  # inputs really were evicted before each timed run
    for r in res["sweep"]:  # budget soundness, as measured by the executor
        assert r["expert_bytes"] <= r["budget_bytes"]
    report = (out / "BENCHMARKS.md").read_text()
    for heading in ("## Targets", "## 1. Scaling in K", "## 2. Budget sweep", "## 3. Operators",
                    "## 4. Overheads", "## 5. The physical limit", "## 9. K = 16"):
        assert heading in report
    if _has_matplotlib():
        for png in ("scaling.png", "frontier.png", "operators.png"):
            assert (out / png).stat().st_size > 1000
            assert f"]({png})" in report
    assert not (out / "work" / "runs").exists()  # outputs of the timed runs are cleaned up


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
