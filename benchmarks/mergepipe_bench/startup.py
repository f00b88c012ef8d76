"""Start-up of CLI commands: median wall and CPU time of fresh interpreters, and what they import.

`python -m mergepipe_bench.startup [--runs 5] [--catalog PATH]` runs `mergepipe --help`,
`mergepipe models` and `mergepipe sql` each `runs` times as a user would (a new process each
time) and prints one JSON object: per command the median wall and CPU seconds and the number of
modules it imported, with the load average (timings on a busy machine are inflated; CPU seconds
and imports much less).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COUNT = ("import sys; from mergepipe.cli.main import main\n"
         "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
         "print(len(sys.modules), file=sys.stderr)\n")


def measure(argv: list[str], runs: int) -> dict[str, float]:
    """Median wall and CPU seconds of `mergepipe ARGV`, and the modules it imports."""
    walls, cpus = [], []
    for _ in range(runs):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "mergepipe", *argv], check=True,
                       capture_output=True)
        walls.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    done = subprocess.run([sys.executable, "-c", COUNT, *argv], check=True, capture_output=True,
                          text=True)
    return {"wall_s": round(statistics.median(walls), 3),
            "cpu_s": round(statistics.median(cpus), 3),
            "modules": int(done.stderr.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--catalog", help="catalog to list (default: a new empty one)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cat = args.catalog or str(Path(tmp) / "catalog.duckdb")
        commands = {"--help": ["--help"], "models": ["--catalog", cat, "models"],
                    "sql": ["--catalog", cat, "sql", "SELECT count(*) FROM models"]}
        out: dict[str, object] = {c: measure(a, args.runs) for c, a in commands.items()}
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
