"""Full-read merges against `cat` of the same bytes, fused kernels on and off, cold cache.

    python -m mergepipe_bench.fullread_ab FAMILY --catalog CAT [--ops linear,ties]

FAMILY is a `mergepipe gen-family` directory whose base and experts CAT has ingested as
base, expert-00, ... Each repetition runs, in a rotating order, `cat` of the base's and the
experts' files plus a `dd conv=fsync` of the output's (the base's) size, the merge with the fused kernels,
and the merge with MERGEPIPE_NO_FUSED=1 (the torch kernels), each after evicting the inputs
from the page cache. Prints each run and the medians: whole command wall time, and the
merge's own execute time.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import uuid
from pathlib import Path

from mergepipe_bench.coldcache import files_under, make_cold
from mergepipe_bench.proc import child_env, python_cmd, run_timed

_EXECUTE = re.compile(r"execute ([0-9.]+) s")


def _merge_cmd(catalog: str, experts: list[str], op: str, density: float, out: Path,
               name: str) -> list[str]:
    cmd = python_cmd("mergepipe", "--catalog", catalog, "merge", "--base", "base", "--experts",
                     ",".join(experts), "--op", op, "--out", str(out), "--overwrite",
                     "--name", name)
    return cmd + (["--param", f"density={density}"] if op == "ties" else [])


def _cat_cmd(inputs: list[str], out: Path, nbytes: int) -> list[str]:
    mib = max(1, nbytes >> 20)
    return ["bash", "-c", f"cat {' '.join(inputs)} > /dev/null && dd if=/dev/zero of={out} "
            f"bs=1M count={mib} conv=fsync status=none && rm -f {out}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("family")
    ap.add_argument("--catalog", required=True)
    ap.add_argument("--ops", default="linear,ties")
    ap.add_argument("--density", type=float, default=0.5)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    fam = Path(a.family)
    experts = sorted(p.name for p in fam.glob("expert-*"))
    inputs = files_under([fam / "base", *(fam / e for e in experts)])
    inputs = [f for f in inputs if f.endswith(".safetensors")]
    out = fam / "ab-output"
    for op in a.ops.split(","):
        runs: dict[str, list[tuple[float, float]]] = {"cat": [], "fused": [], "torch": []}
        order = list(runs)
        for rep in range(a.reps):
            for name in order[rep % 3:] + order[:rep % 3]:
                make_cold(inputs)
                if name == "cat":
                    nbytes = sum(f.stat().st_size for f in (fam / "base").glob("*.safetensors"))
                    t = run_timed(_cat_cmd(inputs, fam / "cat-out.bin", nbytes)).check()
                    runs[name].append((t.wall_s, t.wall_s))
                    continue
                env = child_env(**({"MERGEPIPE_NO_FUSED": "1"} if name == "torch" else {}))
                cmd = _merge_cmd(a.catalog, experts, op, a.density, out,
                                 f"ab-{op}-{name}-{rep}-{uuid.uuid4().hex[:8]}")
                t = run_timed(cmd, env=env).check()
                m = _EXECUTE.search(t.stdout)
                runs[name].append((t.wall_s, float(m.group(1)) if m else float("nan")))
                print(f"{op} rep {rep} {name}: wall {t.wall_s:.2f} s, execute "
                      f"{runs[name][-1][1]:.2f} s", flush=True)
            print(f"{op} rep {rep} cat: {runs['cat'][-1][0]:.2f} s", flush=True)
        cat = statistics.median(w for w, _ in runs["cat"])
        for name in ("fused", "torch"):
            wall = statistics.median(w for w, _ in runs[name])
            exe = statistics.median(e for _, e in runs[name])
            print(f"{op} {name}: median wall {wall:.2f} s = {wall / cat:.2f}x cat ({cat:.2f} s); "
                  f"median execute {exe:.2f} s = {exe / cat:.2f}x cat")
    return 0


if __name__ == "__main__":
    sys.exit(main())
