"""Helpers of the mergekit parity tests: a tiny Llama family, mergekit-yaml runs, our runs of the
same config, and the measures the conformance table reports (share of entries that differ, rel L2).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

from mergepipe.catalog.db import Catalog
from mergepipe.jobs.config import load_config
from mergepipe.jobs.ingest import run_ingestion
from mergepipe.jobs.merge import merge
from tests import factory

EXPERTS = ("e0", "e1", "e2")
WEIGHTS = (1.0, 0.5, 2.0)
DENSITIES = (0.5, 0.3, 0.7)
DENSITY_METHODS = ("ties", "dare_ties", "dare_linear", "breadcrumbs", "breadcrumbs_ties", "della",
                   "della_linear")
BLOCK_BYTES = 512  # several blocks per matrix: the per-block path is what is compared

# mergekit-yaml's own entry point, for every config in one subprocess (one import of torch,
# transformers and mergekit instead of one per config).
_RUN = """
import os, sys
from mergekit.scripts.run_yaml import main
seed = ["--random-seed", os.environ["MK_SEED"]] if os.environ.get("MK_SEED") else []
for cfg, out in zip(sys.argv[1::2], sys.argv[2::2]):
    main([cfg, out, "--no-copy-tokenizer", "--no-write-model-card", *seed], standalone_mode=False)
"""


def llama_shapes(layers: int) -> dict[str, tuple[int, ...]]:
    """factory.LLAMA_SHAPES with `layers` decoder layers (gradients need more than two)."""
    per_layer = {k.split(".", 3)[3]: v for k, v in factory.LLAMA_SHAPES.items()
                 if k.startswith("model.layers.0.")}
    outer = {k: v for k, v in factory.LLAMA_SHAPES.items() if not k.startswith("model.layers.")}
    head = {k: outer.pop(k) for k in ("model.embed_tokens.weight",)}
    return {**head, **{f"model.layers.{i}.{k}": v for i in range(layers)
                       for k, v in per_layer.items()}, **outer}


def make_family(root: Path, dtype: str = "BF16", layers: int = 2) -> dict[str, Path]:
    """A Llama base and 3 full experts (one with an untouched tensor, one sparse)."""
    cfg = {**factory.LLAMA_CONFIG, "num_hidden_layers": layers}
    shapes = factory.LLAMA_SHAPES if layers == 2 else llama_shapes(layers)
    base = factory.save_checkpoint(root / "base", factory.random_weights(shapes, 0),
                                   dtype=dtype, config=cfg)
    out = {"base": base}
    for i, name in enumerate(EXPERTS):
        out[name] = factory.make_expert(
            base, root / name, seed=100 + i, zero_tensors=("model.norm.weight",) if i == 0 else (),
            sparsity=0.3 if i == 2 else 0.0)
        (out[name] / "config.json").write_text(json.dumps(cfg))
    return out


def config(method: str, fam: dict[str, Path], dtype: str | None, *,
           params: dict[str, Any] | None = None, base_entry: dict[str, Any] | None = None,
           densities: tuple[float, ...] = DENSITIES) -> dict[str, Any]:
    """A config shaped like mergekit's tests: the experts with weights (and densities)."""
    models = [] if base_entry is None else [{"model": str(fam["base"]), **base_entry}]
    for name, w, d in zip(EXPERTS, WEIGHTS, densities, strict=True):
        p: dict[str, float] = {"weight": w}
        if method in DENSITY_METHODS:
            p["density"] = d
        models.append({"model": str(fam[name]), "parameters": p})
    cfg: dict[str, Any] = {"merge_method": method, "base_model": str(fam["base"]),
                           "models": models}
    if params:
        cfg["parameters"] = params
    if dtype:
        cfg["dtype"] = dtype
    return cfg


