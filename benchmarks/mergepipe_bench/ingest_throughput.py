"""Ingestion throughput against `cat` of the same files on a cold page cache, peak RSS, catalog size.

    python -m benchmarks.ingest_throughput [--root /tmp/mergepipe-ingest-bench] [--size-mb 200]
                                           [--experts 2] [--profile]

Generates (once) a bf16 Llama-shaped base and `--experts` full experts of about `--size-mb` MB each
under --root (benchmarks.family), then, each on a cold page cache (sync + POSIX_FADV_DONTNEED of
every file): `cat` the base, ingest the base; per expert `cat` the expert, `cat` expert + base (the
bytes a statistics pass must read), ingest with statistics; and one expert with --no-stats.
Each ingestion runs in a child process (wall time and peak RSS from wait4); a child that only
imports the same modules gives the RSS baseline. Prints a table and writes results.json in --root.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mergepipe.catalog.connection import SQL
from mergepipe_bench.coldcache import files_under, make_cold
from mergepipe_bench.proc import emit, python_cmd, run_timed

MODULE = "mergepipe_bench.ingest_throughput"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=MODULE, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode")
    w = sub.add_parser("worker", help="(internal) ingest one model and print the result")
    w.add_argument("--catalog", required=True)
    w.add_argument("--path", required=True)
    w.add_argument("--name", required=True)
    w.add_argument("--base")
    w.add_argument("--no-stats", action="store_true")
    w.add_argument("--profile", help="write a cProfile of the ingestion to this file")
    sub.add_parser("baseline", help="(internal) import what a worker imports, then exit")
    p.add_argument("--root", default="/tmp/mergepipe-ingest-bench")
    p.add_argument("--size-mb", type=float, default=200.0)
    p.add_argument("--experts", type=int, default=2)
    p.add_argument("--profile", action="store_true", help="also profile expert-00's ingestion")
    args = p.parse_args(argv)
    if args.mode == "worker":
        return _worker(args)
    if args.mode == "baseline":
        import tempfile

        import mergepipe.catalog.ingest  # noqa: F401 - the modules a worker loads
        from mergepipe.catalog.db import Catalog
        with tempfile.TemporaryDirectory() as d, Catalog(Path(d) / "c.duckdb"):
            emit({})  # and an open catalog, as a worker has
        return 0
    return _bench(args)


def _worker(args: argparse.Namespace) -> int:
    from mergepipe.catalog.db import Catalog
    from mergepipe.catalog.ingest import scan_model, write_model

    with Catalog(args.catalog) as cat:
        c0 = time.process_time()
        t0 = time.perf_counter()
        if args.profile:
            import cProfile
            prof = cProfile.Profile()
            scanned = prof.runcall(scan_model, cat, args.path, args.name, base=args.base,
                                   with_stats=not args.no_stats)
            prof.dump_stats(args.profile)
        else:
            scanned = scan_model(cat, args.path, args.name, base=args.base,
                                 with_stats=not args.no_stats)
        t1 = time.perf_counter()
        with cat.transaction() as conn:
            write_model(conn, scanned)
        t2 = time.perf_counter()
        cpu = time.process_time() - c0
        with cat.transaction() as conn:
            conn.execute(SQL("CHECKPOINT"))
    emit({"scan_s": t1 - t0, "write_s": t2 - t1, "cpu_s": cpu, "bytes_read": scanned.bytes_read,
          "tensor_bytes": scanned.model.tensor_bytes, "blocks": len(scanned.blocks["tensor"]),
          "catalog_bytes_after": os.path.getsize(args.catalog)})
    return 0


def _cat(files: list[str]) -> float:
    make_cold(files)
    t0 = time.perf_counter()
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def _ingest(catalog: Path, path: Path, name: str, files: list[str], *, base: str | None = None,
            no_stats: bool = False, profile: str | None = None) -> dict[str, Any]:
    make_cold(files)
    cmd = python_cmd(MODULE, "worker", "--catalog", str(catalog), "--path", str(path),
                     "--name", name)
    if base:
        cmd += ["--base", base]
    if no_stats:
        cmd.append("--no-stats")
    if profile:
        cmd += ["--profile", profile]
    t = run_timed(cmd, env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])))
    t.check()
    # ingest_s: scan + write inside the child; process_s adds interpreter start and imports.
    return {"process_s": t.wall_s, "peak_rss": t.peak_rss, **t.result,
            "ingest_s": t.result["scan_s"] + t.result["write_s"]}


def _bench(args: argparse.Namespace) -> int:
    root = Path(args.root)
    fam = root / "fam"
    info_file = fam / "family.json"
    want = {"size_mb": args.size_mb, "experts": args.experts}
    if not info_file.exists() or json.loads((root / "want.json").read_text()
                                            if (root / "want.json").exists() else "{}") != want:
        from mergepipe.cli.family import generate_family
        shutil.rmtree(fam, ignore_errors=True)
        print(f"generating base + {args.experts} experts of {args.size_mb:g} MB in {fam} ...",
              file=sys.stderr)
        generate_family(fam, experts=args.experts, size_mb=args.size_mb)
        root.mkdir(parents=True, exist_ok=True)
        (root / "want.json").write_text(json.dumps(want))
    experts = [f"expert-{i:02d}" for i in range(args.experts)]
    weights = {n: [f for f in files_under([fam / n]) if f.endswith(".safetensors")]
               for n in ["base", *experts]}
    catalog = root / "catalog.duckdb"
    for suffix in ("", ".wal"):
        Path(f"{catalog}{suffix}").unlink(missing_ok=True)

    from mergepipe.catalog.db import Catalog
    base_rss = run_timed(python_cmd(MODULE, "baseline")).check().peak_rss
    runs: list[dict[str, Any]] = []
    with Catalog(catalog):
        pass
    empty_bytes = os.path.getsize(catalog)

    def record(what: str, files: list[str], r: dict[str, Any], cat_files: list[str]) -> None:
        size = sum(os.path.getsize(f) for f in files)
        cat_s = _cat(cat_files)
        r.update(what=what, file_bytes=size, cat_s=cat_s,
                 cat_bytes=sum(os.path.getsize(f) for f in cat_files),
                 mb_s=size / r["ingest_s"] / 1e6, cat_mb_s=size / cat_s / 1e6,
                 vs_cat=r["ingest_s"] / cat_s, rss_over_baseline=r["peak_rss"] - base_rss,
                 cpu_mb_s=size / r["cpu_s"] / 1e6)
        runs.append(r)
        print(f"{what:26s} {size / 1e6:6.1f} MB  ingest {r['ingest_s']:6.2f} s "
              f"({r['mb_s']:6.1f} MB/s; {r['cpu_s']:5.2f} s CPU = {r['cpu_mb_s']:6.0f} MB per "
              f"CPU-s; process {r['process_s']:5.2f} s)  cat {cat_s:5.2f} s "
              f"({r['cat_bytes'] / 1e6:.0f} MB)  x{r['vs_cat']:.2f}  peak RSS "
              f"{r['peak_rss'] / 2**20:4.0f} MiB (+{r['rss_over_baseline'] / 2**20:.0f})",
              file=sys.stderr)

    r = _ingest(catalog, fam / "base", "base", weights["base"])
    record("base (hashes)", weights["base"], r, weights["base"])
    for i, e in enumerate(experts):
        prof = str(root / "expert.prof") if args.profile and i == 0 else None
        r = _ingest(catalog, fam / e, e, weights[e] + weights["base"], base="base", profile=prof)
        record(f"{e} (stats)", weights[e], r, weights[e] + weights["base"])
    r = _ingest(catalog, fam / experts[0], "nostats", weights[experts[0]], base="base",
                no_stats=True)
    record(f"{experts[0]} (--no-stats)", weights[experts[0]], r, weights[experts[0]])

    ckpt_bytes = sum(os.path.getsize(f) for fs in weights.values() for f in fs)
    ckpt_bytes += sum(os.path.getsize(f) for f in weights[experts[0]])  # registered twice
    cat_bytes = os.path.getsize(catalog)
    growth = (cat_bytes - empty_bytes) / ckpt_bytes
    summary = {
        "family": want, "load_average": os.getloadavg(), "block_bytes": 1 << 20, "cpus": os.cpu_count(),
        "rss_baseline": base_rss, "runs": runs, "catalog_bytes": cat_bytes,
        "checkpoint_bytes_described": ckpt_bytes, "catalog_fraction": cat_bytes / ckpt_bytes,
        "empty_catalog_bytes": empty_bytes,
        "catalog_growth_fraction": growth,
    }
    (root / "results.json").write_text(json.dumps(summary, indent=2))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", file=sys.stderr)
    print(f"catalog {cat_bytes / 1e6:.2f} MB for {ckpt_bytes / 1e6:.0f} MB of checkpoints "
          f"({100 * cat_bytes / ckpt_bytes:.3f}%; an empty catalog is {empty_bytes / 1e6:.2f} "
          f"MB, growth {100 * growth:.3f}%); RSS baseline "
          f"{base_rss / 2**20:.0f} MiB; "
          f"results in {root / 'results.json'}", file=sys.stderr)
    if args.profile:
        import pstats
        pstats.Stats(str(root / "expert.prof"), stream=sys.stderr).sort_stats(
            "tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
