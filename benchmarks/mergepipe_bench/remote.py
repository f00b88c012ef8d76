"""Budgeted merges of experts in S3 against mergekit on a local copy: bytes fetched, wall time.

    python -m mergepipe_bench.remote [--root /tmp/mergepipe-remote-bench] [--size-mb 32]
                                          [--experts 3] [--runs 3]

Generates (once) a bf16 Llama-shaped base and `--experts` full experts (benchmarks.family),
starts moto's S3 server on loopback (the test extra's `moto_server`), uploads the family and
ingests it from S3. Then, `--runs` times each (medians): a TIES merge (density 0.5) from S3 at
budgets 0.1, 0.3 and 1.0, and mergekit on a local copy (mergekit cannot read S3 by range:
the copy is downloaded first, and its download is part of its time). Bytes fetched are
MergePipe's network counters (response bodies; tests/test_remote_s3.py checks them against a
counting proxy). A model of the same merges at real network speeds follows: time = bytes /
bandwidth + requests x round trip / concurrency. Writes results.json under --root.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.cli.family import generate_family, read_family
from mergepipe.core.request import build_request
from mergepipe.jobs.merge import merge
from mergepipe_bench.mergekit_run import mergekit_config, run_job, write_config

BUDGETS = (0.1, 0.3, 1.0)
BUCKET = "mergepipe-bench"
LINKS = {"100 Mbit/s": 100e6 / 8, "1 Gbit/s": 1e9 / 8, "10 Gbit/s": 10e9 / 8}
ROUND_TRIP_S = 0.03  # a typical first-byte latency of an object store in the same region
CONCURRENCY = 8  # MergePipe's read threads


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mergepipe_bench.remote", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default="/tmp/mergepipe-remote-bench")
    p.add_argument("--size-mb", type=float, default=32.0)
    p.add_argument("--experts", type=int, default=3)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    root = Path(args.root)
    family = _family(root, args.size_mb, args.experts)
    with _s3_server() as endpoint:
        _use_endpoint(endpoint)
        _upload(endpoint, family)
        results = _measure(root, family, args.runs)
    results["model"] = network_model(results)
    (root / "results.json").write_text(json.dumps(results, indent=2))
    print(report(results))
    return 0


def _family(root: Path, size_mb: float, experts: int) -> dict[str, Path]:
    if (root / "family" / "family.json").exists():
        info = read_family(root / "family")
        if info["size_mb"] == size_mb and len(info["experts"]) == experts:
            return {n: root / "family" / n for n in
                    ["base", *(e["name"] for e in info["experts"])]}
    shutil.rmtree(root / "family", ignore_errors=True)
    return generate_family(root / "family", experts=experts, size_mb=size_mb)


@contextlib.contextmanager
def _s3_server() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _use_endpoint(endpoint: str) -> None:
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
                       "AWS_ALLOW_HTTP": "true"})


def _client(endpoint: str) -> Any:
    import boto3  # the remote extra

    return boto3.client("s3", endpoint_url=endpoint)


def _upload(endpoint: str, family: dict[str, Path]) -> None:
    client = _client(endpoint)
    client.create_bucket(Bucket=BUCKET)
    for name, d in family.items():
        for f in sorted(d.iterdir()):
            client.upload_file(str(f), BUCKET, f"family/{name}/{f.name}")


def _measure(root: Path, family: dict[str, Path], runs: int) -> dict[str, Any]:
    experts = [n for n in family if n != "base"]
    catalog = root / "remote.duckdb"
    catalog.unlink(missing_ok=True)
    out: dict[str, Any] = {"experts": len(experts), "checkpoint_bytes": _bytes(family["base"])}
    with Catalog(catalog) as cat:
        t0 = time.perf_counter()
        ingest_model(cat, f"s3://{BUCKET}/family/base", "base")
        for e in experts:
            ingest_model(cat, f"s3://{BUCKET}/family/{e}", e, base="base")
        out["ingest_s"] = time.perf_counter() - t0
        out["ours"] = {str(b): _ours(cat, root, experts, b, runs) for b in BUDGETS}
    out["mergekit"] = _mergekit(root, family, experts, runs)
    return out


def _ours(cat: Catalog, root: Path, experts: list[str], budget: float, runs: int
          ) -> dict[str, Any]:
    walls, last = [], None
    request = build_request(base="base", experts=",".join(experts), operator="ties",
                            params={"density": 0.5}, budget=budget)
    for i in range(runs):
        target = root / "outputs" / f"ours-{budget}-{i}"
        shutil.rmtree(target, ignore_errors=True)
        t0 = time.perf_counter()
        last = merge(cat, request, target, output_name=f"ours-{budget}-{i}")
        walls.append(time.perf_counter() - t0)
        if i < runs - 1:
            shutil.rmtree(target, ignore_errors=True)
    assert last is not None
    experts_io = json.loads((target / "manifest.json").read_text())["experts"]
    shutil.rmtree(target, ignore_errors=True)
    return {"wall_s": statistics.median(walls), "expert_bytes": last.expert_bytes_read,
            "base_bytes": last.base_bytes_read, "full_read_bytes": last.full_read_bytes,
            "requests": sum(int(e["requests"]) for e in experts_io)}


def _mergekit(root: Path, family: dict[str, Path], experts: list[str], runs: int
              ) -> dict[str, Any]:
    client = _client(os.environ["AWS_ENDPOINT_URL"])
    walls, downloads = [], []
    for i in range(runs):
        copy = root / "local-copy"
        shutil.rmtree(copy, ignore_errors=True)
        t0 = time.perf_counter()
        for name in ["base", *experts]:
            (copy / name).mkdir(parents=True)
            for f in sorted(family[name].iterdir()):
                client.download_file(BUCKET, f"family/{name}/{f.name}", str(copy / name / f.name))
        downloads.append(time.perf_counter() - t0)
        cfg = write_config(mergekit_config("ties", copy / "base", [copy / e for e in experts],
                                           params={"density": 0.5, "normalize": True}),
                           root / "mergekit.yml")
        out = root / "outputs" / f"mergekit-{i}"
        shutil.rmtree(out, ignore_errors=True)
        walls.append(downloads[-1] + run_job({"config": str(cfg), "out": str(out)})["merge_s"])
        shutil.rmtree(out, ignore_errors=True)
    fetched = sum(_bytes(family[n]) for n in ["base", *experts])
    return {"wall_s": statistics.median(walls), "download_s": statistics.median(downloads),
            "fetched_bytes": fetched}


def _bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file())


def network_model(results: dict[str, Any]) -> dict[str, Any]:
    """Seconds to fetch what each merge needs over real links: bytes / bandwidth plus round
    trips (MergePipe: its ranged GETs, CONCURRENCY at a time; mergekit: one stream per file)."""
    rows: dict[str, Any] = {}
    mk = results["mergekit"]["fetched_bytes"]
    for link, bps in LINKS.items():
        row = {"mergekit_s": mk / bps + ROUND_TRIP_S * (results["experts"] + 1)}
        for b, r in results["ours"].items():
            row[f"ours_{b}_s"] = ((r["expert_bytes"] + r["base_bytes"]) / bps
                                  + ROUND_TRIP_S * r["requests"] / CONCURRENCY)
        rows[link] = row
    return rows


def report(results: dict[str, Any]) -> str:
    mk = results["mergekit"]
    lines = [f"{results['experts']} experts of {results['checkpoint_bytes'] / 1e6:.1f} MB "
             f"(bf16), ingested from S3 in {results['ingest_s']:.1f} s",
             "", "| run | bytes fetched | expert requests | wall (median) |",
             "| --- | ---: | ---: | ---: |",
             f"| mergekit on a local copy (download + merge) | {mk['fetched_bytes'] / 1e6:.1f} MB"
             f" | - | {mk['wall_s']:.2f} s ({mk['download_s']:.2f} s download) |"]
    for b, r in results["ours"].items():
        total = r["expert_bytes"] + r["base_bytes"]
        lines.append(f"| MergePipe from S3, budget {b} | {total / 1e6:.1f} MB (experts "
                     f"{r['expert_bytes'] / 1e6:.1f} MB) | {r['requests']} | "
                     f"{r['wall_s']:.2f} s |")
    lines += ["", "Model at real network speeds (bytes / bandwidth + round trips of "
              f"{ROUND_TRIP_S * 1000:.0f} ms, {CONCURRENCY} in parallel):", "",
              "| link | mergekit | " + " | ".join(f"ours {b}" for b in results["ours"]) + " |",
              "| --- | ---: | " + " | ".join("---:" for _ in results["ours"]) + " |"]
    for link, row in results["model"].items():
        cells = " | ".join(f"{row[f'ours_{b}_s']:.1f} s" for b in results["ours"])
        lines.append(f"| {link} | {row['mergekit_s']:.1f} s | {cells} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
