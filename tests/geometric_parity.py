"""Configs of the geometric methods (slerp, nuslerp, model_stock) shaped like mergekit's tests,
and the measure their conformance table reports: entries that differ and by how many ulps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests import mergekit_parity as mp

# name -> (method, dtype, global parameters)
CASES: dict[str, tuple[str, str | None, dict[str, Any]]] = {
    **{f"slerp-{d or 'none'}": ("slerp", d, {"t": 0.3}) for d in ("bfloat16", "float32", None)},
    **{f"model_stock-{d or 'none'}": ("model_stock", d, {}) for d in ("bfloat16", "float32", None)},
    **{f"nuslerp-{d or 'none'}": ("nuslerp", d, {}) for d in ("bfloat16", "float32", None)},
    "model_stock-filter_wise-bfloat16": ("model_stock", "bfloat16", {"filter_wise": True}),
    "nuslerp-row_wise-bfloat16": ("nuslerp", "bfloat16",
                                  {"nuslerp_row_wise": True, "nuslerp_flatten": False}),
    "nuslerp-rows-bfloat16": ("nuslerp", "bfloat16", {"nuslerp_flatten": False}),
    **{f"nearswap-{d or 'none'}": ("nearswap", d, {"t": 0.004}) for d in ("bfloat16", "float32")},
    **{f"sce-{d or 'none'}": ("sce", d, {"select_topk": 0.5}) for d in ("bfloat16", "float32")},
    "sce-all-none": ("sce", None, {}),
    **{f"multislerp-{d or 'none'}": ("multislerp", d, {}) for d in ("bfloat16", "float32")},
    "multislerp-raw-float32": ("multislerp", "float32", {"normalize_weights": False}),
    **{f"karcher-{d or 'none'}": ("karcher", d, {}) for d in ("bfloat16", "float32", None)},
    "karcher-short-float32": ("karcher", "float32", {"max_iter": 2, "tol": 1e-3}),
    **{f"ram-{d or 'none'}": ("ram", d, {}) for d in ("bfloat16", "float32")},
    "ram-eps-float32": ("ram", "float32", {"epsilon": 0.01}),
    **{f"ramplus_tl-{d or 'none'}": ("ramplus_tl", d, {"epsilon": 0.005})
       for d in ("bfloat16", "float32")},
    "ramplus_tl-r-float32": ("ramplus_tl", "float32", {"r": 0.5, "alpha": 0.9,
                                                       "epsilon": 0.01}),
    **{f"arcee_fusion-{d or 'none'}": ("arcee_fusion", d, {}) for d in ("bfloat16", "float32")},
}
# mergekit's ramplus_tl and arcee_fusion promote to float32 (an overlap scale, a mask made with
# .float()) and write float32 tensors even for a bfloat16 config; MergePipe writes the config's
# dtype: the same values, rounded once
PROMOTED = {"ramplus_tl-bfloat16", "arcee_fusion-bfloat16"}
# the methods added after mergekit parity was first measured (tests/test_geometric_parity.py)
NEWER = ("nearswap", "sce", "multislerp", "karcher", "ram", "ramplus_tl", "arcee_fusion")


def config(method: str, fam: dict[str, Path], dtype: str | None, params: dict[str, Any]
           ) -> dict[str, Any]:
    """slerp: the base and e0 listed (mergekit's two inputs); nuslerp: e0 and e1 with weights;
    model_stock: the three experts (no weights)."""
    base = str(fam["base"])
    if method == "slerp":
        models: list[dict[str, Any]] = [{"model": base}, {"model": str(fam["e0"])}]
    elif method in ("nearswap", "arcee_fusion"):
        models = [{"model": str(fam["e0"])}]
    elif method == "multislerp":
        models = [{"model": str(fam[n]), "parameters": {"weight": w}}
                  for n, w in zip(mp.EXPERTS, mp.WEIGHTS, strict=True)]
    elif method == "nuslerp":
        models = [{"model": str(fam[n]), "parameters": {"weight": w}}
                  for n, w in (("e0", 1.0), ("e1", 0.5))]
    else:
        models = [{"model": str(fam[n])} for n in mp.EXPERTS]
    cfg: dict[str, Any] = {"merge_method": method, "base_model": base, "models": models}
    if params:
        cfg["parameters"] = params
    if dtype:
        cfg["dtype"] = dtype
    return cfg


def ulps(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor], *,
         promoted: bool = False) -> tuple[int, int, int]:
    """(differing entries, largest difference in ulps, compared entries); `promoted`: theirs
    are float32 values of a bfloat16 config, compared rounded to ours' dtype."""
    differ = worst = total = 0
    for name, t in theirs.items():
        o = ours[name]
        if promoted:
            assert t.dtype == torch.float32, name
            t = t.to(o.dtype)
        assert o.dtype == t.dtype and o.shape == t.shape, name
        ints = torch.int16 if t.element_size() == 2 else torch.int32
        d = (o.view(ints).long() - t.view(ints).long()).abs()
        differ += int((d != 0).sum())
        worst = max(worst, int(d.max()) if d.numel() else 0)
        total += t.numel()
    return differ, worst, total
