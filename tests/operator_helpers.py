"""Test-side drivers of the block operators: exact trims, expert blocks, row-block splitting."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mergepipe.core.operators import REGISTRY, BlockContext, ExpertBlock
from mergepipe.core.operators.base import Trim
from mergepipe.core.operators.keyed_hash import expert_key


@dataclass(frozen=True)
class TrimThreshold:
    """Mirror of planner.plan.TrimThreshold (docs/operators.md#ties)."""

    tau: float
    above: int
    tied: int
    k: int


def exact_trim(delta: torch.Tensor, density: float) -> TrimThreshold:
    """Reference TIES threshold of a whole tensor: the k-th largest |delta|, k = int(density*n)."""
    k = max(1 if delta.numel() else 0, int(density * delta.numel()))
    if k == 0:
        return TrimThreshold(math.inf, 0, 0, 0)
    mag = delta.abs().flatten().float()
    tau = float(torch.sort(mag, descending=True).values[k - 1])
    return TrimThreshold(tau, int((mag > tau).sum()), int((mag == tau).sum()), k)


def merge_tensor(op: str, base: torch.Tensor, deltas: Sequence[torch.Tensor | None],
                 weights: Sequence[float], *, densities: Sequence[float] | None = None,
                 params: dict | None = None, seed: int = 0, tensor: str = "t",
                 blocks: Sequence[tuple[int, int]] | None = None,
                 omit: dict[int, set[int]] | None = None,
                 trims: Sequence[Trim | None] | None = None) -> torch.Tensor:
    """Run operator `op` over `base` cut into row blocks, as the executor does.

    `omit` maps expert index -> block indexes not read (delta None for that block).
    TIES trims default to the exact trims of the whole deltas.
    """
    n = len(weights)
    dens = list(densities) if densities is not None else [1.0] * n
    if trims is None:
        trims = [exact_trim(d, p) if d is not None and op == "ties" and p < 1 else None
                 for d, p in zip(deltas, dens, strict=True)]
    rows = base.shape[0] if base.ndim else 1
    row_numel = base.numel() // max(rows, 1)
    cuts = list(blocks) if blocks is not None else [(0, rows)]
    out = []
    for b, (r0, r1) in enumerate(cuts):
        experts = []
        for i, d in enumerate(deltas):
            skip = d is None or b in (omit or {}).get(i, set())
            experts.append(ExpertBlock(
                index=i, model=f"e{i}", delta=None if skip or d is None else d[r0:r1].clone(),
                weight=weights[i], density=dens[i], trim=trims[i],
                key=expert_key(seed, f"e{i}", tensor)))
        ctx = BlockContext(tensor=tensor, block_index=b, flat_offset=r0 * row_numel,
                           params=dict(params or {}), all_weights=tuple(weights))
        out.append(REGISTRY[op].kernel(base[r0:r1].clone(), experts, ctx))
    return torch.cat(out) if base.ndim else out[0]


def row_blocks(rows: int, sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Cut `rows` into consecutive blocks of the given sizes (the last one takes the rest)."""
    cuts, r = [], 0
    for s in sizes:
        if r >= rows:
            break
        cuts.append((r, min(rows, r + s)))
        r += s
    if r < rows:
        cuts.append((r, rows))
    return cuts
