"""Merge throughput of 1 and 2 `mergepipe worker` processes sharing one PostgreSQL catalog.

    python -m mergepipe_bench.worker_scaling --catalog postgresql://USER@HOST/DB
        [--root /tmp/mergepipe-worker-bench] [--size-mb 16] [--experts 2] [--jobs 8]
        [--op ties] [--budget 1.0] [--repeats 3] [--workers 1,2]

Generates (once) a bf16 Llama-shaped family (benchmarks.family) under --root, ingests it into
the empty PostgreSQL database of --catalog (a throw-away one: the benchmark fills it), then for each
repeat and worker count (the order alternates between repeats: 1,2 then 2,1, ...) starts that
many `mergepipe worker` processes (one job thread each, the local engine), waits until they are
ready, queues --jobs identical merges (strategy scratch: each is merged in full) and times the
batch from the first submit to the last merge's success. Every merge's output hash must be the
same. Reports jobs/s (median of the repeats), the ratio to one worker, and the workers' CPU
time over the wall time (cores busy), which says what bounds the ratio on a small machine;
and, when the PostgreSQL server runs on this machine, its CPU time over the wall time too.
Prints a table and writes worker_scaling.json in --root.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from mergepipe.catalog import records
from mergepipe.catalog.db import Catalog, load_sql
from mergepipe.catalog.ingest import ingest_model
from mergepipe.cli.family import generate_family
from mergepipe.core.request import MergeRequest, build_request
from mergepipe.core.settings import CATALOG_URL_SCHEMES
from mergepipe.jobs.merge import submit_merge

MODULE = "mergepipe_bench.worker_scaling"
POLL_S = 0.05  # how often the batch's end is checked


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=MODULE, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--catalog", required=True,
                   help="postgresql:// URL of an empty database the benchmark may fill")
    p.add_argument("--root", default="/tmp/mergepipe-worker-bench")
    p.add_argument("--size-mb", type=float, default=16.0)
    p.add_argument("--experts", type=int, default=2)
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--op", default="ties")
    p.add_argument("--budget", default="1.0")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", default="1,2", help="worker processes to try, comma-separated")
    p.add_argument("--same-session", action="store_true",
                   help="start the workers in this process's session (the kernel's autogroup "
                   "scheduler makes a session one group) instead of one session each, as "
                   "separate services or machines would be")
    args = p.parse_args(argv)
    root = Path(args.root).absolute()
    fam = root / "family"
    if not (fam / "family.json").exists():
        shutil.rmtree(root, ignore_errors=True)
        generate_family(fam, experts=args.experts, size_mb=args.size_mb)
    counts = [int(w) for w in args.workers.split(",")]
    runs: dict[int, list[dict[str, Any]]] = {w: [] for w in counts}
    load = [os.getloadavg()[0]]
    if not args.catalog.startswith(CATALOG_URL_SCHEMES):
        p.error(f"--catalog must be a PostgreSQL URL ({', '.join(CATALOG_URL_SCHEMES)})")
    with Catalog(args.catalog) as cat:
        server = ServerCpu.of(cat, args.catalog)
        ingest_model(cat, fam / "base", "base")
        experts = [f"expert-{i:02d}" for i in range(args.experts)]
        for name in experts:
            ingest_model(cat, fam / name, name, base="base")
        req = build_request(base="base", experts=",".join(experts), operator=args.op,
                            budget=args.budget, params={"density": 0.5}, strategy="scratch")
        for rep in range(args.repeats):
            for w in counts if rep % 2 == 0 else counts[::-1]:
                runs[w].append(_batch(cat, args.catalog, server, root, req, w, args.jobs,
                                      f"r{rep}w{w}", own_session=not args.same_session))
                load.append(os.getloadavg()[0])
    hashes = {h for rs in runs.values() for r in rs for h in r["output_hashes"]}
    if len(hashes) != 1:
        raise SystemExit(f"the merges wrote {len(hashes)} different outputs, not one")
    rows = [_summary(w, runs[w], args.jobs) for w in counts]
    one = rows[0]["jobs_per_s"]
    print(f"{'workers':>7} {'median s':>9} {'jobs/s':>7} {'vs 1':>6} {'workers busy':>12} "
          f"{'catalog busy':>12} {'job plan s':>10} {'job exec s':>10}  runs")
    for r in rows:
        r["ratio_vs_first"] = round(r["jobs_per_s"] / one, 3)
        print(f"{r['workers']:>7} {r['median_s']:9.2f} {r['jobs_per_s']:7.2f} "
              f"{r['ratio_vs_first']:6.2f} {r['cores_busy']:12.2f} "
              f"{_cores(r['catalog_cores_busy']):>12} {r['job_plan_s']:10.2f} {r['job_exec_s']:10.2f}"
              f"  {r['runs_s']}")
    print(f"load average (1 min) during the runs: {min(load):.1f} - {max(load):.1f}; "
          f"{os.cpu_count()} CPUs")
    (root / "worker_scaling.json").write_text(json.dumps(
        {"size_mb": args.size_mb, "experts": args.experts, "jobs": args.jobs, "op": args.op,
         "own_sessions": not args.same_session,
         "budget": args.budget, "cpus": os.cpu_count(), "load": [round(x, 1) for x in load],
         "rows": rows}, indent=2))
    return 0


class ServerCpu:
    """CPU seconds of a PostgreSQL server on this machine (its postmaster and backends), found
    from the catalog connection's backend; `seconds()` is None for a server elsewhere."""

    def __init__(self, postmaster: psutil.Process | None) -> None:
        self.postmaster = postmaster

    @staticmethod
    def of(cat: Catalog, url: str) -> ServerCpu:
        host = urlsplit(url).hostname or "localhost"
        if host not in ("localhost", "127.0.0.1", "::1"):
            return ServerCpu(None)
        pid = int(cat.query(load_sql("pg_backend_pid"))[0][0])
        try:
            return ServerCpu(psutil.Process(pid).parent())
        except psutil.Error:
            return ServerCpu(None)

    def seconds(self) -> float | None:
        if self.postmaster is None:
            return None
        total = 0.0
        for proc in [self.postmaster, *self.postmaster.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system
        return total


def _batch(cat: Catalog, url: str, server: ServerCpu, root: Path, req: MergeRequest,
           workers: int, jobs: int, tag: str, *, own_session: bool) -> dict[str, Any]:
    """Start `workers` processes, queue `jobs` merges, time the batch; stop the workers."""
    out = root / "out"
    procs = [_start_worker(url, root, out, own_session) for _ in range(workers)]
    try:
        for proc in procs:
            _wait_ready(proc)
        cpu0 = [_cpu(proc) for proc in procs]
        pg0 = server.seconds()
        t0 = time.perf_counter()
        ids = [submit_merge(cat, req, f"{tag}j{i}", out / f"{tag}j{i}").merge_id
               for i in range(jobs)]
        rows = _wait_done(cat, [i for i in ids if i is not None])
        wall = time.perf_counter() - t0
        cpu = sum(_cpu(proc) - c for proc, c in zip(procs, cpu0, strict=True))
        pg1 = server.seconds()
        pg_cpu = None if pg0 is None or pg1 is None else pg1 - pg0
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(out, ignore_errors=True)
    return {"wall_s": wall, "cpu_s": cpu, "output_hashes": sorted({r.output_hash for r in rows}),
            "exec_s": sum(r.exec_seconds or 0.0 for r in rows),
            "plan_s": sum(r.plan_seconds or 0.0 for r in rows), "pg_cpu_s": pg_cpu}


def _start_worker(url: str, root: Path, out: Path, own_session: bool) -> subprocess.Popen[str]:
    env = dict(os.environ, MERGEPIPE_CATALOG=url, MERGEPIPE_WORKERS="1",
               MERGEPIPE_DATA_ROOTS=str(root), MERGEPIPE_OUTPUT_ROOT=str(out),
               MERGEPIPE_ENGINE="local")
    return subprocess.Popen([sys.executable, "-m", "mergepipe", "worker", "--log-level",
                             "warning"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True,
                            start_new_session=own_session)


def _wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "worker <id> ready" once its runner has started
    if "ready" not in line:
        raise SystemExit(f"a worker did not start (exit status {proc.poll()}): {line!r}")


def _cpu(proc: subprocess.Popen[str]) -> float:
    t = psutil.Process(proc.pid).cpu_times()
    return float(t.user + t.system)


def _wait_done(cat: Catalog, ids: list[str]) -> list[records.MergeRow]:
    while True:
        rows = [records.get_merge(cat, i) for i in ids]
        failed = [r for r in rows if r.status == "failed"]
        if failed:
            raise SystemExit(f"merge {failed[0].merge_id} failed: {failed[0].error}")
        if all(r.status == "succeeded" for r in rows):
            return rows
        time.sleep(POLL_S)


def _summary(workers: int, runs: list[dict[str, Any]], jobs: int) -> dict[str, Any]:
    walls = [r["wall_s"] for r in runs]
    med = statistics.median(walls)
    return {"workers": workers, "median_s": round(med, 3), "runs_s": [round(w, 2) for w in walls],
            "jobs_per_s": round(jobs / med, 3),
            "cores_busy": round(statistics.median(r["cpu_s"] / r["wall_s"] for r in runs), 2),
            "catalog_cores_busy": (None if any(r["pg_cpu_s"] is None for r in runs) else
                                   round(statistics.median(r["pg_cpu_s"] / r["wall_s"]
                                                           for r in runs), 2)),
            "job_exec_s": round(statistics.median(r["exec_s"] / jobs for r in runs), 3),
            "job_plan_s": round(statistics.median(r["plan_s"] / jobs for r in runs), 3)}


def _cores(busy: float | None) -> str:
    return "-" if busy is None else f"{busy:.2f}"


if __name__ == "__main__":
    raise SystemExit(main())
