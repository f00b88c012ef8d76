"""The bench's whole-command rows: `mergepipe merge` against `mergekit-yaml`, and
`mergepipe ingest`, as a user runs them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from mergepipe_bench import extras
from mergepipe_bench.report import table
from mergepipe_bench.suite import QUICK, Suite
from mergepipe_bench.whole_commands import argv_of, whole_commands

pytest.importorskip("mergekit")


@pytest.mark.slow
def test_whole_commands_row_times_both_command_lines_cold(tmp_path: Path) -> None:
    suite = Suite(QUICK, tmp_path / "bench", log=lambda m: None)
    suite.setup()
    rows = whole_commands(suite, reps=2)
    assert [(r["k"], r["budget"], r["reps"]) for r in rows] == [(2, 0.5, 2)]
    r = rows[0]
    assert len(r["ours_walls"]) == len(r["mergekit_walls"]) == 2
    assert sorted(r["ours_walls"])[0] <= r["ours_wall_s"] <= sorted(r["ours_walls"])[1]
    assert r["speedup"] == pytest.approx(r["mergekit_wall_s"] / r["ours_wall_s"])
    assert r["ours_cpu_s"] > 0 and r["mergekit_cpu_s"] > 0
    assert r["cold_max"] < 0.05  # inputs evicted before each run
    assert not (suite.work / "commands" / "ours-K2-rep0").exists()  # outputs cleaned up
    report = extras.render({"commands": rows}, table)
    assert "mergekit-yaml" in report and f"{r['speedup']:.2f}x" in report
    assert extras.targets({"commands": rows})[0][2] in ("met", "missed")

    # the command line is the user's: run it again and read its summary
    rundir = tmp_path / "again"
    rundir.mkdir()
    argv, _ = argv_of(suite, "ours", 2, 0.5, rundir)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    assert summary["expert_bytes_read"] <= summary["budget_bytes"]
    assert summary["expert_bytes_read"] <= 0.5 * summary["full_read_bytes"]
    assert Path(summary["output"]).resolve() == (rundir / "out").resolve()

    # start-up of the catalog commands, on a copy of the suite's catalog
    st = extras.startup_rows(1, suite.catalogs["main"])
    assert set(st) == {"--help", "models", "sql"}
    assert st["--help"]["modules"] < st["models"]["modules"]  # the catalog commands ran
    assert [row[0] for row in extras.targets({"startup": st})] == [
        "`mergepipe --help` < 0.5 s", "`mergepipe models` < 0.5 s", "`mergepipe sql` < 0.5 s"]

    # the ingestion row times `mergepipe ingest` itself, start to exit
    g = extras.ingestion(suite, runs=1)
    assert 0 < g["ingest_s"] <= g["process_s"] and g["cat_s"] > 0 and g["peak_rss"] > 0
    assert g["read_bytes"] > g["expert_bytes"] > 0
