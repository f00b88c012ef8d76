"""The mergekit baseline: a YAML config equivalent to our request, run in a timed worker.

Run as `python -m benchmarks.mergekit_run CONFIG OUT [--seed S]`: imports mergekit, then times
`mergekit-yaml CONFIG OUT --no-copy-tokenizer --no-write-model-card --quiet` in process, so that
the result separates interpreter start-up and imports from the merge itself.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.proc import Timed, child_env, emit, python_cmd, run_timed

CLI_FLAGS = ["--no-copy-tokenizer", "--no-write-model-card", "--quiet"]


def mergekit_config(operator: str, base: Path, experts: list[Path], *,
                    params: dict[str, Any], weights: list[float] | None = None) -> dict[str, Any]:
    """mergekit 0.1.x config of the same merge (float32 math, bf16 out, explicit normalize)."""
    weights = weights or [1.0] * len(experts)
    density = params.get("density")
    models = []
    for path, w in zip(experts, weights, strict=True):
        p: dict[str, Any] = {"weight": w}
        if density is not None and operator in ("ties", "dare_ties", "dare_linear"):
            p["density"] = density
        models.append({"model": str(Path(path).absolute()), "parameters": p})
    glob: dict[str, Any] = {"normalize": bool(params["normalize"])}
    if operator != "linear":
        glob["lambda"] = float(params.get("lambda", 1.0))
    cfg: dict[str, Any] = {"merge_method": operator, "models": models, "parameters": glob,
                           "dtype": "float32", "out_dtype": "bfloat16"}
    if operator != "linear":  # linear averages the experts alone (DESIGN section 3)
        cfg["base_model"] = str(Path(base).absolute())
    return cfg


def run_mergekit(config: dict[str, Any], workdir: Path, out: Path, *, seed: int = 0,
                 timeout: float = 1800.0) -> Timed:
    """Write the config, run the worker in a child process; wall time, peak RSS, merge time."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / "mergekit.yml"
    cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = python_cmd("benchmarks.mergekit_run", str(cfg_path), str(out.absolute()),
                     "--seed", str(seed))
    return run_timed(cmd, env=child_env(), timeout=timeout).check()


def main() -> None:
    """Worker: import mergekit, time the mergekit-yaml command in process, print the result."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    from mergekit.scripts.run_yaml import main as mergekit_yaml
    t1 = time.perf_counter()
    mergekit_yaml([args.config, args.out, *CLI_FLAGS, "--random-seed", str(args.seed)],
                  standalone_mode=False)
    t2 = time.perf_counter()
    emit({"import_s": t1 - t0, "merge_s": t2 - t1})


if __name__ == "__main__":
    main()
