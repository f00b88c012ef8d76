"""Block kernels with mergekit 0.1.5's arithmetic: inputs cast to the compute dtype, then its torch
operations in its dtypes and order. All are elementwise or sums over the experts, so a block
gives the whole tensor's bytes, except the per-tensor choices (the TIES trim from the catalog's
threshold, DARE's keyed per-block draw and L1 rescale; `whole_magnitude` is mergekit's trim on a
whole tensor, executor.torch_path). An unread expert is an expert equal to the base there (a
zero delta)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock, ReadExpert

# sparsify(a read expert, its delta in the compute dtype, ctx) -> the sparsified delta (the
# expert's float32 delta is e.delta)
Sparsify = Callable[["ReadExpert", "torch.Tensor", "BlockContext"], "torch.Tensor"]


def compute_dtype(ctx: BlockContext) -> torch.dtype:
    """The torch dtype the arithmetic runs in (the request's `compute_dtype`)."""
    import torch
    name = str(ctx.params.get("compute_dtype", "float32"))
    return getattr(torch, ctx.input_dtype if name == "files" else name)


def uses_mergekit_arith(ctx: BlockContext) -> bool:
    """mergekit semantics (a mergekit config) or a compute dtype other than float32."""
    return (ctx.params.get("semantics") == "mergekit"
            or ctx.params.get("compute_dtype", "float32") != "float32")


def expert_value(base32: torch.Tensor, e: ExpertBlock, dt: torch.dtype) -> torch.Tensor:
    """The expert's block cast to the compute dtype (unread: equal to the base)."""
    if e.value is not None:
        return e.value.to(dt)
    if e.delta is None:
        return base32.to(dt)
    return (base32 + e.delta).to(dt)  # LoRA and delta experts: no stored expert values


def gta(base32: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext, *,
        sparsify: Sparsify | None, consensus: bool, normalize_default: bool) -> torch.Tensor:
    """mergekit's generalized task arithmetic (task_arithmetic, ties, dare_*) on one block."""
    import torch

    from mergepipe.core.operators.base import as_read

    dt = compute_dtype(ctx)
    base = base32.to(dt)
    deltas = base.new_zeros((len(experts), *base.shape))  # unread: a zero delta, its weight kept
    for i, r in enumerate(map(as_read, experts)):
        if r is not None:
            delta = expert_value(base32, r, dt) - base
            deltas[i] = delta if sparsify is None else sparsify(r, delta, ctx)
    weights = torch.tensor([e.weight for e in experts], dtype=dt)
    while deltas.dim() > weights.dim():
        weights.unsqueeze_(-1)
    deltas.mul_(weights)
    if consensus:
        sign = deltas.sign()
        majority = (deltas.sum(dim=0) >= 0).to(dt) * 2 - 1
        mask = sign == majority
        mixed = (deltas * mask).sum(dim=0)
        divisor = (weights * mask).sum(dim=0)
        divisor[divisor == 0] = 1
    else:
        mixed = deltas.sum(dim=0)
        divisor = weights.sum(dim=0)
        divisor[divisor.abs() < 1e-8] = 1
    if ctx.normalize(normalize_default):
        mixed /= divisor
    if ctx.lam != 1:
        mixed *= ctx.lam
    return (base + mixed).to(dt).float()


def linear(base32: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext
           ) -> torch.Tensor:
    """mergekit's linear: sum_i w_i X_i / sum_i w_i over the inputs in config order (the base
    among them when it is one), accumulated in float32 from the compute dtype."""
    import torch

    dt = compute_dtype(ctx)
    inputs = [expert_value(base32, e, dt) for e in experts]
    weights = [e.weight for e in experts]
    if ctx.params.get("base_weight") is not None:
        pos = int(ctx.params.get("base_position", len(experts)))
        inputs.insert(pos, base32.to(dt))
        weights.insert(pos, float(ctx.params["base_weight"]))
    acc = torch.float64 if dt == torch.float64 else torch.float32
    w = torch.tensor([weights], dtype=acc)  # one group: [1, inputs]
    shape = (1,) + (1,) * base32.dim()
    result = torch.zeros((1, *base32.shape), dtype=acc)
    for x, c in zip(inputs, w.unbind(1), strict=True):
        result.addcmul_(x.unsqueeze(0), c.reshape(shape))
    if ctx.normalize(True):
        result.div_(w.sum(dim=1).reshape(shape))
    return result[0].to(dt).float()


def magnitude(e: ReadExpert, delta: torch.Tensor, ctx: BlockContext) -> torch.Tensor:
    """TIES trim: mergekit's own on a whole tensor (whole_tensor_for: `rescale` or off the
    grid), else the catalog threshold's."""
    return (whole_magnitude if ctx.whole_tensor else magnitude_mask)(e, delta, ctx)


def magnitude_mask(e: ReadExpert, delta: torch.Tensor, ctx: BlockContext) -> torch.Tensor:
    """TIES trim: the catalog threshold's mask (float32 deltas) applied in the compute dtype."""
    from mergepipe.core.operators.sparsify import scratch, trimmed_into

    kept = trimmed_into(e.delta, e.trim, e.key, ctx.flat_offset, scratch.like("mk-trim", e.delta))
    return delta * (kept != 0)


def whole_magnitude(e: ReadExpert, delta: torch.Tensor, ctx: BlockContext) -> torch.Tensor:
    """mergekit 0.1.5's `magnitude` on a whole expert tensor in the compute dtype: keep exactly
    k = max(1, int(density * n)) entries, the largest |delta| (ranked as float32, as mergekit
    ranks them on the CPU); of the entries tied at the k-th, the ones with the smallest keyed
    draws (mergekit's argsort order is arbitrary there). `rescale: l1` then multiplies by the
    L1 norm before over after the trim (norms below 1e-7: unscaled), each a sum in the compute
    dtype, as mergekit does; keeping exactly k entries keeps that sum mergekit's."""
    import numpy as np
    import torch

    from mergepipe.core.operators.keyed_hash import bits_at

    n = delta.numel()
    if e.density >= 1:
        return delta
    if n == 0:
        return torch.zeros_like(delta)
    k = max(1, int(e.density * n))
    w = delta.reshape(-1).float().abs()
    tau = w.kthvalue(n - k + 1).values
    keep = w > tau
    tied = torch.nonzero(w == tau).reshape(-1)
    need = k - int(keep.sum())
    if need >= tied.numel():
        keep[tied] = True
    elif need > 0:
        order = np.argsort(bits_at(e.key, tied.numpy()), kind="stable")[:need]
        keep[tied[torch.from_numpy(order)]] = True
    masked = delta * keep.reshape(delta.shape).to(delta.dtype)
    return l1_rescaled(delta, masked) if ctx.params.get("rescale", "none") == "l1" else masked


def l1_rescaled(x: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """mergekit's rescaled_masked_tensor: `masked` scaled to x's L1 norm (norms below L1_EPS:
    unscaled)."""
    from mergepipe.core.operators.sparsify import L1_EPS

    before, after = x.abs().sum(), masked.abs().sum()
    return masked if before < L1_EPS or after < L1_EPS else masked * (before / after)


def random_mask(e: ReadExpert, delta: torch.Tensor, ctx: BlockContext) -> torch.Tensor:
    """DARE: keyed Bernoulli(density) mask, mergekit's work dtype and L1 rescale (per block)."""
    import torch

    from mergepipe.core.operators.keyed_hash import below_into
    from mergepipe.core.operators.sparsify import flat

    if e.density >= 1:
        return delta
    work = delta.dtype if delta.dtype == torch.bfloat16 else torch.float32
    keep = torch.empty(delta.shape, dtype=torch.float32)
    below_into(e.key, ctx.flat_offset, flat(keep), e.density)
    x = delta.to(work)
    masked = x * keep.to(work)
    rescale = str(ctx.params.get("rescale", "density"))
    if rescale == "density":
        masked = masked / e.density
    elif rescale == "l1":
        masked = l1_rescaled(x, masked)
    return masked.to(delta.dtype)