def run_mergekit(cfgs: dict[str, dict[str, Any]], root: Path, seed: int | None = None
                 ) -> dict[str, dict[str, torch.Tensor]]:
    """mergekit-yaml's output of each named config (`seed`: its --random-seed)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "MK_SEED": "" if seed is None else str(seed)}
    args = []
    for name, cfg in cfgs.items():
        (root / f"{name}.yml").write_text(yaml.safe_dump(cfg))
        args += [str(root / f"{name}.yml"), str(root / name)]
    proc = subprocess.run([sys.executable, "-c", _RUN, *args], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, f"mergekit-yaml failed:\n{(proc.stdout + proc.stderr)[-3000:]}"
    return {name: load_raw(root / name) for name in cfgs}


def run_ours(cat: Catalog, cfg: dict[str, Any], out: Path, *, stats: bool = True, **kw: Any
             ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """`mergepipe merge CFG.yml` in process: resolve, register what is new (experts without
    statistics unless `stats`), merge."""
    request, resolved = load_config(cat, yaml.safe_dump(cfg), **kw)
    for job in resolved.to_ingest:
        run_ingestion(cat, dataclasses.replace(job, block_bytes=BLOCK_BYTES,
                                               with_stats=stats or job.base is None))
    summary = merge(cat, request, out, output_name=out.name).to_dict()
    return summary, load_raw(out)


def budgeted_and_full(cat: Catalog, cfg: dict[str, Any], out: Path, prefix: str = ""
                      ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two merges of `cfg` at 40% of the full read (out/PREFIXb0, b1): each within its budget,
    one plan, equal outputs; then the full merge (out/PREFIXfull), whose output differs. The
    summaries of the first budgeted merge and of the full one."""
    runs = [run_ours(cat, cfg, out / f"{prefix}b{i}", budget=0.4) for i in range(2)]
    for summary, _ in runs:
        assert 0 < summary["expert_bytes_read"] <= summary["budget_bytes"]
    (s0, a), (s1, b) = runs
    assert s0["plan_hash"] == s1["plan_hash"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    full, ref = run_ours(cat, cfg, out / f"{prefix}full")
    assert any(not torch.equal(a[k], ref[k]) for k in a)
    return s0, full


def load_raw(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


def differences(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor],
                keep: dict[str, torch.Tensor] | None = None) -> tuple[int, int, float]:
    """(differing entries, compared entries, rel L2 of the difference) over the kept entries."""
    assert set(ours) == set(theirs)
    differ = compared = 0
    num = den = 0.0
    for name, t in theirs.items():
        o = ours[name]
        assert o.dtype == t.dtype and o.shape == t.shape, name
        k = keep[name] if keep is not None else torch.ones(t.shape, dtype=torch.bool)
        a, b = o[k].double(), t[k].double()
        differ += int((o[k].view(torch.int16 if t.element_size() == 2 else torch.int32)
                       != t[k].view(torch.int16 if t.element_size() == 2 else torch.int32)).sum())
        compared += int(k.sum())
        num += float(((a - b) ** 2).sum())
        den += float((b ** 2).sum())
    return differ, compared, (num / den) ** 0.5 if den else 0.0


def untied(fam: dict[str, Path], dtype: torch.dtype, densities: tuple[Any, ...] = DENSITIES
           ) -> dict[str, torch.Tensor]:
    """Entries no expert has at its trim threshold in the compute dtype (where mergekit's
    argsort keeps an arbitrary subset of the tied entries). A density may be a function of the
    tensor name (per-tensor parameters). A tensor of another shape than the base's (an
    expert's resized embeddings) is left to the caller."""
    base = {k: v.to(dtype) for k, v in factory.load(fam["base"]).items()}
    keep = {k: torch.ones(v.shape, dtype=torch.bool) for k, v in base.items()}
    for name, dens in zip(EXPERTS, densities, strict=True):
        for k, v in factory.load(fam[name]).items():
            if v.shape != base[k].shape:
                continue
            d = (v.to(dtype) - base[k]).abs().float().reshape(-1)
            n = max(1, int((dens(k) if callable(dens) else dens) * d.numel()))
            tau = torch.sort(d, descending=True).values[n - 1]
            if tau > 0 and int((d >= tau).sum()) > n:
                keep[k] &= ~(d == tau).reshape(keep[k].shape)
    return keep
