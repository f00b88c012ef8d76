"""The mergekit baseline: a YAML config of the same merge, and the worker job that runs it.

The job runs `mergekit-yaml CONFIG OUT --no-copy-tokenizer --no-write-model-card --quiet` in a
warm worker process (benchmarks.worker), so imports are paid once and reported apart.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

import yaml

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
    if operator != "linear":  # linear averages the experts alone (docs/operators.md, linear)
        cfg["base_model"] = str(Path(base).absolute())
    return cfg


def warm_up() -> None:
    """Import mergekit (paid once per worker)."""
    import mergekit.scripts.run_yaml  # noqa: F401


def write_config(config: dict[str, Any], path: Path) -> Path:
    """Write a mergekit YAML config."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """job: config (YAML path), out, seed. Times the mergekit-yaml command in process."""
    from mergekit.io.tasks import LoaderCache
    from mergekit.scripts.run_yaml import main as mergekit_yaml

    t0 = time.perf_counter()
    try:
        mergekit_yaml([job["config"], job["out"], *CLI_FLAGS, "--random-seed",
                       str(job.get("seed", 0))], standalone_mode=False)
    finally:
        # mergekit keeps a process-wide cache of open (memory-mapped) loaders: drop it so
        # that the next job's inputs can be evicted from the page cache and are read cold.
        LoaderCache().loaders.clear()
        gc.collect()
    return {"merge_s": time.perf_counter() - t0}
