"""Ingested tiny families and whole-tensor reference merges for the executor tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from tests import factory

BLOCK_BYTES = 256  # several blocks per tensor of the tiny factory models


def ingest_family(cat: Catalog, root: Path, *, kinds: tuple[str, ...] = ("full",) * 3,
                  dtype: str = "BF16", shards: int = 1, seed: int = 0,
                  with_stats: bool = True, block_bytes: int = BLOCK_BYTES,
                  prefix: str = "") -> dict[str, Path]:
    """Write and ingest a base ('{prefix}base') and experts {prefix}e0.. of the given kinds."""
    base = factory.make_base(root / "base", seed=seed, dtype=dtype, shards=shards)
    (base / "tokenizer.json").write_text('{"version": "1.0"}')
    ingest_model(cat, base, f"{prefix}base", block_bytes=block_bytes)
    paths = {"base": base}
    for i, kind in enumerate(kinds):
        out = root / f"e{i}"
        s = seed * 1000 + 100 + i
        if kind == "full":
            factory.make_expert(base, out, seed=s, shards=shards,
                                zero_tensors=("model.norm.weight",) if i == 0 else ())
        elif kind == "delta":
            factory.make_delta(base, out, seed=s)
        else:
            factory.make_lora(base, out, seed=s)
        ingest_model(cat, out, f"{prefix}e{i}", base=f"{prefix}base", kind=kind,
                     with_stats=with_stats)
        paths[f"e{i}"] = out
    return paths


def deltas(paths: dict[str, Path], name: str, kind: str) -> dict[str, torch.Tensor]:
    """The float32 delta of an expert for every base tensor (zeros where it has none)."""
    base = factory.load(paths["base"])
    if kind == "full":
        e = factory.load(paths[name])
        return {n: e[n] - b for n, b in base.items()}
    if kind == "delta":
        return factory.load(paths[name])
    cfg = json.loads((paths[name] / "adapter_config.json").read_text())
    scale = cfg["lora_alpha"] / cfg["r"]
    raw = factory.load(paths[name])
    out = {n: torch.zeros_like(b) for n, b in base.items()}
    for key, a in raw.items():
        if ".lora_A." in key:
            stem = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            b_key = key.replace(".lora_A.", ".lora_B.")
            out[f"{stem}.weight"] = scale * (raw[b_key] @ a)
    return out


def additive_reference(paths: dict[str, Path], kinds: tuple[str, ...], coefficients: list[float]
                       ) -> dict[str, torch.Tensor]:
    """B + sum_i alpha_i D_i over whole tensors, in float32."""
    base = factory.load(paths["base"])
    ds = [deltas(paths, f"e{i}", k) for i, k in enumerate(kinds)]
    return {n: b + sum(c * d[n] for c, d in zip(coefficients, ds, strict=True))
            for n, b in base.items()}
