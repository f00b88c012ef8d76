"""The benchmark suite: our merges vs mergekit vs cat, side by side on a cold page cache.

`mergepipe bench` (or `python -m mergepipe_bench.run`) generates a family, ingests it, then measures
every configuration `reps` times, interleaving tools within each repetition so that drifting
machine load hits all of them alike. Every timed run starts from a cold page cache (sync, then
posix_fadvise(DONTNEED) on every input, checked with mincore) and a fresh copy of the catalog.
Results go to results.json, BENCHMARKS.md and PNG plots (benchmarks.report).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from mergepipe_bench import extras, figures
from mergepipe_bench.cli_args import add_arguments
from mergepipe_bench.physical import run_physical, run_ranges
from mergepipe_bench.report import write_report
from mergepipe_bench.suite import DEFAULT, QUICK, Suite, SuiteConfig, plan_runs
from mergepipe_bench.whole_commands import whole_commands


def run_suite(cfg: SuiteConfig, out: Path, report: Path | None = None,
              plots: Path | None = None, command: str = "mergepipe bench",
              log: Any = print) -> dict[str, Any]:
    """Run every figure, write results.json, BENCHMARKS.md and the plots; the results."""
    started = time.time()
    out.mkdir(parents=True, exist_ok=True)
    suite = Suite(cfg, out, log)
    try:
        suite.setup()
        fixed_bytes = figures.fixed_budget_bytes(suite)
        runs = plan_runs(cfg, fixed_bytes)
        suite.measure_all(runs["scaling"] + runs["operators"] + runs["sweep"] + runs["big"])
        results: dict[str, Any] = {
            "config": asdict(cfg), "command": command, "setup": suite.setup_info,
            "machine": figures.machine(out),
            "started": started, "cold_max": suite.cold_max,
            "scaling": figures.scaling(suite, runs["scaling"]),
            "operators": figures.operators(suite, runs["operators"]),
            "sweep": figures.sweep(suite, runs["sweep"]),
            "big_k": extras.big_k(suite, runs["big"]),
            "phases": [extras.phases(suite, r) for r in runs["operators"]
                       if r.tool == "ours" and r.budget != "full"],
        }
        suite.close()
        results["overheads"] = figures.overheads(suite, runs["operators"], runs["rss"])
        results["physical"] = figures.physical(suite, run_physical, run_ranges)
        log("whole commands: mergepipe merge vs mergekit-yaml, fresh processes")
        results["commands"] = whole_commands(suite)
        log("start-up, ingestion vs cat, 1-D tensor ingestion RSS")
        results["startup"] = extras.startup_rows(cfg.reps, suite.catalogs["main"])
        results["ingestion"] = extras.ingestion(suite, cfg.reps)
        results["one_d"] = extras.one_d_rss(suite.work / "one-d", cfg.one_d_mib)
        results["seconds"] = time.time() - started
        results["load_avg_end"] = os.getloadavg()
    finally:
        suite.close()
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    write_report(results, report or out / "BENCHMARKS.md", plots or out)
    shutil.rmtree(suite.work / "runs", ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.run [--quick] [--out DIR] ...`"""
    ap = argparse.ArgumentParser(description=__doc__)
    add_arguments(ap)
    return run_from_args(ap.parse_args(argv))


def run_from_args(args: argparse.Namespace) -> int:
    if getattr(args, "large", False):
        from mergepipe_bench.large_family import run_large

        run_large(Path(args.out), args.reps or 3, log=lambda m: print(m, flush=True))
        return 0
    cfg = QUICK if args.quick else DEFAULT
    if args.reps:
        cfg = replace(cfg, reps=args.reps)
    if args.size_mb:
        cfg = replace(cfg, size_mb=args.size_mb,
                      rss_sizes_mb=(args.size_mb / 4, args.size_mb))
    report = Path(args.report) if args.report else None
    plots = Path(args.plots) if args.plots else (report.parent if report else None)
    command = " ".join(["mergepipe bench", *(["--quick"] if args.quick else []),
                        *([f"--reps {args.reps}"] if args.reps else []),
                        *([f"--size-mb {args.size_mb:g}"] if args.size_mb else []),
                        f"--out {args.out}", *([f"--report {args.report}"] if args.report else []),
                        *([f"--plots {args.plots}"] if args.plots else [])])
    results = run_suite(cfg, Path(args.out), report, plots, command=command,
                        log=lambda m: print(m, flush=True))
    print(f"done in {results['seconds']:.0f} s; report: {report or Path(args.out) / 'BENCHMARKS.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
